"""The backend step of a dry run: what the profile requires of its backend, and whether the
configured one provides it and takes the op (the orchestrator's own selection, nothing run)."""

from __future__ import annotations

import os
import posixpath
import stat
from collections.abc import Mapping
from pathlib import Path

from policy_engine.config import EngineConfig
from policy_engine.executor import Executor
from policy_engine.model import Decision, ExecOp, OpKind, Profile, TraceStep
from policy_engine.orchestration.selection import (
    NEVER_DEGRADED,
    Requirement,
    refusal_decision,
    requirements,
    select,
)


def requirements_shown(profile: Profile, op_kind: OpKind) -> list[str]:
    """The requirements a backend can never be excused from, as explain lists them."""
    reqs = requirements(profile, op_kind)  # memoized: the same tuple for the same inputs
    hit = _SHOWN.get(id(reqs))
    if hit is None or hit[0] is not reqs:
        hit = (reqs, tuple(f"{r.capability} ({r.why}; never degraded)" for r in reqs
                           if r.capability in NEVER_DEGRADED
                           and r.capability != "mandatory_denies"))
        if len(_SHOWN) >= 256:
            _SHOWN.clear()
        _SHOWN[id(reqs)] = hit
    return list(hit[1])


# requirement tuple's id → (that tuple, its lines): the entry keeps the tuple, so a reused id
# never matches
_SHOWN: dict[int, tuple[tuple[Requirement, ...], tuple[str, ...]]] = {}


def judge_in_state_dir(executors: Mapping[str, Executor], state_dir: Path) -> None:
    """Let executors built in a dry run's throwaway state directory judge their facts against
    the run's own (``view_state_dir``: Docker refuses a workspace beneath ``root_fs``, and
    where its workspace lies is a fact of the run's state directory; second pass N6)."""
    for executor in executors.values():
        if hasattr(executor, "view_state_dir"):
            executor.view_state_dir = state_dir


def backend_step(decision: Decision, profile: Profile, op: ExecOp,
                 executors: Mapping[str, Executor], config: EngineConfig, *,
                 trace: bool = True) -> Decision:
    """``decision`` (an allow) with a ``backend`` trace step; a deny carrying the selection's
    code when the run would refuse the backend (``SANDBOX.CAPABILITY_BLOCKED`` for a missing
    capability or an op the executor refuses, ``PROVIDER.UNAVAILABLE`` for a backend that is
    not loaded).

    :param trace: add the trace steps; without (the untraced decision, as the run makes it)
        the allow comes back as it is, the refusal as the run records it (``refusal_decision``).
    """
    sel = select(executors, config, profile, OpKind(op.kind), op)
    if not trace:
        return decision if sel.error is None else refusal_decision(decision, sel.error)
    steps = decision.trace or ()
    if sel.error is not None:
        step = TraceStep(node="backend", outcome="fail", detail=sel.error.reason)
        # a refusal on a fact of the executor's own view names that view (`... (docker view)`)
        facts = (TraceStep(node="fact", outcome="fail", detail=sel.error.reason),) \
            if sel.error.reason.endswith(" view)") else ()
        return refusal_decision(decision, sel.error).model_copy(
            update={"trace": (*steps, *facts, step)})
    detail = f"backend `{sel.backend}`"
    if profile.isolation is not None:
        detail += f" provides isolation `{profile.isolation.value}`"
    if sel.degraded:
        detail += "; degraded: " + "; ".join(sel.degraded)
    step = TraceStep(node="backend", outcome="pass", detail=detail)
    return decision.model_copy(update={"trace": (*steps, *_fact_steps(sel.executor, profile, op),
                                                 step)})


def _fact_steps(executor: Executor | None, profile: Profile, op: ExecOp) -> list[TraceStep]:
    """The facts the chosen executor judged in its own view (``fact_notes``), each naming the
    view (``fact: cwd exists (docker view)``)."""
    notes = getattr(executor, "fact_notes", None)
    if not callable(notes):
        return []
    try:
        found = notes(profile, op)
    except Exception:  # noqa: BLE001 — an aid to the reader: its refusal already passed
        return []
    return [TraceStep(node="fact", outcome="pass", detail=str(n)) for n in found or ()]


def declared_facts_step(decision: Decision, profile: Profile, op: ExecOp,
                        declared: Mapping[str, object]) -> Decision:
    """``decision`` with a ``fact`` step saying the request's declared facts were not used:
    with the engine's executors, a call is decided on the executor's view, and each declared
    fact of the op's own paths that the host view contradicts is named."""
    from policy_engine.guard.facts import parse_declared

    src = parse_declared(declared)
    root = profile.mappings.root_fs
    differs: list[str] = []
    for attr in ("path", "cwd"):
        raw = getattr(op, attr, None)
        if not isinstance(raw, str) or not raw.startswith("/"):
            continue
        fact = src.lookup(root, posixpath.normpath(raw))
        if fact is None:
            continue
        seen = _host_kind(posixpath.normpath(raw))
        if seen != fact.kind:
            differs.append(f"`{raw[:200]}` declared {fact.kind}, the host view says {seen}")
    detail = "declared facts not used: decided on the executor's view"
    if differs:
        detail += " (they differ: " + "; ".join(differs) + ")"
    step = TraceStep(node="fact", outcome="skip", detail=detail)
    trace = decision.trace or ()
    return decision.model_copy(update={"trace": (*trace[:-1], step, *trace[-1:])}
                               if trace and trace[-1].node == "decision"
                               else {"trace": (*trace, step)})


def _host_kind(path: str) -> str:
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return "absent"
    except OSError:
        return "unreadable"
    if stat.S_ISLNK(st.st_mode):
        return "symlink"
    return "file" if stat.S_ISREG(st.st_mode) else "dir" if stat.S_ISDIR(st.st_mode) \
        else "other"
