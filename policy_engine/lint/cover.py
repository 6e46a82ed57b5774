"""Sound capability containment for shadowing rules, built on the meet's atoms and pattern algebra.

``covers(a, b)`` is ``True`` only when every resource ``b`` admits, ``a`` admits (as a permit,
after the meet resolves defaults: see :mod:`policy_engine.patterns.meet`). When in doubt it says
``False``: a lint must not claim a rule is unreachable when it is not.
"""

from __future__ import annotations

from functools import lru_cache

from policy_engine.model import Capability, FsCapability, ProcCapability
from policy_engine.patterns.host_meet import host_contains
from policy_engine.patterns.meet import (
    DEFAULT_PORTS,
    Atom,
    BrowserAtom,
    FsAtom,
    GpuAtom,
    NetAtom,
    ProcAtom,
    TmpAtom,
    decompose,
)
from policy_engine.patterns.path_meet import contains
from policy_engine.patterns.paths import literal_prefix


def covers(a: Capability, b: Capability, home: str) -> bool:
    """Every resource of ``b`` is admitted by ``a`` (each atom of ``b`` under one atom of ``a``)."""
    if not fs_prefilter(a, b):
        return False
    big = decompose(a, home)
    return all(any(atom_covers(x, y) for x in big) for y in decompose(b, home))


def atom_covers(a: Atom, b: Atom) -> bool:
    if a == b:
        return True
    if isinstance(a, FsAtom) and isinstance(b, FsAtom):
        # a's conjunction admits b's when each of a's globs contains one of b's
        return a.kind == b.kind and all(any(contains(g, s) for s in b.globs) for g in a.globs)
    if isinstance(a, NetAtom) and isinstance(b, NetAtom):
        return (_hosts(a.hosts, b.hosts) and set(b.schemes) <= set(a.schemes)
                and set(b.methods) <= set(a.methods) and _mime(a.mime, b.mime)
                and _ports(a.ports, b.ports, b.schemes))
    if isinstance(a, BrowserAtom) and isinstance(b, BrowserAtom):
        return (_hosts(a.hosts, b.hosts) and set(b.scopes) <= set(a.scopes)
                and set(b.schemes) <= set(a.schemes) and _ports(a.ports, b.ports, b.schemes))
    if isinstance(a, ProcAtom) and isinstance(b, ProcAtom):
        # a conjunction of templates is narrower the more templates it has
        return a.tool == b.tool and set(a.templates) <= set(b.templates)
    if isinstance(a, TmpAtom) and isinstance(b, TmpAtom):
        return a.max_bytes is None or (b.max_bytes is not None and b.max_bytes <= a.max_bytes)
    if isinstance(a, GpuAtom) and isinstance(b, GpuAtom):
        return a.gpu_class in ("any", b.gpu_class)
    return False


def _hosts(a: tuple[str, ...], b: tuple[str, ...]) -> bool:
    return all(any(host_contains(h, k) for k in b) for h in a)


def _mime(a: tuple[str, ...], b: tuple[str, ...]) -> bool:
    if not a:
        return True
    if not b:
        return "*/*" in a
    return all(any(_mime_one(x, y) for x in a) for y in b)


def _mime_one(a: str, b: str) -> bool:
    if a in ("*/*", b):
        return True
    return a.endswith("/*") and not b.endswith("/*") and b.split("/")[0] == a.split("/")[0]


def _ports(a: tuple[int, ...], b: tuple[int, ...], schemes: tuple[str, ...]) -> bool:
    """``()`` means the scheme's default port (see the meet)."""
    if not a:
        return not b or all(DEFAULT_PORTS.get(s) == p for s in schemes for p in b)
    if not b:
        return all(DEFAULT_PORTS.get(s) in a for s in schemes)
    return set(b) <= set(a)


@lru_cache(maxsize=1 << 16)
def segments(glob: str) -> tuple[str, ...]:
    """The literal leading segments of ``glob`` (`/a/b/*.py` → `("a", "b")`), cached: the
    shadowing checks ask for every rule they compare."""
    return tuple(s for s in literal_prefix(glob).split("/") if s)


def may_contain(a: str, b: str) -> bool:
    """Cheap necessary condition for :func:`contains` on expanded globs: ``a``'s literal prefix
    is a segment prefix of ``b``'s (a wildcard segment of ``b`` always admits names ``a``'s
    literal segment does not)."""
    pa, pb = segments(a), segments(b)
    return pb[:len(pa)] == pa


def may_meet(a: str, b: str) -> bool:
    """Cheap necessary condition for two expanded globs to intersect: literal prefixes agree."""
    pa, pb = segments(a), segments(b)
    n = min(len(pa), len(pb))
    return pa[:n] == pb[:n]


def fs_prefilter(a: Capability, b: Capability) -> bool:
    """Whether :func:`covers` can possibly hold, decided without the pattern algebra."""
    if isinstance(a, FsCapability) and isinstance(b, FsCapability):
        return all(any(may_contain(x, y) for x in a.paths) for y in b.paths)
    if isinstance(a, ProcCapability) and isinstance(b, ProcCapability):
        return a.tool == b.tool
    return True
