"""Which steps of the guard's table a call runs, as one unrolled chain per distinct plan.

``stages.kind`` asks :func:`plan` once per compilation, op kind and ``fs_facts`` (the answer is
cached on the compilation): a traced call runs every step after ``kind``, each adding its
words; an untraced one leaves out the steps that cannot answer it. The chain is the steps'
calls joined by ``or`` (each answers a ``Decision`` or ``None``; the last always answers).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from policy_engine.guard import stages
from policy_engine.guard.resolve import OP_KIND
from policy_engine.guard.steps import LIMIT_CHECKS

if TYPE_CHECKING:
    from policy_engine.guard.compiled import CompiledProfile
    from policy_engine.guard.stages import Call, Step
    from policy_engine.model import Decision

NAMES = ("kind", "resolve", "forbids", "network", "permits", "limits", "consent", "facts",
         "allow")
"""The steps' names, in the table's order (``stages.STEPS``; a test replacing a step keeps its
place)."""
Runner = Callable[["Call"], "Decision"]
_RUNNERS: dict[tuple[tuple[str, Step], ...], Runner] = {}
"""One chain per distinct plan (at most 2^5 plans of the one table)."""


def plan(cp: CompiledProfile, kind: str, fs_facts: bool, traced: bool) -> Runner:
    """The steps after ``kind`` a call of ``kind`` runs under ``cp``, as one chain.

    Traced, every step (each adds its words). Untraced, the table less the steps that can
    neither answer nor change such a call (each would return ``None`` at its first test):

    - ``forbids``: the profile forbids nothing of the kind;
    - ``network``: not a network op, or the network is on;
    - ``limits``: no limit applies to the kind (``LIMIT_CHECKS``);
    - ``consent``: settled at compile time as not required;
    - ``facts``: neither a proc.exec (its ``cwd``) nor an fs op with ``fs_facts``.
    """
    settled = cp.consent_settled
    skip = set() if traced else {name for name, skipped in (
        ("forbids", cp.forbids.get(OP_KIND[kind]) is None),
        ("network", kind not in stages.NET_OPS or not cp.network_off),
        ("limits", kind not in LIMIT_CHECKS),
        ("consent", not cp.consent_required and settled is not None and not settled[0]),
        ("facts", kind != "proc.exec" and (kind not in stages.FS_OPS or not fs_facts)),
    ) if skipped}
    steps = tuple((name, step) for name, step in zip(NAMES[1:], stages.STEPS[1:], strict=True)
                  if name not in skip)
    runner = _RUNNERS.get(steps)
    if runner is None:
        runner = _RUNNERS[steps] = _chain(steps)
    return runner


def _chain(steps: tuple[tuple[str, Step], ...]) -> Runner:
    """``steps`` as one function ``step1(s) or step2(s) or ...``, built from source (the names
    are ``_0``, ``_1``…, bound to the table's own functions): measured against a loop over the
    steps in ``decide`` (benchmarks/bench_guard_ab.py, docs/benchmarks.md), equal on the 3 µs
    domains and ≈ 3 % faster on tmp.alloc."""
    names: dict[str, object] = {f"_{i}": step for i, (_, step) in enumerate(steps)}
    source = "def run(s):\n    return " + " or ".join(f"{n}(s)" for n in names)
    exec(compile(source, f"<guard steps: {', '.join(n for n, _ in steps)}>", "exec"), names)  # noqa: S102
    run: Runner = names["run"]  # type: ignore[assignment]
    return run
