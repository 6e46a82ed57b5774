"""The request universe of the exact diff: per capability kind, one witness per dimension cell.

Each dimension a rule constrains is split into cells that every pattern of either version
matches wholly or not at all (see :mod:`policy_engine.analysis.automata`): paths and host names
by automata, IP addresses by the intervals their networks and the guard's address classes cut,
ports, schemes, methods, tools and browser scopes as finite sets plus one value none of them
names, argv as sequences over the cells of single arguments, sizes and timeouts at every
threshold and one past it. The product of a kind's dimensions is its universe: every request of
that kind is decided as one of these witnesses is.
"""

from __future__ import annotations

import base64
import ipaddress
import re
from collections.abc import Callable, Hashable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from itertools import product
from typing import Any, Protocol

from policy_engine.analysis.automata import (
    ANY,
    NFA,
    TooComplex,
    intersects,
    literal_nfa,
    regex_nfa,
    union,
    venn,
)
from policy_engine.guard.ipaddr import _RANGES  # the guard's address classes: cells must cut there
from policy_engine.model import (
    ArgSlot,
    BrowserCapability,
    BrowserNavOp,
    BrowserScreenshotOp,
    Capability,
    ExecOp,
    FsCapability,
    FsListOp,
    FsReadOp,
    FsWriteOp,
    Limits,
    NetHttpCapability,
    NetHttpOp,
    ProcCapability,
    ProcExecOp,
    TmpAllocOp,
    TmpCapability,
)
from policy_engine.patterns.hosts import HostPattern
from policy_engine.patterns.paths import expand_home, glob_body

_SEG = r"(?:[^/\x00.][^/\x00]*|\.[^/\x00.][^/\x00]*|\.\.[^/\x00]+)"
PATH_UNIVERSE = r"/|(?:/" + _SEG + r")+"
"""Normalized absolute paths: what the guard matches globs against (no `.`, `..`, `//`, NUL)."""
_LABEL = r"[a-z0-9_](?:[a-z0-9_-]*[a-z0-9_])?"
HOST_UNIVERSE = rf"{_LABEL}(?:\.{_LABEL})*"
_NUMERIC_LAST = r"(?:.*\.)?(?:[0-9]+|0x[0-9a-f]*)"
"""Names whose last label is a number: URLs read them as IPv4 addresses (never a name)."""
ENV_UNIVERSE = r"[A-Za-z_][A-Za-z0-9_]*"
MAX_PAYLOAD = 1 << 21
"""Largest write payload a witness builds (bytes); a larger threshold is reported undecided."""
_METHODS = ("GET", "HEAD", "POST", "PUT", "DELETE", "PATCH", "OPTIONS")
_SCHEMES = ("https", "http")


@dataclass(frozen=True, slots=True)
class Undecidable:
    """A dimension the engine could not split exactly: named, with the rules and why."""

    kind: str
    dimension: str
    rules: tuple[str, ...]
    reason: str


class RuleLike(Protocol):
    """A compiled rule, or a grant's or manifest's capabilities standing in for one."""

    @property
    def id(self) -> str: ...
    @property
    def capabilities(self) -> Mapping[Any, Capability]: ...
    @property
    def limits(self) -> Limits | None: ...


@dataclass(frozen=True, slots=True)
class Source:
    """Capabilities of a grant or manifest, cut into the universe like a rule's."""

    id: str
    capabilities: Mapping[Any, Capability]
    limits: Limits | None = None


@dataclass(frozen=True, slots=True)
class Witness:
    """One request of the universe: the op, the capability a grant and manifest need for it."""

    kind: str
    op: ExecOp
    cap: Capability


class Universe:
    """Witness generation for the rules of both versions (``rules``: every rule, either side)."""

    def __init__(self, rules: Sequence[RuleLike], homes: Sequence[str],
                 undecided: list[Undecidable], defaults: Sequence[Limits] = (),
                 focus: Mapping[str, str] | None = None, sizes: Iterable[int] = ()) -> None:
        """:param focus: per dimension (``paths``, ``hosts``), a regex the witnesses must match;
            patterns disjoint from it are left out (they cannot split a cell inside it)."""
        self.rules = rules
        self.defaults = defaults
        self.focus = dict(focus or {})
        self.sizes = sorted(set(sizes))  # cuts of `request.size` the conditions compare with
        self._memo: dict[tuple[object, ...], list[str]] = {}
        self.homes = tuple(dict.fromkeys(homes))
        self.undecided = undecided

    def limit(self, kind: str, name: str) -> list[int]:
        """Every value of one limit field (rules of ``kind`` and policy defaults), and one more."""
        values = [getattr(r.limits, name) for r, _ in self.caps(kind) if r.limits]
        return thresholds(values + [getattr(d, name) for d in self.defaults])

    def caps(self, kind: str) -> list[tuple[RuleLike, Capability]]:
        return [(r, c) for r in self.rules for k, c in r.capabilities.items() if str(k) == kind]

    def _cells(self, kind: str, dim: str, universe: str, patterns: dict[str, list[str]],
               build: Callable[[str], NFA], exclude: Sequence[str] = (),
               fallback: Sequence[str] = ()) -> list[str]:
        """Witness strings of every cell, or the fallback and an undecidable note past the bound.

        :param patterns: each distinct pattern (a regex or glob, read by ``build``) with the ids
            of the rules naming it; equal pattern sets share one walk (fs.read and fs.list do).
        """
        keys = tuple(sorted(patterns))
        focus = self.focus.get(dim)
        cache_key = (universe, keys, tuple(exclude), focus)
        if cache_key in self._memo:
            return self._memo[cache_key]
        try:
            nfas = [build(k) for k in keys]
            if focus is not None:  # only patterns meeting the focus can split a cell inside it
                fn, un = regex_nfa(focus), regex_nfa(universe)
                kept = [i for i, n in enumerate(nfas) if intersects(un, fn, n)]
                keys, nfas = tuple(keys[i] for i in kept), [nfas[i] for i in kept]
            cells = venn(regex_nfa(universe), nfas + [regex_nfa(x) for x in exclude]
                         + ([regex_nfa(focus)] if focus is not None else []))
        except TooComplex as exc:
            ids = tuple(dict.fromkeys(i for k in keys for i in patterns[k]))
            self.undecided.append(Undecidable(kind, dim, ids, f"too complex to decide "
                                                              f"exactly: {exc}"))
            return list(fallback)
        n, m = len(keys), len(keys) + len(exclude)
        out = ["".join(str(c) for c in cell.witness) for cell in cells
               if not any(n <= i < m for i in cell.inside)
               and (focus is None or m in cell.inside)]
        self._memo[cache_key] = out
        return out

    # ---- per kind --------------------------------------------------------------------------

    def witnesses(self, kind: str) -> Iterator[Witness]:
        gen: dict[str, Callable[[], Iterator[Witness]]] = {
            "fs.read": lambda: self._fs(kind), "fs.write": lambda: self._fs(kind),
            "fs.list": lambda: self._fs(kind), "net.http": self._net,
            "browser.use": self._browser, "proc.exec": self._proc, "tmp.use": self._tmp}
        if kind in gen:
            yield from gen[kind]()

    def _fs(self, kind: str) -> Iterator[Witness]:
        pats: dict[str, list[str]] = {}
        for rule, cap in self.caps(kind):
            assert isinstance(cap, FsCapability)
            for glob in cap.paths:
                for home in self.homes:
                    pats.setdefault(expand_home(glob, home), []).append(rule.id)
        paths = self._cells(kind, "paths", PATH_UNIVERSE, pats, glob_nfa,
                            fallback=["/workspace/a"])
        field = {"fs.read": "max_bytes_in", "fs.write": "max_bytes_out"}.get(kind, "max_depth")
        cuts = self.limit(kind, field) + (self.sizes if kind == "fs.write" else [])
        sizes: list[int | None] = [None, *sorted(set(cuts))]
        for path, n in product(paths, sizes):
            cap = FsCapability(kind=kind, paths=(path,))
            if kind == "fs.read":
                yield Witness(kind, FsReadOp(path=path, len=n), cap)
            elif kind == "fs.write":
                if (n or 0) > MAX_PAYLOAD:
                    self.undecided.append(Undecidable(kind, "max_bytes_out", (), (
                        f"a write of {n} bytes is not built (above {MAX_PAYLOAD})")))
                    continue
                data = payload(n or 0)
                yield Witness(kind, FsWriteOp(path=path, bytes_b64=data), cap)
            else:
                yield Witness(kind, FsListOp(path=path, depth=1 if n is None else n), cap)

    def _hosts(self, kind: str) -> list[str]:
        names: dict[str, list[str]] = {}
        nets: list[ipaddress.IPv4Network | ipaddress.IPv6Network] = []
        for rule, cap in self.caps(kind):
            for raw in cap.hosts:  # type: ignore[union-attr]
                try:
                    hp = HostPattern.of(raw)
                except ValueError:  # a permit admits nothing, a forbid everything: cut nowhere
                    continue
                if hp.kind == "exact":
                    names.setdefault(re.escape(hp.value), []).append(rule.id)
                elif hp.kind == "suffix":
                    names.setdefault(r"[\s\S]*\." + re.escape(hp.value), []).append(rule.id)
                elif hp.network is not None:
                    nets.append(hp.network)
        hosts = self._cells(kind, "hosts", HOST_UNIVERSE, names, regex_nfa,
                            exclude=[_NUMERIC_LAST], fallback=["example.com"])
        return hosts + address_cells(nets)

    def _net(self) -> Iterator[Witness]:
        caps = [c for _, c in self.caps("net.http") if isinstance(c, NetHttpCapability)]
        schemes = finite([s.lower() for c in caps for s in c.schemes], _SCHEMES, "zz")
        methods = finite([m.upper() for c in caps for m in c.methods], _METHODS[:3], "X-OTHER")
        for host, scheme, method in product(self._hosts("net.http"), schemes, methods):
            for port in ports(caps, scheme):
                yield Witness("net.http", NetHttpOp(method=method, url=url(scheme, host, port)),
                              NetHttpCapability(hosts=(host,), ports=(port,), schemes=(scheme,),
                                                methods=(method,)))

    def _browser(self) -> Iterator[Witness]:
        caps = [c for _, c in self.caps("browser.use") if isinstance(c, BrowserCapability)]
        schemes = finite([s.lower() for c in caps for s in c.schemes], _SCHEMES, "zz")
        for host, scheme in product(self._hosts("browser.use"), schemes):
            for port in ports(caps, scheme):
                u = url(scheme, host, port)
                cap = BrowserCapability(hosts=(host,), ports=(port,), schemes=(scheme,),
                                        scopes=("open", "extract", "screenshot"))
                yield Witness("browser.use", BrowserNavOp(url=u, extract="none"), cap)
                yield Witness("browser.use", BrowserNavOp(url=u, extract="text"), cap)
                yield Witness("browser.use", BrowserScreenshotOp(url=u), cap)

    def _proc(self) -> Iterator[Witness]:
        caps = [(r, c) for r, c in self.caps("proc.exec") if isinstance(c, ProcCapability)]
        tools = finite([c.tool for _, c in caps], (), "unlisted-tool")
        timeouts: list[int | None] = [None, *self.limit("proc.exec", "timeout_ms")]
        for tool in tools:
            mine = [(r, c) for r, c in caps if c.tool == tool]
            envs = self._envs(tool, mine)
            for args in self._argv(tool, mine):
                for t, env in product(timeouts, envs):
                    yield Witness("proc.exec", ProcExecOp(tool=tool, args=args, timeout_ms=t,
                                                          env=env), ProcCapability(tool=tool))

    def _envs(self, tool: str, caps: list[tuple[RuleLike, ProcCapability]]
              ) -> list[dict[str, str]]:
        """No variable, and one variable per cell of the env allow-lists' names (literals exact,
        regexes searched) cut also by the guard's hijack names (`PATH`, `LD_*`, …)."""
        pats: dict[str, list[str]] = {}
        for rule, cap in caps:
            for alt in cap.env or ():
                key = (re.escape(alt.literal) if alt.literal is not None
                       else searched(alt.regex or ""))
                pats.setdefault(key, []).append(rule.id)
        if not pats:
            return [{}]  # no rule lets any variable through: every name is decided alike
        pats.setdefault(hijack_regex(), []).append("guard:hijack-names")
        names = self._cells("proc.exec", f"env of `{tool}`", ENV_UNIVERSE, pats, regex_nfa)
        return [{}, *({n: "x"} for n in names if n)]

    def _argv(self, tool: str, caps: list[tuple[RuleLike, ProcCapability]]
              ) -> list[tuple[str, ...]]:
        """Argument vectors, one per cell of the templates' Venn diagram over argument cells."""
        slots: dict[ArgSlot, str] = {}
        for rule, cap in caps:
            for slot in cap.args or ():
                slots.setdefault(slot.model_copy(update={"repeat": False}), rule.id)
        ids = tuple(dict.fromkeys(r.id for r, _ in caps))
        try:
            arg_cells = venn(any_string(),
                             [slot_nfa(s) for s in slots])
            order = list(slots)
            symbols: list[Hashable] = list(range(len(arg_cells)))
            templates = [template_nfa(c.args, arg_cells, order) for _, c in caps]
            seqs = venn(any_sequence(symbols), templates, symbols=symbols)
        except TooComplex as exc:
            self.undecided.append(Undecidable("proc.exec", f"args of `{tool}`", ids,
                                              f"too complex to decide exactly: {exc}"))
            return [()]
        return [tuple("".join(str(ch) for ch in arg_cells[int(s)].witness)  # type: ignore[call-overload]
                      for s in seq.witness) for seq in seqs]

    def _tmp(self) -> Iterator[Witness]:
        sizes = thresholds([c.max_bytes for _, c in self.caps("tmp.use")
                            if isinstance(c, TmpCapability)])
        for size in sorted({0, *sizes, *self.sizes}):
            yield Witness("tmp.use", TmpAllocOp(size_bytes=size), TmpCapability())


# ---- helpers ---------------------------------------------------------------------------------


def glob_nfa(pattern: str) -> NFA:
    """The NFA of an absolute glob, segment for segment as ``patterns.paths.glob_body`` reads it."""
    from policy_engine.patterns.paths import glob_body

    body = glob_body(pattern)
    # glob_body is written for DOTALL: its `.` must also cross a newline
    return regex_nfa(body.replace(".*", "[\\s\\S]*"))


@lru_cache(maxsize=64)
def payload(size: int) -> str:
    return base64.b64encode(bytes(size)).decode()


def any_string() -> NFA:
    nfa = NFA()
    nfa.moves.append((0, ANY, 0))
    nfa.accept.add(0)
    return nfa


def any_sequence(symbols: Sequence[Hashable]) -> NFA:
    nfa = NFA()
    nfa.moves.append((0, frozenset(symbols), 0))
    nfa.accept.add(0)
    return nfa


def slot_nfa(slot: ArgSlot) -> NFA:
    return union([literal_nfa(a.literal) if a.literal is not None else regex_nfa(a.regex or "")
                  for a in slot.alternatives])


def template_nfa(args: tuple[ArgSlot, ...] | None, cells: Sequence[object],
                 order: list[ArgSlot]) -> NFA:
    """A template as an NFA over argument-cell indexes (``None``: any argument vector)."""
    symbols = list(range(len(cells)))
    if args is None:
        return any_sequence(symbols)
    nfa = NFA()
    cur = 0
    for slot in args:
        j = order.index(slot.model_copy(update={"repeat": False}))
        hit = frozenset(i for i, c in enumerate(cells) if j in c.inside)  # type: ignore[attr-defined]
        if slot.repeat:
            nfa.moves.append((cur, hit, cur))
        else:
            nxt = nfa.new()
            nfa.moves.append((cur, hit, nxt))
            cur = nxt
    nfa.accept.add(cur)
    return nfa


def finite(named: Sequence[str], defaults: Sequence[str], other: str) -> list[str]:
    """Every value named, the defaults the guard reads into an empty field, one value unnamed."""
    out = list(dict.fromkeys([*named, *defaults]))
    while other in out:
        other += "x"
    return [*out, other]


def ports(caps: Sequence[NetHttpCapability | BrowserCapability], scheme: str) -> list[int]:
    from policy_engine.guard.urls import DEFAULT_PORTS

    named = {p for c in caps for p in c.ports}
    default = DEFAULT_PORTS.get(scheme)
    out = sorted(named | ({default} if default else set()))
    other = max([*out, 8079]) + 1
    return [*out, other]


def thresholds(values: object) -> list[int]:
    out: set[int] = set()
    for v in values:  # type: ignore[attr-defined]
        if isinstance(v, int):
            out |= {v, v + 1}
    return sorted(out)


def address_cells(nets: Sequence[ipaddress.IPv4Network | ipaddress.IPv6Network]) -> list[str]:
    """One address per interval cut by the policies' networks and the guard's address classes."""
    out: list[str] = []
    for version, top in ((4, 2 ** 32), (6, 2 ** 128)):
        cuts = {0, top}
        for net in [*nets, *(n for n, _ in _RANGES)]:
            if net.version == version:
                cuts |= {int(net.network_address), int(net.broadcast_address) + 1}
        if version == 6 and not any(n.version == 6 for n in nets):
            cuts = {0, 1, 2, 2 ** 127, top}  # only a few v6 classes matter then
            cuts |= {int(n.network_address) for n, _ in _RANGES if n.version == 6}
        for lo in sorted(cuts)[:-1]:
            addr = ipaddress.ip_address(lo) if version == 4 else ipaddress.IPv6Address(lo)
            out.append(str(addr) if version == 4 else f"[{addr}]")
    return out


def url(scheme: str, host: str, port: int) -> str:
    return f"{scheme}://{host}:{port}/"


def resource(w: Witness) -> Any:
    """What the guard's matchers read for ``w`` (``None``: a URL the guard refuses to parse)."""
    op: Any = w.op
    if w.kind.startswith("fs."):
        return op.path
    if w.kind == "proc.exec":
        return (op.tool, op.args)
    if w.kind == "net.http":
        from policy_engine.errors import PolicyEngineError
        from policy_engine.guard.urls import parse_url

        try:
            return (parse_url(op.url), op.method)
        except PolicyEngineError:
            return None
    return None


def searched(regex: str) -> str:
    """The full-match form of a regex *searched* in a string (a leading ``^`` or a trailing
    ``$`` anchors that end instead of allowing anything there)."""
    head = regex.startswith("^")
    tail = regex.endswith("$") and not regex.endswith("\\$")
    body = regex[1 if head else 0:len(regex) - 1 if tail else len(regex)]
    return ("" if head else r"[\s\S]*") + f"(?:{body})" + ("" if tail else r"[\s\S]*")


def _nocase(text: str) -> str:
    return "".join(f"[{c.lower()}{c.upper()}]" if c.isalpha() else re.escape(c) for c in text)


@lru_cache(maxsize=1)
def hijack_regex() -> str:
    """The guard's hijack names (``guard.env.is_hijack``) as one regex, case folded as it does."""
    from policy_engine.guard.env import HIJACK_EXACT, HIJACK_PREFIXES

    alts = [_nocase(n) for n in sorted(HIJACK_EXACT)]
    alts += [_nocase(p) + r"[\s\S]*" for p in HIJACK_PREFIXES]
    alts.append(r"(?:[\s\S]*_)?" + _nocase("PROXY"))
    return "(?:" + "|".join(alts) + ")"


def region(caps: Iterable[Capability], home: str) -> dict[str, str]:
    """Per dimension, a regex covering every request the capabilities match (or nothing)."""
    globs = [expand_home(g, home) for c in caps if isinstance(c, FsCapability) for g in c.paths]
    out: dict[str, str] = {}
    if globs:
        out["paths"] = "(?:" + "|".join(glob_body(g).replace(".*", "[\\s\\S]*")
                                        for g in globs) + ")"
    names: list[str] = []
    for c in caps:
        for raw in getattr(c, "hosts", ()):
            try:
                hp = HostPattern.of(raw)
            except ValueError:
                return out  # a bad pattern: no host focus (decide every host)
            if hp.kind == "exact":
                names.append(re.escape(hp.value))
            elif hp.kind == "suffix":
                names.append(r"[\s\S]*\." + re.escape(hp.value))
            else:
                return out  # `*`, addresses: every host cell stays
    if names:
        out["hosts"] = "(?:" + "|".join(names) + ")"
    return out
