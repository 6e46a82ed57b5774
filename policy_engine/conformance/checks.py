"""The executor-facing checks: each turns the harness's observations into a CheckResult.

Every problem line says what the executor did, what the contract requires, and where to look.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable, Iterable

from pydantic import ValidationError

from policy_engine.conformance.harness import Call, Harness, Run
from policy_engine.conformance.report import CheckResult
from policy_engine.errors import ErrorCode, PolicyEngineError
from policy_engine.executor import ExecutorCapabilities
from policy_engine.model import EvidenceBegin, EvidenceEnd, ExecResult, NetworkMode, OpKind
from policy_engine.orchestration.selection import missing_capabilities

_CODES = frozenset(c.value for c in ErrorCode)
_DENIALS = frozenset({ErrorCode.PERMISSION_DENY.value, ErrorCode.DENY_TOOL.value,
                      ErrorCode.CAPABILITY_BLOCKED.value})
_NAME = re.compile(r"^[a-z0-9][a-z0-9._-]{0,63}$")
SPI = "policy_engine/executor.py"

# (id, title) of every check, in report order; `capabilities.runs[<kind>]` repeats per kind.
CATALOG: tuple[tuple[str, str], ...] = (
    ("metadata.name", "the executor has a stable, well-formed name"),
    ("metadata.capabilities", "declared capabilities are well-typed and JSON-serialisable"),
    ("capabilities.runs[<kind>]", "every declared op kind runs and produces a result"),
    ("capabilities.undeclared-not-routed", "ops of undeclared kinds never reach the executor"),
    ("refusal.wrong-kind", "an op of an undeclared kind handed over directly is refused with "
                           "a registry code"),
    ("refusal.policy-denial", "a policy denial never reaches the executor"),
    ("refusal.registry-codes", "every failure the executor reports carries a registry code"),
    ("evidence.complete", "every call leaves one begin and one end record, matching and typed"),
    ("evidence.no-secrets", "no planted secret appears in any evidence record or public message"),
    ("timeout.honoured", "a call outliving the profile timeout ends with LLM.TIMEOUT within "
                         "the grace period"),
    ("cancel.honoured", "a cancelled call ends promptly with TOOL.EXECUTION_FAILED"),
    ("limits.timeout", "a call runs under ExecContext.limits: a 1 s timeout there ends it "
                       "with LLM.TIMEOUT although the profile says 60 s"),
    ("lifecycle.close", "close() releases the executor without raising"),
    ("claims.probes-run", "every claim probe ran inside the sandbox and reported what it "
                          "could do: an executor refusing a probe proves nothing"),
    ("claims.network-off", "a network-off sandbox cannot reach a loopback canary listener"),
    ("claims.writes-confined", "a sandbox writes only the profile's writable paths"),
    ("claims.no-setid-plant", "nothing written to a writable bind carries set-id bits or is "
                              "a device node usable on the host"),
    ("claims.not-host-root", "the sandboxed process does not run as host uid 0"),
    ("claims.no-orphans", "no process of a call outlives it (timeout included)"),
    ("claims.ipc-isolated", "no /dev/shm file or SysV segment of one call is visible to the "
                            "next or to the host"),
    ("claims.mandatory-denies", "a secret under a mandatory deny (a planted .env, the host's "
                                "~/.ssh) never reaches the tool; without the claim, proc.exec "
                                "is refused in both modes and the kit says what may run"),
    ("claims.env-filtering", "a variable planted in the engine's environment never reaches "
                             "the tool"),
    ("claims.resource-limits", "the tool cannot outgrow its pids and memory limits or outlive "
                               "its timeout"),
    ("compat.degraded-recorded", "in compat mode every run on a backend lacking what the "
                                 "profile needs records degraded=true and why"),
)
TITLES = dict(CATALOG)


def result(check_id: str, problems: Iterable[str], *, title_key: str | None = None,
           na: str | None = None) -> CheckResult:
    title = TITLES[title_key or check_id]
    if na is not None:
        return CheckResult(check_id, title, "n/a", note=na)
    found = tuple(problems)
    return CheckResult(check_id, title, "fail" if found else "pass", found)


def exception_text(value: object) -> str:
    """``Type: message`` of an exception (the message is what an author needs to fix it), or
    the type of any other value; one line, bounded."""
    if isinstance(value, BaseException):
        text = str(value).strip().splitlines()[0] if str(value).strip() else "(no message)"
        return f"{type(value).__name__}: {text[:300]}"
    return type(value).__name__


def _describe(run: Run) -> str:
    r = run.outcome.result
    what = "ok" if r.ok else f"{r.code} ({r.message})"
    raised = [c.exc for c in run.calls if c.exc is not None]
    if raised and not isinstance(raised[0], PolicyEngineError):
        what += f"; execute() raised {exception_text(raised[0])}"
    return what


# -- metadata -------------------------------------------------------------------------------


def check_name(executor: object, wanted: str) -> CheckResult:
    name = getattr(executor, "name", None)
    problems = []
    if not isinstance(name, str) or not _NAME.match(name):
        problems.append(f"name is {name!r}; the contract requires a lowercase identifier "
                        f"matching {_NAME.pattern} (it keys `backends:` and evidence "
                        f"`sandbox_backend`); see {SPI} Executor.name")
    elif name != wanted:
        problems.append(f"registered as `{wanted}` but reports name `{name}`")
    return result("metadata.name", problems)


def check_capabilities(executor: object) -> CheckResult:
    caps = getattr(executor, "capabilities", None)
    where = f"see {SPI} ExecutorCapabilities"
    if not isinstance(caps, ExecutorCapabilities):
        return result("metadata.capabilities", [
            f"capabilities is {type(caps).__name__}; the contract requires an "
            f"ExecutorCapabilities instance; {where}"])
    problems = []
    if not caps.op_kinds or not all(isinstance(k, OpKind) for k in caps.op_kinds):
        problems.append(f"op_kinds is {sorted(map(str, caps.op_kinds))!r}; the contract "
                        f"requires a non-empty set of OpKind members; {where}")
    if not caps.network_modes or not all(isinstance(m, NetworkMode)
                                         for m in caps.network_modes):
        problems.append(f"network_modes is {sorted(map(str, caps.network_modes))!r}; the "
                        f"contract requires a non-empty set of NetworkMode members; {where}")
    for flag in ("bind_mounts", "readonly_rootfs", "resource_limits", "env_filtering",
                 "streaming_output"):
        if not isinstance(getattr(caps, flag), bool):
            problems.append(f"capabilities.{flag} is {getattr(caps, flag)!r}; the contract "
                            f"requires a bool; {where}")
    if not problems:
        try:
            json.dumps(caps.to_json())
        except (TypeError, ValueError) as exc:
            problems.append(f"capabilities.to_json() is not JSON-serialisable ({exc}); "
                            "`policy-engine plugins` prints it")
    for member in ("local", "enforces_deadline"):
        value = getattr(executor, member, False)
        if not isinstance(value, bool):
            problems.append(f"optional member `{member}` is {value!r}; the contract requires "
                            f"a bool when present; see {SPI} Executor")
    probe = getattr(executor, "available", None)
    if probe is not None:
        try:
            state = probe()
        except Exception as exc:  # reported: the orchestrator treats it as unavailable
            problems.append(f"available() raised {exception_text(exc)}; the contract "
                            "requires True, False or a reason string")
        else:
            if not (state is True or state is False or isinstance(state, str)):
                problems.append(f"available() returned {state!r}; the contract requires True, "
                                "False or a reason string")
    return result("metadata.capabilities", problems)


# -- capabilities -----------------------------------------------------------------------------


def check_runs(kind: OpKind, runs: list[Run], name: str, covered: bool) -> CheckResult:
    cid = f"capabilities.runs[{kind.value}]"
    if not covered:
        return result(cid, [
            f"`{kind.value}` is declared but no probe exercises it (the kit has no default "
            "probe for it); add one with `conformance_probes` so the declaration can be "
            "verified"], title_key="capabilities.runs[<kind>]")
    problems = []
    for run in runs:
        r, end = run.outcome.result, run.outcome.end
        label = run.probe.label()
        if not run.calls:
            problems.append(f"{label}: never reached the executor ({_describe(run)}); a "
                            f"declared kind must be served (check `available()` and the "
                            "capability flags the profile needs)")
        elif not r.ok:
            problems.append(f"{label}: ended with {_describe(run)}; the contract requires a "
                            f"declared `{kind.value}` op the policy allows to succeed")
        elif end.sandbox_backend != name:
            problems.append(f"{label}: served by `{end.sandbox_backend}`, not `{name}`")
        else:
            try:
                json.dumps(r.out)
            except (TypeError, ValueError) as exc:
                problems.append(f"{label}: result.out is not JSON-serialisable ({exc}); "
                                "return digests, handles and plain values")
    return result(cid, problems, title_key="capabilities.runs[<kind>]")


def check_undeclared(runs: list[Run], declared: frozenset[OpKind]) -> CheckResult:
    if not runs:
        return result("capabilities.undeclared-not-routed", (),
                      na="the executor declares every kind the kit can probe")
    problems = []
    for run in runs:
        kind = run.probe.kind.value
        if run.calls:
            problems.append(f"`{kind}` (not declared) reached execute(); the orchestrator must "
                            "never route an undeclared kind: report this as an engine bug")
        elif run.outcome.result.code != ErrorCode.PROVIDER_UNAVAILABLE.value:
            problems.append(f"`{kind}` routed to this executor ended with {_describe(run)}; "
                            "the contract requires PROVIDER.UNAVAILABLE")
    return result("capabilities.undeclared-not-routed", problems)


# -- refusals ---------------------------------------------------------------------------------


def check_wrong_kind(outcome: tuple[str, object] | None, kind: OpKind | None) -> CheckResult:
    if outcome is None or kind is None:
        return result("refusal.wrong-kind", (),
                      na="no undeclared kind to hand over, or no call produced a profile")
    how, value = outcome
    fix = (f"raise PolicyEngineError(ErrorCode.EXECUTION_FAILED, \"<name> cannot run "
           f"`{kind.value}`\"); see {SPI} Executor.execute")
    problems = []
    if how == "hung":
        problems.append(f"execute() given a `{kind.value}` op did not return within 5 s; {fix}")
    elif how == "raised" and not isinstance(value, PolicyEngineError):
        problems.append(f"execute() given a `{kind.value}` op raised "
                        f"{exception_text(value)}; {fix}")
    elif how == "returned":
        if not isinstance(value, ExecResult):
            problems.append(f"execute() given a `{kind.value}` op returned "
                            f"{type(value).__name__}; {fix}")
        elif value.ok:
            problems.append(f"execute() accepted a `{kind.value}` op it does not declare and "
                            f"returned ok; {fix}")
        elif value.code not in _CODES:
            problems.append(f"execute() refused a `{kind.value}` op with code {value.code!r}, "
                            f"not a registry code; {fix}")
    return result("refusal.wrong-kind", problems)


def check_denials(runs: list[Run]) -> CheckResult:
    problems = []
    for run in runs:
        r = run.outcome.result
        kind = run.probe.kind.value
        if run.calls:
            problems.append(f"`{kind}` with a grant giving nothing reached execute(): a policy "
                            "denial must stop before the executor (engine bug: report it)")
        elif run.outcome.end.status != "denied" or r.code not in _DENIALS:
            problems.append(f"`{kind}` with a grant giving nothing ended with {_describe(run)} "
                            f"(status {run.outcome.end.status}); the contract requires a "
                            f"denial code ({', '.join(sorted(_DENIALS))})")
    return result("refusal.policy-denial", problems)


def _call_problem(call: Call) -> str | None:
    if call.exc is not None and not isinstance(call.exc, PolicyEngineError):
        return (f"execute() raised {exception_text(call.exc)} for a "
                f"`{call.op.kind}` op; raise PolicyEngineError with a registry code (the "
                "orchestrator can only report TOOL.EXECUTION_FAILED and hide the reason)")
    if call.exc is None and call.ended is not None and not isinstance(call.result, ExecResult):
        return (f"execute() returned {type(call.result).__name__} for a `{call.op.kind}` op; "
                "the contract requires an ExecResult")
    if isinstance(call.result, ExecResult) and not call.result.ok \
            and call.result.code not in _CODES:
        return (f"execute() reported failure with code {call.result.code!r} for a "
                f"`{call.op.kind}` op; the contract requires a registry code "
                "(policy_engine.errors.ErrorCode)")
    return None


def check_registry_codes(runs: list[Run]) -> CheckResult:
    problems: list[str] = []
    for run in runs:
        for call in run.calls:
            problem = _call_problem(call)
            if problem and problem not in problems:
                problems.append(problem)
        expected = run.probe.expect_code
        if run.purpose == "refuse" and run.outcome.result.code != expected:
            problems.append(f"{run.probe.label()}: ended with {_describe(run)}; the probe "
                            f"requires {expected}")
    return result("refusal.registry-codes", problems)


# -- evidence ---------------------------------------------------------------------------------


def _evidence_problems(run: Run, name: str) -> list[str]:
    label = f"{run.probe.label()} ({run.purpose})"
    types = [t for t, _j in run.records]
    if types != ["begin", "end"]:
        return [f"{label}: evidence records {types}; the contract requires exactly one begin "
                "then one end per call"]
    try:
        begin = EvidenceBegin.model_validate_json(run.records[0][1], strict=True)
        end = EvidenceEnd.model_validate_json(run.records[1][1], strict=True)
    except ValidationError as exc:
        return [f"{label}: an evidence record does not match its schema: {exc}"]
    problems = []
    r = run.outcome.result
    if begin.envelope_id != end.envelope_id or not begin.envelope_id:
        problems.append(f"{label}: begin/end envelope ids differ or are empty")
    if (end.status == "ok") != r.ok or end.sandbox_success != r.ok:
        problems.append(f"{label}: evidence status {end.status} / success "
                        f"{end.sandbox_success} but the result ok={r.ok}")
    if end.error_code != r.code:
        problems.append(f"{label}: evidence error_code {end.error_code} but result code {r.code}")
    if end.finished_at_ms < begin.produced_at_ms:
        problems.append(f"{label}: end finished_at_ms precedes begin produced_at_ms")
    if run.calls and end.sandbox_backend != name:
        problems.append(f"{label}: evidence names backend {end.sandbox_backend}, not `{name}`")
    if run.calls and end.budget_used.calls != 1:
        problems.append(f"{label}: evidence budget_used.calls is {end.budget_used.calls}, not 1")
    return problems


def check_evidence(runs: list[Run], name: str) -> CheckResult:
    problems: list[str] = []
    for run in runs:
        problems.extend(_evidence_problems(run, name))
    return result("evidence.complete", problems)


def check_secrets(runs: list[Run], secret: str) -> CheckResult:
    problems = []
    for run in runs:
        secrets = {secret, *run.probe.secrets}
        for kind, text in run.records:
            leaked = sorted(s for s in secrets if s and s in text)
            if leaked:
                where = _secret_fields(text, leaked[0])
                problems.append(f"{run.probe.label()} ({run.purpose}): a planted secret appears "
                                f"in the {kind} record at {where}; evidence holds metadata and "
                                "digests only: record sizes, paths and hosts, never content, "
                                "header values or environment values")
        message = run.outcome.result.message or ""
        if any(s and s in message for s in secrets):
            problems.append(f"{run.probe.label()} ({run.purpose}): a planted secret appears in "
                            "the public error message; put details in the audit detail")
    return result("evidence.no-secrets", problems)


def _secret_fields(text: str, secret: str) -> str:
    """The JSON paths of the record holding ``secret`` (so the author knows what to fix)."""
    found: list[str] = []

    def walk(value: object, path: str) -> None:
        if isinstance(value, dict):
            for k, v in value.items():
                walk(v, f"{path}.{k}")
        elif isinstance(value, list):
            for i, v in enumerate(value):
                walk(v, f"{path}[{i}]")
        elif isinstance(value, str) and secret in value:
            found.append(path or "$")

    walk(json.loads(text), "$")
    return ", ".join(found) or "$"


# -- timeouts and cancellation ----------------------------------------------------------------


def _ended_after(call: Call, since: float, wait_s: float) -> float | None:
    """Seconds from ``since`` to the end of ``call`` (waiting up to ``wait_s``); None: still
    running.
    """
    if call.ended is None:
        call.wait(max(0.0, since + wait_s - time.monotonic()))
    return None if call.ended is None else call.ended - since


def _slow_run_problems(run: Run, want: str, budget_s: float, grace_s: float,
                       fired_at: Callable[[Call], float], what: str) -> list[str]:
    label = run.probe.label()
    if not run.calls:
        return [f"{label}: never reached the executor ({_describe(run)}), so {what} could not "
                "be observed"]
    problems = []
    r = run.outcome.result
    if r.ok:
        problems.append(f"{label}: finished ok in {run.elapsed_s:.2f} s; a `slow` probe must "
                        f"outlast the {what} (make it slower)")
        return problems
    if r.code != want:
        problems.append(f"{label}: ended with {_describe(run)}; the contract requires {want} "
                        f"for {what}")
    if run.elapsed_s > budget_s:
        problems.append(f"{label}: the call returned after {run.elapsed_s:.2f} s; the contract "
                        f"requires at most {budget_s:.2f} s ({what} + {grace_s:.1f} s grace)")
    call = run.calls[0]
    start = fired_at(call)
    ended = _ended_after(call, start, grace_s + 2.0)
    if ended is None:
        problems.append(f"{label}: execute() was still running {grace_s + 2.0:.1f} s after "
                        f"the {what} fired: it ignores ctx.deadline / ctx.cancel. Poll "
                        "ctx.cancel.cancelled (or ctx.cancel.wait) and ctx.deadline between "
                        f"blocking steps and stop within {grace_s:.1f} s; see {SPI} ExecContext")
    elif ended > grace_s + 0.25:
        problems.append(f"{label}: execute() returned {ended:.2f} s after the {what} fired; "
                        f"the contract requires it to stop within {grace_s:.1f} s")
    return problems


def check_timeout(run: Run | None, grace_s: float) -> CheckResult:
    if run is None:
        return result("timeout.honoured", (), na="no `slow` probe for the declared kinds: "
                      "provide one with conformance_probes (role=\"slow\") to exercise it")
    timeout_s = (run.timeout_ms or 0) / 1000
    problems = _slow_run_problems(run, ErrorCode.TIMEOUT.value, timeout_s + grace_s + 0.5,
                                  grace_s, lambda call: call.ctx.deadline,
                                  f"{timeout_s:.1f} s profile timeout")
    end = run.outcome.end
    if not problems and (not end.sandbox_timed_out or end.error_code != ErrorCode.TIMEOUT.value):
        problems.append(f"{run.probe.label()}: evidence sandbox_timed_out={end.sandbox_timed_out}"
                        f" error_code={end.error_code}; both must record the timeout")
    return result("timeout.honoured", problems)


def check_cancel(run: Run | None, grace_s: float, after_s: float) -> CheckResult:
    if run is None:
        return result("cancel.honoured", (), na="no `slow` probe for the declared kinds: "
                      "provide one with conformance_probes (role=\"slow\") to exercise it")
    fired = run.cancelled_at
    problems = _slow_run_problems(
        run, ErrorCode.EXECUTION_FAILED.value, after_s + grace_s + 0.5, grace_s,
        lambda call: fired if fired is not None else call.started + after_s, "cancellation")
    end = run.outcome.end
    if not problems and end.sandbox_error_kind != "cancelled":
        problems.append(f"{run.probe.label()}: evidence sandbox_error_kind="
                        f"{end.sandbox_error_kind}; it must record `cancelled`")
    return result("cancel.honoured", problems)


def check_limits_timeout(outcome: tuple[str, object] | None, elapsed_s: float,
                         timeout_s: float, grace_s: float, label: str) -> CheckResult:
    """The executor, called with ``ctx.limits.timeout_ms`` (and the deadline set from it, as
    the orchestrator does) far below ``profile.limits`` / ``profile.timeout_ms``, stops at the
    former: the permitting rule's limits reach executors only through ``ctx.limits``."""
    if outcome is None:
        return result("limits.timeout", (), na="no `slow` probe for the declared kinds: "
                      "provide one with conformance_probes (role=\"slow\") to exercise it")
    how, value = outcome
    code = (value.code.value if how == "raised" and isinstance(value, PolicyEngineError) else
            value.code if how == "returned" and isinstance(value, ExecResult) else None)
    problems = []
    if how == "hung" or elapsed_s > timeout_s + grace_s + 0.5:
        problems.append(f"{label}: still running {elapsed_s:.2f} s after a call whose "
                        f"ctx.limits.timeout_ms is {timeout_s * 1000:.0f}; it follows "
                        "profile.limits / profile.timeout_ms (60 s here). Stop at ctx.deadline "
                        f"and read every limit from ctx.limits; see {SPI} ExecContext and "
                        "docs/plugins.md \"Limits an executor enforces\"")
    elif code != ErrorCode.TIMEOUT.value:
        problems.append(f"{label}: ended with {how} {code or exception_text(value)}; the "
                        f"contract requires {ErrorCode.TIMEOUT.value} when ctx.limits' "
                        "timeout passes")
    return result("limits.timeout", problems)


def check_close(harness: Harness) -> CheckResult:
    error = harness.close()
    if error is None:
        return result("lifecycle.close", ())
    return result("lifecycle.close", [f"close() raised {exception_text(error)}; it must "
                                      "release pools and temp spaces without raising"])


# -- compat mode ------------------------------------------------------------------------------


def check_degraded(runs: list[Run], caps: ExecutorCapabilities | None, mode: str) -> CheckResult:
    if mode != "compat":
        return result("compat.degraded-recorded", (), na="strict mode: a backend lacking what "
                      "the profile needs is refused, never run degraded")
    if caps is None:
        return result("compat.degraded-recorded", (), na="no capabilities to compare with")
    problems = []
    for run in runs:
        profile = run.outcome.profile
        if not run.calls or profile is None:
            continue
        missing = missing_capabilities(caps, profile, run.probe.kind)
        end = run.outcome.end
        reason = end.sandbox_degrade_reason or ""
        if missing and not end.sandbox_degraded:
            problems.append(f"{run.probe.label()}: ran on a backend lacking "
                            f"{', '.join(m.capability for m in missing)} but the evidence says "
                            "degraded=false")
        for m in missing:
            if end.sandbox_degraded and m.capability not in reason:
                problems.append(f"{run.probe.label()}: the degrade reason `{reason}` does not "
                                f"name `{m.capability}`")
    return result("compat.degraded-recorded", problems)
