"""The meet of capabilities (DESIGN.md §2): per-kind intersection kept exact by conjunctions.

A capability is a union of *atoms* (one per path glob or host, with its set-valued fields); an
atom may itself be a conjunction of patterns when no single pattern is the intersection. The
meet of two capabilities is the union of the pairwise atom meets, and every atom meet is exact:
it admits a resource iff both sides do. The result is a tuple of conjunctions, each one becoming
a :class:`~policy_engine.model.ProfileCapability` (``all_of``); ``()`` is the provably-empty meet.

Empty tuples on set-valued fields mean "the default", and the meet resolves them first:

* ``schemes`` ``()`` = ``{"https"}``; ``methods`` ``()`` = ``{"GET", "HEAD"}``; browser
  ``scopes`` ``()`` = ``{open, extract}``. After the meet these are always explicit.
* ``mime`` ``()`` = unconstrained, so ``() ∧ M = M``; two explicit sets meet pairwise (``*/*``
  and ``type/*`` are narrowed by a concrete type).
* ``ports`` ``()`` = "the scheme's default port" (http/ws 80, https/wss 443). ``() ∧ ()`` stays
  ``()``; explicit ``P ∧ Q = P ∩ Q``; ``() ∧ P`` keeps only the schemes whose default port is
  in ``P``, and becomes that one explicit port when they share it (``https``: ``() ∧ {443,
  8443} = {443}``); with ``http`` and ``https`` both left it stays ``()``, since ``{80, 443}``
  would also admit ``http:443``.

Any set that meets to nothing makes the whole atom empty.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Literal

from policy_engine.model import (
    ArgAlternative,
    ArgSlot,
    BrowserCapability,
    BrowserScope,
    Capability,
    FsCapability,
    GpuCapability,
    NetHttpCapability,
    ProcCapability,
    TmpCapability,
)
from policy_engine.patterns.host_meet import simplify_hosts
from policy_engine.patterns.path_meet import contains, simplify_globs
from policy_engine.patterns.paths import expand_home, resolve_variables

DEFAULT_SCHEMES: tuple[str, ...] = ("https",)
DEFAULT_METHODS: tuple[str, ...] = ("GET", "HEAD")
DEFAULT_SCOPES: tuple[BrowserScope, ...] = (BrowserScope.EXTRACT, BrowserScope.OPEN)
DEFAULT_PORTS: dict[str, int] = {"http": 80, "https": 443, "ws": 80, "wss": 443}

FsKind = Literal["fs.read", "fs.write", "fs.list"]


@dataclass(frozen=True, slots=True)
class FsAtom:
    kind: FsKind
    globs: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class NetAtom:
    hosts: tuple[str, ...]
    ports: tuple[int, ...]
    schemes: tuple[str, ...]
    methods: tuple[str, ...]
    mime: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class BrowserAtom:
    hosts: tuple[str, ...]
    scopes: tuple[BrowserScope, ...]
    schemes: tuple[str, ...]
    ports: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class ProcAtom:
    tool: str
    templates: tuple[tuple[ArgSlot, ...], ...]
    """Conjunction of argument templates; ``()`` = no template constrains the arguments."""
    envs: tuple[tuple[ArgAlternative, ...], ...] = ()
    """Conjunction of environment allow-lists; ``()`` = no source constrains the environment."""


@dataclass(frozen=True, slots=True)
class TmpAtom:
    max_bytes: int | None


@dataclass(frozen=True, slots=True)
class GpuAtom:
    gpu_class: str


Atom = FsAtom | NetAtom | BrowserAtom | ProcAtom | TmpAtom | GpuAtom


def _sorted_set(values: Iterable[str]) -> tuple[str, ...]:
    return tuple(sorted(set(values)))


def decompose(cap: Capability, home: str = "/root",
              variables: Mapping[str, str | None] | None = None) -> tuple[Atom, ...]:
    """Split a capability into the atoms whose union it is, with defaults resolved.

    A path starting with a path variable (``$SESSION``, a permit's only) becomes its value in
    ``variables``; without one it contributes no atom: it matches nothing (fail closed)."""
    if isinstance(cap, FsCapability):
        values = variables or {}
        resolved = (resolve_variables(p, values) for p in cap.paths)
        return tuple(FsAtom(cap.kind, simplify_globs([expand_home(p, home)]))
                     for p in resolved if p is not None)
    if isinstance(cap, NetHttpCapability):
        schemes = _sorted_set(s.lower() for s in cap.schemes) or DEFAULT_SCHEMES
        methods = _sorted_set(m.upper() for m in cap.methods) or DEFAULT_METHODS
        ports, mime = tuple(sorted(set(cap.ports))), _sorted_set(m.lower() for m in cap.mime)
        return tuple(
            NetAtom(simplify_hosts([h]), ports, schemes, methods, mime) for h in cap.hosts
        )
    if isinstance(cap, BrowserCapability):
        scopes = tuple(sorted(set(cap.scopes))) or DEFAULT_SCOPES
        schemes = _sorted_set(s.lower() for s in cap.schemes) or DEFAULT_SCHEMES
        ports = tuple(sorted(set(cap.ports)))
        return tuple(BrowserAtom(simplify_hosts([h]), scopes, schemes, ports) for h in cap.hosts)
    if isinstance(cap, ProcCapability):
        return (ProcAtom(cap.tool, () if cap.args is None else (cap.args,),
                         () if cap.env is None else (cap.env,)),)
    if isinstance(cap, TmpCapability):
        return (TmpAtom(cap.max_bytes),)
    return (GpuAtom(cap.gpu_class),)


# --- set-valued fields ------------------------------------------------------------------------


def _meet_mime_one(x: str, y: str) -> str | None:
    if x == y or y == "*/*":
        return x
    if x == "*/*":
        return y
    if x.endswith("/*") and y.startswith(x[:-1]):
        return y
    if y.endswith("/*") and x.startswith(y[:-1]):
        return x
    return None


def meet_mime(a: tuple[str, ...], b: tuple[str, ...]) -> tuple[str, ...] | None:
    """``()`` is unconstrained; ``None`` when two explicit sets share no type."""
    if not a or not b:
        return a or b
    out = _sorted_set(m for x in a for y in b if (m := _meet_mime_one(x, y)) is not None)
    return out or None


def meet_ports(
    a: tuple[int, ...], b: tuple[int, ...], schemes: tuple[str, ...]
) -> tuple[tuple[int, ...], tuple[str, ...]] | None:
    """Meet two port sets under ``schemes``; returns the ports and the schemes still usable."""
    if not a and not b:
        return (), schemes
    if a and b:
        ports = tuple(sorted(set(a) & set(b)))
        return (ports, schemes) if ports else None
    explicit = set(a or b)
    kept = tuple(s for s in schemes if DEFAULT_PORTS.get(s) in explicit)
    if not kept:
        return None
    defaults = {DEFAULT_PORTS[s] for s in kept}
    # one shared default port is exactly the explicit port; several would admit cross pairs
    # (http:443), so those stay "default"
    return ((defaults.pop(),), kept) if len(defaults) == 1 else ((), kept)


def _inter(a: tuple[str, ...], b: tuple[str, ...]) -> tuple[str, ...]:
    return tuple(sorted(set(a) & set(b)))


# --- atoms ------------------------------------------------------------------------------------


def meet_atoms(a: Atom, b: Atom) -> Atom | None:
    """Exact meet of two atoms of the same kind; ``None`` when provably empty."""
    if isinstance(a, FsAtom) and isinstance(b, FsAtom):
        globs = simplify_globs(a.globs + b.globs) if a.kind == b.kind else ()
        return FsAtom(a.kind, globs) if globs else None
    if isinstance(a, NetAtom) and isinstance(b, NetAtom):
        hosts = simplify_hosts(a.hosts + b.hosts)
        schemes, methods = _inter(a.schemes, b.schemes), _inter(a.methods, b.methods)
        mime = meet_mime(a.mime, b.mime)
        pm = meet_ports(a.ports, b.ports, schemes)
        if not hosts or not methods or mime is None or pm is None or not pm[1]:
            return None
        return NetAtom(hosts, pm[0], pm[1], methods, mime)
    if isinstance(a, BrowserAtom) and isinstance(b, BrowserAtom):
        hosts = simplify_hosts(a.hosts + b.hosts)
        scopes = tuple(sorted(set(a.scopes) & set(b.scopes)))
        pm = meet_ports(a.ports, b.ports, _inter(a.schemes, b.schemes))
        if not hosts or not scopes or pm is None or not pm[1]:
            return None
        return BrowserAtom(hosts, scopes, pm[1], pm[0])
    if isinstance(a, ProcAtom) and isinstance(b, ProcAtom):
        if a.tool != b.tool:
            return None
        # equal templates fold; different ones stay a conjunction (argv must fit each)
        return ProcAtom(a.tool, tuple(sorted(set(a.templates + b.templates), key=repr)),
                        tuple(sorted(set(a.envs + b.envs), key=repr)))
    if isinstance(a, TmpAtom) and isinstance(b, TmpAtom):
        sizes = [s for s in (a.max_bytes, b.max_bytes) if s is not None]
        return TmpAtom(min(sizes) if sizes else None)
    if isinstance(a, GpuAtom) and isinstance(b, GpuAtom):
        if a.gpu_class == b.gpu_class or b.gpu_class == "any":
            return a
        return b if a.gpu_class == "any" else None
    return None


def _subsumes(big: Atom, small: Atom) -> bool:
    """Sound: every resource ``small`` admits, ``big`` admits (used only to prune unions)."""
    if big == small:
        return True
    if isinstance(big, FsAtom) and isinstance(small, FsAtom):
        return big.kind == small.kind and all(
            any(contains(g, s) for s in small.globs) for g in big.globs
        )
    return False


def meet_atom_sets(a: Sequence[Atom], b: Sequence[Atom]) -> tuple[Atom, ...]:
    """The meet of two unions of atoms: the union of the pairwise meets, pruned."""
    met = [m for x in a for y in b if (m := meet_atoms(x, y)) is not None]
    return prune(met)


def prune(atoms: Iterable[Atom]) -> tuple[Atom, ...]:
    """Drop duplicate atoms and atoms another one provably covers (the union is unchanged)."""
    unique = list(dict.fromkeys(atoms))
    kept = [
        x for i, x in enumerate(unique)
        if not any(j != i and _subsumes(y, x) and not (_subsumes(x, y) and j > i)
                   for j, y in enumerate(unique))
    ]
    return tuple(kept)


# --- back to capabilities ---------------------------------------------------------------------


def atom_capabilities(atom: Atom) -> tuple[Capability, ...]:
    """The conjunction (``all_of``) of capabilities that admits exactly what ``atom`` admits."""
    if isinstance(atom, FsAtom):
        return tuple(FsCapability(kind=atom.kind, paths=(g,)) for g in atom.globs)
    if isinstance(atom, NetAtom):
        return tuple(
            NetHttpCapability(hosts=(h,), ports=atom.ports, schemes=atom.schemes,
                              methods=atom.methods, mime=atom.mime)
            for h in atom.hosts
        )
    if isinstance(atom, BrowserAtom):
        return tuple(
            BrowserCapability(hosts=(h,), scopes=atom.scopes, schemes=atom.schemes,
                              ports=atom.ports)
            for h in atom.hosts
        )
    if isinstance(atom, ProcAtom):
        if not atom.templates and not atom.envs:
            return (ProcCapability(tool=atom.tool),)
        # one member per template and per env allow-list: the call must fit every one
        return (tuple(ProcCapability(tool=atom.tool, args=t) for t in atom.templates)
                + tuple(ProcCapability(tool=atom.tool, env=e) for e in atom.envs))
    if isinstance(atom, TmpAtom):
        return (TmpCapability(max_bytes=atom.max_bytes),)
    return (GpuCapability(gpu_class=atom.gpu_class),)


def group(atoms: Sequence[Atom]) -> tuple[tuple[Capability, ...], ...]:
    """Turn a union of atoms into conjunctions, merging single-pattern atoms that share fields.

    ``FsAtom("fs.read", ("/a/**",))`` and ``FsAtom("fs.read", ("/b/**",))`` become one
    capability with two paths (a union), which is what a reader of the profile expects.
    """
    merged: dict[Atom, list[str]] = {}
    out: list[tuple[Capability, ...]] = []
    for atom in atoms:
        if isinstance(atom, FsAtom) and len(atom.globs) == 1:
            merged.setdefault(replace(atom, globs=()), []).append(atom.globs[0])
        elif isinstance(atom, NetAtom | BrowserAtom) and len(atom.hosts) == 1:
            merged.setdefault(replace(atom, hosts=()), []).append(atom.hosts[0])
        else:
            out.append(atom_capabilities(atom))
    for template, patterns in merged.items():
        out.append((_union_capability(template, tuple(patterns)),))
    return tuple(sorted(out, key=repr))


def _union_capability(template: Atom, patterns: tuple[str, ...]) -> Capability:
    """One capability admitting the union of ``patterns`` with ``template``'s other fields."""
    if isinstance(template, FsAtom):
        return FsCapability(kind=template.kind, paths=patterns)
    if isinstance(template, NetAtom):
        return NetHttpCapability(hosts=patterns, ports=template.ports, schemes=template.schemes,
                                 methods=template.methods, mime=template.mime)
    assert isinstance(template, BrowserAtom)  # INVARIANT: only these three are merged
    return BrowserCapability(hosts=patterns, scopes=template.scopes, schemes=template.schemes,
                             ports=template.ports)


def meet(
    a: Capability, b: Capability, *, home: str = "/root"
) -> tuple[tuple[Capability, ...], ...]:
    """The meet of two capabilities as a union of conjunctions; ``()`` when provably empty."""
    return group(meet_atom_sets(decompose(a, home), decompose(b, home)))


def meet_many(caps: Sequence[Sequence[Capability]], *, home: str = "/root") -> tuple[Atom, ...]:
    """Meet several sources, each a union of capabilities of one kind, into a union of atoms."""
    if not caps:
        return ()
    acc: tuple[Atom, ...] = prune(a for c in caps[0] for a in decompose(c, home))
    for source in caps[1:]:
        acc = meet_atom_sets(acc, [a for c in source for a in decompose(c, home)])
        if not acc:
            break
    return acc
