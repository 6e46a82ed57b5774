"""Conformance: every data-driven case decides as it says, and its public view is snapshot-pinned.

Each case in ``conformance/cases/`` is explained (a dry run); ``execute: true`` and ``revoked:
true`` cases also go through a real Orchestrator with the first-party executors, the JSONL
evidence sink and the memory budget meter. A case's snapshot holds the public decision (code,
HTTP status, retryable, public message, reason, rule, trace) and, for runs, the result and the
begin/end evidence with volatile fields normalized. Review and update snapshots on purpose:
``pytest conformance --snapshot-update`` (docs/conformance.md).
"""

from __future__ import annotations

import errno
from collections import Counter
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from casekit import (
    CASES_DIR,
    Case,
    Env,
    LoadedCase,
    PolicyCache,
    Result,
    bound,
    decide,
    decision_view,
    evidence_view,
    grant_of,
    load_all,
    load_case_file,
    manifest_of,
)
from syrupy.assertion import SnapshotAssertion

from plugins import budget_memory, evidence_jsonl
from policy_engine.config import EngineConfig
from policy_engine.errors import REGISTRY, DiagnosticsError, ErrorCode
from policy_engine.executor import ExecContext, ExecutorCapabilities
from policy_engine.gateway.outcome import refusal_of
from policy_engine.guard import Guard
from policy_engine.hookspecs import hookimpl
from policy_engine.model import OP_CAPABILITY, CapabilityKind, ExecResult, OpKind
from policy_engine.orchestrator import Orchestrator
from policy_engine.plugin_manager import PluginManager
from policy_engine.profile import ProfileBuilder

CASES = load_all()
BY_NOTE = {lc.case.note: lc for lc in CASES}

# The §12 security regressions (seed 000): each category names the cases that pin it.
REGRESSIONS: dict[str, tuple[str, ...]] = {
    "path traversal `..`": ("regressions/traversal-dotdot", "regressions/traversal-dotdot-run"),
    "encoded traversal `%2e%2e`": ("regressions/traversal-encoded-fs",
                                   "regressions/traversal-encoded-url"),
    "NUL byte": ("regressions/nul-in-path", "regressions/nul-in-arg"),
    "symlink out of the workspace": ("regressions/symlink-dir-to-etc",
                                     "regressions/symlink-to-shadow",
                                     "regressions/symlink-relative-escape"),
    "redirect escape": ("regressions/redirect-to-metadata", "regressions/redirect-to-private"),
    "command injection": ("regressions/injection-semicolon", "regressions/injection-subshell",
                          "regressions/injection-backticks", "regressions/injection-and-and",
                          "regressions/injection-literal-argv"),
    "sh -c": ("regressions/sh-dash-c", "regressions/shell-string-tool"),
    "oversize payload": ("regressions/oversize-write", "regressions/oversize-response",
                         "regressions/oversize-stdout"),
    "long-running execution": ("regressions/sleeper-timeout", "regressions/slow-http-timeout"),
    "expired grant": ("grants/expired", "regressions/expired-grant-run"),
    "revoked grant": ("grants/revoked-call-id",),
    "budget exhausted": ("budget/exhausted", "regressions/budget-exhausted-run"),
}


@pytest.fixture(scope="module")
def policies(tmp_path_factory: pytest.TempPathFactory) -> PolicyCache:
    return PolicyCache(tmp_path_factory.mktemp("inline-policies"))


def snapshot_view(case: Case, case_result: Result, env: Env) -> dict[str, Any]:
    """What a case's snapshot pins: the public decision, the profile's network mode and name,
    and for runs the public result and the normalized begin/end evidence."""
    view: dict[str, Any] = decision_view(case_result.decision)
    explained = case_result.explained
    if explained is not None and explained.profile is not None:
        view["profile"] = {"name": explained.profile.name,
                           "network": explained.profile.network.value}
    outcome = case_result.outcome
    if outcome is not None:
        result = outcome.result
        volatile = frozenset(case.volatile)
        view["run"] = {
            "ok": result.ok, "code": result.code, "message": result.message,
            "used": evidence_view(result.used.model_dump(), env, volatile),
            "evidence": [evidence_view(r, env, volatile) for r in case_result.records],
        }
    return env.normalize(view)  # type: ignore[no-any-return]


# ids use `.` for the note's `/`: syrupy names snapshot files after test ids
@pytest.mark.parametrize("lc", CASES, ids=[lc.case.note.replace("/", ".") for lc in CASES])
def test_case(lc: LoadedCase, case_env: Env, policies: PolicyCache, tmp_path: Path,
              snapshot_json: SnapshotAssertion) -> None:
    case = bound(lc, case_env)
    got = decide(lc, case, policies, tmp_path / "state")
    d = got.decision
    where = f"{lc.where} ({case.note}): {d.decision} {d.code} — {d.reason}"
    assert d.decision == case.want_decision, where
    assert d.code == case.want_code, where
    if d.code is not None:
        assert d.http_status == REGISTRY[ErrorCode(d.code)].http_status, where
    if case.pins_rule:
        assert (d.rule.id if d.rule else None) == case.want_rule, where
    if got.outcome is not None:
        _check_run(lc, got)
    assert snapshot_view(case, got, case_env) == snapshot_json


def _check_run(lc: LoadedCase, got: Result) -> None:
    """Begin and end evidence exist for every run (denials too) and agree with the result; a
    dry-run refusal is never allowed by the real run."""
    case, outcome = lc.case, got.outcome
    assert outcome is not None
    assert case.run is not None
    where = f"{lc.where} ({case.note}): {outcome.end.status} {outcome.end.error_code} — " \
            f"{outcome.result.message}"
    assert [r["type"] for r in got.records] == ["begin", "end"], where
    begin, end = got.records
    assert begin["envelope_id"] == end["envelope_id"] == outcome.envelope_id
    assert end["status"] == case.run.status, where
    assert end["error_code"] == case.run.code == outcome.result.code, where
    assert outcome.result.ok == (case.run.status == "ok"), where
    for field in ("tool_name", "capability", "policy_version_hash", "inputs_digest"):
        assert begin[field], f"{where}: begin record lacks `{field}`"
    if got.explained is not None and not got.explained.decision.allowed:
        assert end["status"] == "denied", where
        assert end["error_code"] == got.explained.decision.code, where


# ---- the suite's own coverage -------------------------------------------------------------------


def _outcomes() -> Counter[str]:
    """Every code some case expects, from its decision or its run."""
    seen: Counter[str] = Counter()
    for lc in CASES:
        if lc.case.want_code:
            seen[lc.case.want_code] += 1
        if lc.case.run is not None and lc.case.run.code:
            seen[lc.case.run.code] += 1
    return seen


# Codes no request can produce, each with the test below that pins its public view instead.
# UNKNOWN.INTERNAL only comes from a crash inside the guard (its catch-all turns any exception
# into a deny); every well-formed or malformed request is classified before that can happen.
NOT_REACHABLE_BY_REQUEST = {
    ErrorCode.UNKNOWN_INTERNAL.value: "test_guard_crash_is_unknown_internal",
    # a correct executor fails only on its own faults (a missing file is TOOL.NOT_FOUND)
    ErrorCode.EXECUTION_FAILED.value: "test_an_executor_fault_is_execution_failed",
}


def test_every_error_code_has_a_case() -> None:
    seen = _outcomes()
    missing = [c.value for c in ErrorCode
               if c.value not in seen and c.value not in NOT_REACHABLE_BY_REQUEST]
    assert not missing, f"error codes without a conformance case: {missing}"
    # an excluded code that a case does produce belongs in the cases, not in the exclusions
    assert not set(NOT_REACHABLE_BY_REQUEST) & set(seen)
    assert all(callable(globals()[t]) for t in NOT_REACHABLE_BY_REQUEST.values())


def test_guard_crash_is_unknown_internal(policies: PolicyCache) -> None:
    """An embedder passing a broken op object (a body that is not a string; a method that is not
    one is refused as malformed) crashes the guard's resolver: the call is denied with
    UNKNOWN.INTERNAL and the public view says nothing about the crash."""
    lc = BY_NOTE["net/github-api-get"]
    ps = policies.policyset(lc.case, lc.file.parent)
    profile = ProfileBuilder(ps).build(grant_of(lc.case, lc.file.parent),
                                       manifest_of(lc.case, lc.file.parent))
    broken = SimpleNamespace(kind="net.http", method="GET", url="https://api.github.com/zen",
                             body_b64=5, headers={})
    view = decision_view(Guard(ps).decide(profile, broken, trace=True))
    assert view["decision"] == "deny"
    assert view["code"] == ErrorCode.UNKNOWN_INTERNAL.value
    assert (view["http_status"], view["retryable"]) == (500, False)
    assert view["message"] == "internal error"  # no exception text in the public view
    assert "NoneType" not in view["reason"]


class _FaultyFs:
    """An fs executor whose disk fails under it (EIO): the executor's own fault."""

    name = "faulty-fs"
    local = False
    capabilities = ExecutorCapabilities(op_kinds=frozenset({OpKind.FS_READ}))

    def execute(self, ctx: ExecContext, op: Any) -> ExecResult:
        raise OSError(errno.EIO, "input/output error under /secret/disk")

    def close(self) -> None:
        """Nothing to release."""


class _FaultyPlugin:
    @hookimpl
    def policy_engine_executors(self, config: EngineConfig) -> list[_FaultyFs]:
        return [_FaultyFs()]


def test_an_executor_fault_is_execution_failed(policies: PolicyCache, case_env: Env,
                                               tmp_path: Path) -> None:
    """The case that now answers TOOL.NOT_FOUND, run on an executor whose disk fails: the
    executor's own fault is TOOL.EXECUTION_FAILED, 500, retryable, refused by the backend with
    no rule, and neither the public message nor the evidence holds the exception's text."""
    lc = BY_NOTE["fs/run-read-missing-file"]
    case = bound(lc, case_env)
    ps = policies.policyset(case, lc.file.parent)
    pm = PluginManager()
    for module in (evidence_jsonl, budget_memory):
        pm.register(module, module.__name__.rsplit(".", 1)[-1])
    pm.register(_FaultyPlugin(), "faulty")
    config = EngineConfig(state_dir=tmp_path, backends={OpKind.FS_READ: "faulty-fs"},
                          evidence_sinks=("jsonl",), budget_meter="memory",
                          revocation="memory")
    with Orchestrator(ps, config=config, plugins=pm) as orch:
        request = case.request.explain_request()
        outcome = orch.run(grant_of(case, lc.file.parent), manifest_of(case, lc.file.parent),
                           request.op, settings=request.settings)
    refusal = refusal_of(outcome, None)
    assert refusal is not None
    assert (refusal.code, refusal.http_status, refusal.retryable) == (
        ErrorCode.EXECUTION_FAILED.value, 500, True)
    assert (refusal.refused_by, refusal.rule) == ("backend", None)
    assert "/secret/disk" not in refusal.message
    log = (tmp_path / "evidence" / "evidence.jsonl").read_text()
    assert "/secret/disk" not in log
    assert outcome.end.sandbox_error_kind == "exception"


def test_every_capability_kind_is_allowed_and_denied_somewhere() -> None:
    kinds: dict[str, set[str]] = {}
    for lc in CASES:
        cap = str(OP_CAPABILITY[lc.case.request.op["kind"]])
        kinds.setdefault(cap, set()).add(lc.case.want_decision)
    # sys.gpu has no operation kind: nothing can ask for it, so nothing can be decided on it
    expected = {str(k) for k in CapabilityKind} - {"sys.gpu"}
    assert set(kinds) == expected
    lacking = {k: v for k, v in kinds.items() if v != {"allow", "deny"}}
    assert not lacking, f"capability kinds missing an allow or a deny case: {lacking}"


def test_size_and_spread() -> None:
    assert len(CASES) >= 150
    executed = [lc for lc in CASES if lc.case.execute]
    assert len(executed) >= 25
    domains = Counter(lc.case.note.split("/", 1)[0] for lc in CASES)
    for domain in ("fs", "net", "proc", "browser", "tmp", "grants", "budget", "consent",
                   "overrides", "settings", "profiles", "cel", "regressions"):
        assert domains[domain] >= 1, f"no case in domain `{domain}`"


@pytest.mark.parametrize("category", sorted(REGRESSIONS))
def test_security_regressions_are_pinned(category: str) -> None:
    for note in REGRESSIONS[category]:
        assert note in BY_NOTE, f"§12 regression `{category}`: case `{note}` is missing"
        assert BY_NOTE[note].case.want_decision == "deny" or BY_NOTE[note].case.run is not None


def test_case_notes_are_unique_and_files_are_under_cases() -> None:
    notes = [lc.case.note for lc in CASES]
    assert len(notes) == len(set(notes))
    assert all(lc.file.is_relative_to(CASES_DIR) for lc in CASES)


# ---- malformed case files fail with file:line ------------------------------------------------


@pytest.mark.parametrize(("text", "line", "needle"), [
    ("cases:\n  - note: fs/x\n    policy: a.sbpolicy\n    manifest: m.json\n    grant: g.json\n"
     "    request: {op: {kind: fs.read, path: /x}}\n    want_decision: allow\n"
     "    want_code: null\n    wanted_rule: typo\n", 9, "wanted_rule"),
    ("cases:\n  - note: fs/x\n    policy: a.sbpolicy\n    manifest: m.json\n    grant: g.json\n"
     "    request: {op: {kind: fs.read, path: /x}}\n    want_decision: deny\n"
     "    want_code: SANDBOX.NOT_A_CODE\n", 8, "want_code"),
    ("cases:\n  - note: fs/x\n    manifest: m.json\n    grant: g.json\n"
     "    request: {op: {kind: fs.read, path: /x}}\n    want_decision: allow\n"
     "    want_code: null\n", 2, "policy"),
    ("cases:\n  - note: fs/x\n    policy: p\n  bad indent: [\n", 4, "invalid YAML"),
])
def test_malformed_case_file_names_file_and_line(tmp_path: Path, text: str, line: int,
                                                  needle: str) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(DiagnosticsError) as info:
        load_case_file(path)
    diag = info.value.diagnostics[0]
    assert diag.id == "SBP105"
    assert diag.span is not None
    assert (diag.span.file, diag.span.line) == (str(path), line)
    assert needle in diag.message
