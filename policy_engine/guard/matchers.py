"""Resource matchers: one capability compiled to a predicate on a resolved resource.

Resources per kind: fs — the resolved path (``str``); net.http — ``(ParsedUrl, METHOD)``;
browser.use — ``(ParsedUrl | None, scopes needed)``; proc.exec — ``(tool, args)``; tmp.use and
sys.gpu — the size or class (the kind alone matches; sizes are limits).

A permit and a forbid read empty fields differently: in a permit, empty ports mean the scheme's
default port, empty schemes ``https`` and empty methods ``GET``/``HEAD``; in a forbid, an empty
field constrains nothing, so the forbid covers more (deny-overrides must never shrink). A
pattern that does not compile admits nothing in a permit and everything in a forbid.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any, Protocol

from policy_engine.guard.argv import describe_mismatch
from policy_engine.guard.globset import shared_globset
from policy_engine.guard.ipaddr import IPAddress
from policy_engine.guard.urls import DEFAULT_PORTS, ParsedUrl
from policy_engine.model import (
    BrowserCapability,
    Capability,
    FsCapability,
    NetHttpCapability,
    ProcCapability,
    TmpCapability,
)
from policy_engine.patterns import HostPattern, compile_slots, first_mismatch
from policy_engine.patterns.argv import CompiledSlot
from policy_engine.patterns.paths import expand_home, glob_body, validate_glob

_ANY = re.compile(r"^.*$", re.DOTALL)
_NOTHING = re.compile(r"(?!)")


class Matcher(Protocol):
    def admits(self, res: Any) -> bool: ...

    def why_not(self, res: Any) -> str:
        """Which dimension refuses ``res`` and the value it refuses (traces only; called when
        ``admits`` is false)."""
        ...


def _listed(values: Iterable[object]) -> str:
    shown = [str(v) for v in values]
    return "[" + ", ".join(shown[:8]) + (", ..." if len(shown) > 8 else "") + "]"


def path_regex(patterns: Iterable[str], home: str, *, forbid: bool) -> re.Pattern[str]:
    """One anchored alternation of all ``patterns`` (``~`` expanded with ``home``).

    The reference reading of a glob list; the guard matches with :class:`GlobSet`, which
    ``tests/unit/test_guard_globset.py`` checks against this.
    """
    bodies: list[str] = []
    for pat in patterns:
        if validate_glob(pat) is not None:
            if forbid:
                return _ANY
            continue
        bodies.append(glob_body(expand_home(pat, home)))
    if not bodies:
        return _NOTHING
    return re.compile("^(?:" + "|".join(bodies) + r")\Z", re.DOTALL)


class FsMatcher:
    """Path globs; ``admits_path`` is the bound test (a normalized path → bool)."""

    __slots__ = ("globs", "admits_path", "paths")

    def __init__(self, cap: FsCapability, home: str, *, forbid: bool) -> None:
        self.paths = cap.paths
        self.globs = shared_globset(tuple(cap.paths), home, forbid=forbid)
        self.admits_path = self.globs.match

    def admits(self, res: Any) -> bool:
        return self.admits_path(res)

    def why_not(self, res: Any) -> str:
        return f"path `{res}` is not under paths {_listed(self.paths)}"


def _hosts(patterns: Iterable[str], *, forbid: bool) -> tuple[HostPattern, ...]:
    out: list[HostPattern] = []
    for pat in patterns:
        try:
            out.append(HostPattern.of(pat))
        except ValueError:
            if forbid:
                return (HostPattern.of("*"),)
    return tuple(out)


class HostSet:
    """Host patterns matched together: exact names by set lookup, ``*.suffix`` by one
    ``str.endswith``, IP literals and CIDR blocks only for an IP host. Answers exactly as
    ``any(p.matches(host, ip) for p in patterns)`` (``tests/unit/test_guard_decide.py``)."""

    __slots__ = ("everything", "exact", "suffixes", "networks")

    def __init__(self, patterns: Iterable[HostPattern]) -> None:
        pats = tuple(patterns)
        self.everything = any(p.kind == "any" for p in pats)
        self.exact = frozenset(p.value for p in pats if p.kind == "exact")
        self.suffixes = tuple(sorted({"." + p.value for p in pats if p.kind == "suffix"}))
        self.networks = tuple(p.network for p in pats
                              if p.kind in ("ip", "cidr") and p.network is not None)

    def matches(self, host: str, ip: IPAddress | None) -> bool:
        if self.everything or host in self.exact:
            return True
        if ip is None:
            return host.endswith(self.suffixes)
        return any(ip.version == n.version and ip in n for n in self.networks)


class UrlMatcher:
    __slots__ = ("hosts", "host_set", "schemes", "ports")

    def __init__(self, hosts: Iterable[str], schemes: Iterable[str], ports: Iterable[int], *,
                 forbid: bool) -> None:
        self.hosts = _hosts(hosts, forbid=forbid)
        self.host_set = HostSet(self.hosts)
        s = frozenset(x.lower() for x in schemes)
        self.schemes: frozenset[str] | None = s or (None if forbid else frozenset({"https"}))
        p = frozenset(ports)
        # None = any port (forbid); empty = only the scheme's default port (permit)
        self.ports: frozenset[int] | None = p or (None if forbid else frozenset())

    def url_why_not(self, url: ParsedUrl) -> str:
        if self.schemes is not None and url.scheme not in self.schemes:
            return f"scheme `{url.scheme}` is not in schemes {_listed(sorted(self.schemes))}"
        if self.ports is not None:
            if self.ports and url.port not in self.ports:
                return f"port {url.port} is not in ports {_listed(sorted(self.ports))}"
            if not self.ports and url.port != DEFAULT_PORTS.get(url.scheme):
                return (f"port {url.port} is not the default port of `{url.scheme}` (the rule "
                        "names no ports)")
        return f"host `{url.host}` is not in hosts {_listed(p.pattern for p in self.hosts)}"

    def admits_url(self, url: ParsedUrl) -> bool:
        if self.schemes is not None and url.scheme not in self.schemes:
            return False
        if self.ports is not None:
            if self.ports:
                if url.port not in self.ports:
                    return False
            elif url.port != DEFAULT_PORTS.get(url.scheme):
                return False
        hs = self.host_set  # HostSet.matches, inlined: this runs on every URL decision
        host = url.host
        if hs.everything or host in hs.exact:
            return True
        ip = url.ip
        if ip is None:
            return host.endswith(hs.suffixes)
        return any(ip.version == n.version and ip in n for n in hs.networks)


class NetMatcher(UrlMatcher):
    __slots__ = ("methods", "mime")

    def __init__(self, cap: NetHttpCapability, *, forbid: bool) -> None:
        super().__init__(cap.hosts, cap.schemes, cap.ports, forbid=forbid)
        m = frozenset(x.upper() for x in cap.methods)
        self.methods: frozenset[str] | None = m or (None if forbid else frozenset({"GET", "HEAD"}))
        self.mime = cap.mime

    def admits(self, res: Any) -> bool:
        url, method = res
        if self.methods is not None and method not in self.methods:
            return False
        return self.admits_url(url)

    def why_not(self, res: Any) -> str:
        url, method = res
        if self.methods is not None and method not in self.methods:
            return f"method `{method}` is not in methods {_listed(sorted(self.methods))}"
        return self.url_why_not(url)


class BrowserMatcher(UrlMatcher):
    __slots__ = ("scopes", "forbid")

    def __init__(self, cap: BrowserCapability, *, forbid: bool) -> None:
        super().__init__(cap.hosts, cap.schemes, cap.ports, forbid=forbid)
        self.scopes = frozenset(str(s) for s in cap.scopes)
        self.forbid = forbid

    def admits(self, res: Any) -> bool:
        url, needed = res
        if not self.forbid and not needed <= self.scopes:
            return False
        if url is None:  # a screenshot of the page already open: its navigation was checked
            return True
        return self.admits_url(url)

    def why_not(self, res: Any) -> str:
        url, needed = res
        if not self.forbid and not needed <= self.scopes:
            missing = sorted(needed - self.scopes)
            return f"scope `{missing[0]}` is not in scopes {_listed(sorted(self.scopes))}"
        return self.url_why_not(url) if url is not None else "not admitted"


class ProcMatcher:
    __slots__ = ("tool", "slots", "_fixed", "_tail")

    def __init__(self, cap: ProcCapability) -> None:
        self.tool = cap.tool
        self.slots: tuple[CompiledSlot, ...] | None = None
        # a template whose only repeating slot (if any) is the last one reads argv left to
        # right without backtracking: fixed slots one per argument, then the tail for the rest
        self._fixed: tuple[CompiledSlot, ...] | None = None
        self._tail: CompiledSlot | None = None
        if cap.args is not None:
            self.slots = compile_slots(cap.args)
            if not any(s.repeat for s in self.slots[:-1]):
                last = self.slots[-1] if self.slots else None
                self._tail = last if last is not None and last.repeat else None
                self._fixed = self.slots[:-1] if self._tail is not None else self.slots

    def admits(self, res: Any) -> bool:
        tool, args = res
        if tool != self.tool:
            return False
        if self.slots is None:
            return True
        fixed = self._fixed
        if fixed is None:
            return first_mismatch(self.slots, args) is None
        n = len(fixed)
        tail = self._tail
        if len(args) < n or (tail is None and len(args) != n):
            return False
        # args may be longer (the tail reads the rest): zip stops at the fixed slots. A literal
        # is looked up here, ``CompiledSlot.admits``'s own first test: most arguments are one
        # (`status`, `--oneline`), and its frame was most of a proc.exec permit scan
        for slot, arg in zip(fixed, args, strict=False):  # noqa: SIM110 — cheaper than all()
            if arg not in slot.literals and not slot.admits(arg):
                return False
        if tail is not None:
            lits = tail.literals
            for arg in args[n:]:  # noqa: SIM110
                if arg not in lits and not tail.admits(arg):
                    return False
        return True

    def why_not(self, res: Any) -> str:
        tool, args = res
        if tool != self.tool:
            return f"tool `{tool}` is not `{self.tool}`"
        why = describe_mismatch(self.slots, args) if self.slots is not None else None
        return why or "not admitted"


class KindMatcher:
    """tmp.use and sys.gpu: the kind alone matches; :attr:`max_bytes` is checked as a limit."""

    __slots__ = ("max_bytes",)

    def __init__(self, cap: Capability) -> None:
        self.max_bytes = cap.max_bytes if isinstance(cap, TmpCapability) else None

    def admits(self, res: Any) -> bool:
        return True

    def why_not(self, res: Any) -> str:
        return "not admitted"


class NeverMatcher:
    """A capability of another domain listed under this kind: it admits nothing."""

    __slots__ = ()

    def admits(self, res: Any) -> bool:
        return False

    def why_not(self, res: Any) -> str:
        return "a capability of another kind"


def compile_matcher(cap: Capability, kind: str, home: str, *, forbid: bool = False) -> Matcher:
    """Compile one capability for use under ``kind`` (a capability-kind string)."""
    if isinstance(cap, FsCapability) and kind.startswith("fs."):
        return FsMatcher(cap, home, forbid=forbid)
    if isinstance(cap, NetHttpCapability) and kind == "net.http":
        return NetMatcher(cap, forbid=forbid)
    if isinstance(cap, BrowserCapability) and kind == "browser.use":
        return BrowserMatcher(cap, forbid=forbid)
    if isinstance(cap, ProcCapability) and kind == "proc.exec":
        return ProcMatcher(cap)
    if cap.kind == kind and kind in ("tmp.use", "sys.gpu"):
        return KindMatcher(cap)
    return NeverMatcher()


def host_patterns(matchers: Iterable[Matcher]) -> tuple[HostPattern, ...]:
    """All host patterns of URL matchers (what may name a private address explicitly)."""
    out: list[HostPattern] = []
    for m in matchers:
        if isinstance(m, UrlMatcher):
            out.extend(m.hosts)
    return tuple(out)
