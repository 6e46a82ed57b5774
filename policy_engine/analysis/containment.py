"""Exact capability containment for lint's shadowing rules: what one admits, the other does.

Both capabilities are cut into the request universe of their kind (the cells of their paths,
hosts, argument templates, ports, schemes and methods: :mod:`policy_engine.analysis.dimensions`)
and every cell is matched by the guard's own matchers; the answer is exact, with no false
"covered" and no missed one. Kinds whose resources are not all request fields (browser scopes,
tmp sizes, GPU classes) and automata past the state bound answer ``None``: the caller keeps its
sound approximation there.
"""

from __future__ import annotations

from policy_engine.analysis.dimensions import Source, Undecidable, Universe, resource
from policy_engine.guard.matchers import compile_matcher
from policy_engine.model import Capability, NetHttpCapability

EXACT_KINDS = frozenset({"fs.read", "fs.write", "fs.list", "proc.exec", "net.http"})


def covers(a: Capability, b: Capability, home: str) -> bool | None:
    """Whether every request ``b`` admits (as a permit) ``a`` admits too; ``None``: not decided."""
    kind = b.kind
    if a.kind != kind:
        return False
    if kind not in EXACT_KINDS:
        return None
    if isinstance(a, NetHttpCapability) and isinstance(b, NetHttpCapability) and a.mime and (
            not b.mime or not set(b.mime) <= set(a.mime)):
        return False  # the response types b lets through are not all a's
    undecided: list[Undecidable] = []
    uni = Universe([Source("a", {kind: a}), Source("b", {kind: b})], [home], undecided)
    ma, mb = compile_matcher(a, kind, home), compile_matcher(b, kind, home)
    for w in uni.witnesses(kind):
        if undecided:
            return None
        res = resource(w)
        if res is not None and mb.admits(res) and not ma.admits(res):
            return False
    return None if undecided else True
