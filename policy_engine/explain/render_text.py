"""Text rendering of an explanation: why it was decided, and which rule one would change."""

from __future__ import annotations

from policy_engine.evidence import redact_url
from policy_engine.explain.pipeline import Explanation
from policy_engine.model import (
    BrowserNavOp,
    BrowserScreenshotOp,
    ExecOp,
    FsListOp,
    FsReadOp,
    FsWriteOp,
    NetHttpOp,
    ProcExecOp,
    RuleRef,
    TmpAllocOp,
    TraceStep,
)


def describe_op(op: ExecOp) -> str:
    """A one-line, secret-free summary of an operation: no file content, env value, argument
    value or URL user info/query/fragment (arguments are counted, see ``policy-engine run``'s
    evidence for their digests)."""
    match op:
        case FsReadOp() | FsWriteOp() | FsListOp():
            return f"{op.kind} {op.path}"
        case NetHttpOp():
            return f"net.http {op.method} {redact_url(op.url)}"
        case BrowserNavOp():
            return f"browser.nav {redact_url(op.url)}"
        case BrowserScreenshotOp():
            return f"browser.screenshot {redact_url(op.url) if op.url else '(current page)'}"
        case ProcExecOp():
            return f"proc.exec {op.tool} ({len(op.args)} arguments)"
        case TmpAllocOp():
            return f"tmp.alloc {op.size_bytes} bytes"
    return op.kind


def _where(rule: RuleRef) -> str:
    if rule.file == "<builtin>":
        return "<builtin>"
    return f"{rule.file}:{rule.line}:{rule.column}"


def _step_line(index: int, step: TraceStep) -> str:
    rule = f" {step.rule.id} ({_where(step.rule)})" if step.rule else ""
    detail = f" — {step.detail}" if step.detail else ""
    return f"  {index:>2}. {step.node:<13} {step.outcome:<15}{rule}{detail}"


def refused_by(trace: tuple[TraceStep, ...] | None) -> list[str]:
    """The layers that would each refuse the op on their own (the ``layer:*`` steps)."""
    return [s.node.removeprefix("layer:") for s in trace or ()
            if s.node.startswith("layer:") and s.outcome == "fail"]


def render_text(exp: Explanation) -> str:
    """Render for a security engineer: the verdict, the deciding rule, the trace, what to edit."""
    d = exp.decision
    lines: list[str] = []
    if d.decision == "allow":
        lines.append("ALLOW")
    else:
        lines.append(f"DENY  {d.code} (HTTP {d.http_status})")
    lines.append(f"  op:       {describe_op(exp.request.op)}")
    if d.reason:
        lines.append(f"  reason:   {d.reason}")
    layers = refused_by(d.trace)
    if layers:
        lines.append(f"  refused:  by {', '.join(layers)}")
    if d.rule is not None:
        lines.append(f"  rule:     {d.rule.id} at {_where(d.rule)}")
    elif d.code == "SANDBOX.PERMISSION_DENY":
        lines.append("  rule:     none (default deny: no rule permits this)")
    lines.append(f"  tool:     {exp.manifest.name} {exp.manifest.version}")
    lines.append(
        f"  grant:    call {exp.grant.call_id} for {exp.grant.subject_id} "
        f"(tenant {exp.grant.tenant})"
    )
    lines.append(
        f"  policy:   {exp.policyset.name} {exp.policyset.version} "
        f"({exp.policyset.version_hash[:12]})"
    )
    if exp.profile is not None:
        p = exp.profile
        named = f"{p.name} " if p.name else ""
        lines.append(
            f"  profile:  {named}network={p.network.value} safety={p.safety.value} "
            f"hash={p.profile_hash[:16]}"
            + (f" isolation={p.isolation.value}" if p.isolation is not None else "")
        )
        for req in exp.backend_requires():
            lines.append(f"  requires: {req}")
    lines.extend(_limit_lines(exp))
    if d.trace:
        lines.append("trace:")
        lines.extend(_step_line(i, step) for i, step in enumerate(d.trace, 1))
    lines.append(_advice(exp))
    return "\n".join(lines)


_UNITS = {"timeout_ms": " ms", "max_bytes_in": " bytes", "max_bytes_out": " bytes",
          "memory_bytes": " bytes", "max_stdout_bytes": " bytes", "max_stderr_bytes": " bytes",
          "disk_write_bytes": " bytes", "cpu_cores": " cores"}


def _limit_lines(exp: Explanation) -> list[str]:
    """One line per effective limit: value and the layer that set it (a rule by its id)."""
    limits = exp.limits()
    if not limits:
        return []
    rule = exp.decision.rule
    head = "limits (effective, set by):" if exp.decision.limits is not None \
        else "limits (profile, set by):"
    out = [head]
    for field, (value, layer) in limits.items():
        shown = f"{value:g}" if isinstance(value, float) else str(value)
        who = f"rule {rule.id}" if layer == "rule" and rule is not None else layer
        out.append(f"  {field:<22} {shown}{_UNITS.get(field, '')}  ({who})")
    return out


def _advice(exp: Explanation) -> str:
    d = exp.decision
    if d.decision == "allow":
        where = f" ({_where(d.rule)})" if d.rule else ""
        return f"allowed by {d.rule.id if d.rule else 'the profile'}{where}"
    if d.rule is not None and d.rule.file == "<builtin>":
        return "this is a mandatory deny: no grant, manifest or policy can lift it"
    if d.rule is not None:
        return f"to change this decision, edit the rule at {_where(d.rule)}"
    failed = [s for s in d.trace or () if s.node == "limits" and s.outcome == "fail"]
    if failed and "(set by " in failed[0].detail:
        layer = failed[0].detail.rsplit("(set by ", 1)[1].rstrip(")")
        return (f"the limit comes from the {layer} layer: ask for less, or raise it there "
                "(docs/language.md, Limits)")
    return _ADVICE.get(d.code or "", "see docs/error-codes.md for this code")


_ADVICE = {
    "POLICY.DENY_TOOL": "to change this decision, change the tool manifest's permissions or "
                        "argument templates",
    "SANDBOX.PERMISSION_DENY": "to change this decision, add a `permit` rule for it, or widen "
                               "the grant's capabilities",
    "SANDBOX.CAPABILITY_BLOCKED": "the request itself is refused (path, address or URL form); "
                                  "fix the request",
    "QUOTA.BUDGET_EXCEEDED": "the grant's budget is used up: issue a new grant or raise its "
                             "budget",
    "SCHEMA.VALIDATION_FAILED": "the request is malformed; `policy-engine schema exec-op` prints "
                                "the expected shape",
}
