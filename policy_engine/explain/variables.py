"""The trace steps saying what a permit's path variable (``$SESSION``) resolved to for a call."""

from __future__ import annotations

from policy_engine.graph import PolicySet
from policy_engine.model import FsCapability, Settings, TraceStep
from policy_engine.patterns.paths import path_variable, resolve_variables


def variable_steps(policyset: PolicySet, settings: Settings | None) -> tuple[TraceStep, ...]:
    """One step per permit rule naming a path variable: the paths it resolved to (``pass``),
    or why it matches nothing here (``skip``: the call is not in a session). The profile
    builder resolves exactly so (ProfileBuilder._visits), explain and run alike."""
    session = settings.session if settings is not None else None
    values = {"$SESSION": session}
    steps: list[TraceStep] = []
    seen: set[str] = set()
    for rules in policyset.permits_by_kind.values():
        for rule in rules:
            if rule.id in seen:
                continue
            written = [*dict.fromkeys(
                p for cap in rule.capabilities.values() if isinstance(cap, FsCapability)
                for p in cap.paths if path_variable(p) is not None)]
            if not written:
                continue
            seen.add(rule.id)
            if session is None:
                detail = (", ".join(f"`{p}`" for p in written) + f" {_match(written)} "
                          "nothing: this call is not in a session (`$SESSION` is set by "
                          "the engine's session runtime, for its own calls only)")
                steps.append(TraceStep(node="variables", outcome="skip", rule=rule.ref,
                                       detail=detail))
                continue
            if resolve_variables(written[0], values) is None:
                steps.append(TraceStep(
                    node="variables", outcome="skip", rule=rule.ref,
                    detail=", ".join(f"`{p}`" for p in written) + f" {_match(written)} "
                    f"nothing: the session's directory `{session}` is `/` or holds a "
                    "`*`/`?`, which no glob names exactly"))
                continue
            shown = ", ".join(f"`{p}` → `{resolve_variables(p, values)}`" for p in written)
            steps.append(TraceStep(node="variables", outcome="pass", rule=rule.ref,
                                   detail=f"`$SESSION` is `{session}` (the calling session's "
                                   f"workspace): {shown}"))
    return tuple(steps)


def _match(written: list[str]) -> str:
    return "matches" if len(written) == 1 else "match"
