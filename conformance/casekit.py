"""Conformance case kit: load and validate case files, decide or run each case, pin public views.

A case file (``conformance/cases/<domain>/*.yaml``) holds ``cases:``, each one policy + manifest
+ grant + request and the decision it must get. ``docs/conformance.md`` describes the format.
Strings may carry placeholders bound per test session (``@WORKSPACE@`` a temporary workspace,
``@HTTP@``/``@PORT@`` the loopback server, ``@PYTHON@`` this interpreter) so executed cases run
against real files, servers and sandboxes while the snapshots stay machine independent.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from policy_engine.budget import grant_key
from policy_engine.compiler import compile_files
from policy_engine.compiler.loaders import (
    load_document,
    load_grant,
    load_manifest,
    validate_document,
)
from policy_engine.config import EngineConfig
from policy_engine.errors import REGISTRY, Diagnostic, DiagnosticsError, ErrorCode, Span
from policy_engine.evidence import EMPTY_DIGEST
from policy_engine.explain import ExplainRequest, Explanation, explain
from policy_engine.graph import PolicySet
from policy_engine.model import Decision, Grant, Manifest, OpKind, Usage
from policy_engine.orchestration import MemoryRevocationList
from policy_engine.orchestrator import Orchestrator, RunOutcome

ROOT = Path(__file__).resolve().parents[1]
CASES_DIR = Path(__file__).resolve().parent / "cases"
HOME = "/root"
"""What `~` expands to in policies: fixed, so decisions do not depend on who runs the suite."""

CODES = frozenset(c.value for c in ErrorCode)
_NOTE = re.compile(r"[a-z0-9][a-z0-9_.-]*(/[a-z0-9][a-z0-9_.-]*)+")


class CaseRequest(BaseModel):
    """The request part of a case: `ExplainRequest` without its file-only fields."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    description: str = ""
    op: dict[str, Any]
    now_ms: int | None = 1_795_000_000_000
    overrides: dict[str, Any] | None = None
    settings: dict[str, Any] | None = None
    context: dict[str, Any] = Field(default_factory=dict)
    budget_used: dict[str, int] | None = None

    def explain_request(self) -> ExplainRequest:
        return ExplainRequest.model_validate(self.model_dump(exclude_none=True))


class RunExpect(BaseModel):
    """What an executed case's end record must say."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    status: Literal["ok", "denied", "error"]
    code: str | None = None

    @field_validator("code")
    @classmethod
    def _known(cls, v: str | None) -> str | None:
        if v is not None and v not in CODES:
            raise ValueError(f"`{v}` is not a registry error code")
        return v

    @model_validator(mode="after")
    def _coherent(self) -> RunExpect:
        if (self.status == "ok") != (self.code is None):
            raise ValueError("status `ok` has no code; `denied`/`error` need one")
        return self


class EngineOptions(BaseModel):
    """Engine configuration an executed case needs (backend choice, strict/compat)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    backends: dict[str, str] = Field(default_factory=dict)
    mode: Literal["strict", "compat"] = "strict"
    fallback_to_local: bool = False


class Case(BaseModel):
    """One conformance case (see docs/conformance.md, "Case format")."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    note: str
    description: str = ""
    policy: str | list[str] | None = None
    policy_text: str | None = None
    manifest: str | dict[str, Any]
    grant: str | dict[str, Any]
    request: CaseRequest
    want_decision: Literal["allow", "deny"]
    want_code: str | None
    want_rule: str | None = None
    execute: bool = False
    revoked: bool = False
    run: RunExpect | None = None
    engine: EngineOptions | None = None
    volatile: list[str] = Field(
        default_factory=list,
        description="run fields whose value varies between runs (a streamed amount read before "
                    "a cut-off); shown as `<set>` in the snapshot")

    @field_validator("note")
    @classmethod
    def _note_shape(cls, v: str) -> str:
        if not _NOTE.fullmatch(v):
            raise ValueError("a note is `domain/short-name` in lowercase (e.g. `fs/traversal`)")
        return v

    @field_validator("want_code")
    @classmethod
    def _code_known(cls, v: str | None) -> str | None:
        if v is not None and v not in CODES:
            raise ValueError(f"`{v}` is not a registry error code (policy_engine/errors.py)")
        return v

    @model_validator(mode="after")
    def _coherent(self) -> Case:
        if self.policy is None and self.policy_text is None:
            raise ValueError("give `policy` (file paths) or `policy_text` (inline .sbpolicy)")
        if (self.want_decision == "allow") != (self.want_code is None):
            raise ValueError("`want_code` is null exactly when `want_decision` is `allow`")
        if self.execute and self.run is None:
            raise ValueError("an executed case says what its run ends with: `run: {status, code}`")
        if self.run is not None and not (self.execute or self.revoked):
            raise ValueError("`run` is only checked for `execute: true` or `revoked: true` cases")
        if self.engine is not None and not self.execute:
            raise ValueError("`engine` only applies to `execute: true` cases")
        return self

    @property
    def pins_rule(self) -> bool:
        """Whether the case states the deciding rule (``want_rule: null`` pins "no rule")."""
        return "want_rule" in self.model_fields_set


class CaseFile(BaseModel):
    """A case file: a mapping with ``cases:``."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    cases: list[Case] = Field(min_length=1)


@dataclass(frozen=True, slots=True)
class LoadedCase:
    """A case and where it was written (for messages and relative fixture paths)."""

    case: Case
    file: Path
    line: int

    @property
    def where(self) -> str:
        return f"{self.file.relative_to(ROOT)}:{self.line}"


def load_case_file(path: Path) -> list[LoadedCase]:
    """Validate one case file; malformed ones raise DiagnosticsError (SBP105, file:line:col)."""
    data, lookup = load_document(path)
    parsed = validate_document(CaseFile, data, lookup, "conformance case file")
    return [LoadedCase(c, path, lookup.span(("cases", i)).line)
            for i, c in enumerate(parsed.cases)]


def load_all(cases_dir: Path = CASES_DIR) -> list[LoadedCase]:
    """Every case under ``cases_dir``; notes must be unique across files."""
    out: list[LoadedCase] = []
    seen: dict[str, LoadedCase] = {}
    for path in sorted(cases_dir.rglob("*.yaml")):
        for lc in load_case_file(path):
            first = seen.get(lc.case.note)
            if first is not None:
                raise DiagnosticsError([Diagnostic.make(
                    "SBP105", f"duplicate case note `{lc.case.note}` (first at {first.where})",
                    Span(str(lc.file), lc.line, 1), help="every case note must be unique")])
            seen[lc.case.note] = lc
            out.append(lc)
    return out


# ---- binding placeholders --------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Env:
    """The session's real resources that placeholders name."""

    workspace: Path
    http_base: str = "http://127.0.0.1:9"
    port: int = 9
    python: str = "/usr/bin/python3"
    tmp_dir: Path = Path("/tmp/policy-engine")

    def substitutions(self) -> dict[str, str]:
        return {"@WORKSPACE@": str(self.workspace), "@TMPDIR@": str(self.tmp_dir),
                "@HTTP@": self.http_base, "@PORT@": str(self.port), "@PYTHON@": self.python}

    def bind(self, value: Any) -> Any:
        """``value`` with every placeholder replaced (a port-only string becomes an int)."""
        if isinstance(value, str):
            if value == "@PORT@":
                return self.port
            for key, real in self.substitutions().items():
                value = value.replace(key, real)
            return value
        if isinstance(value, dict):
            return {k: self.bind(v) for k, v in value.items()}
        if isinstance(value, list):
            return [self.bind(v) for v in value]
        return value

    def normalize(self, value: Any) -> Any:
        """The inverse for snapshots: real paths, ports and interpreters back to placeholders."""
        if isinstance(value, str):
            for key, real in sorted(self.substitutions().items(), key=lambda kv: -len(kv[1])):
                if key != "@PORT@":
                    value = value.replace(real, f"<{key.strip('@').lower()}>")
            return value.replace(f":{self.port}", ":<port>")
        if isinstance(value, dict):
            return {k: self.normalize(v) for k, v in value.items()}
        if isinstance(value, list | tuple):
            return [self.normalize(v) for v in value]
        if isinstance(value, int) and not isinstance(value, bool) and value == self.port:
            return "<port>"
        return value


def bound(lc: LoadedCase, env: Env) -> Case:
    """The case with placeholders replaced by this session's real values."""
    return Case.model_validate(env.bind(lc.case.model_dump(exclude_unset=True)))


# ---- fixtures ----------------------------------------------------------------------------------


class PolicyCache:
    """Compiled policy sets, one per distinct set of files and inline text."""

    def __init__(self, scratch: Path) -> None:
        self.scratch = scratch
        self._sets: dict[tuple[tuple[str, ...], str | None], PolicySet] = {}

    def policyset(self, case: Case, base: Path) -> PolicySet:
        files = [case.policy] if isinstance(case.policy, str) else list(case.policy or ())
        paths = [str((base / f).resolve()) for f in files]
        key = (tuple(paths), case.policy_text)
        found = self._sets.get(key)
        if found is None:
            if case.policy_text is not None:
                digest = hashlib.sha256(case.policy_text.encode()).hexdigest()[:16]
                where = self.scratch / digest
                where.mkdir(parents=True, exist_ok=True)
                inline = where / "inline.sbpolicy"
                inline.write_text(case.policy_text)
                paths.append(str(inline))
            found = compile_files(paths, home=HOME)
            self._sets[key] = found
        return found


    def policyset_of_files(self, files: list[Path]) -> PolicySet:
        """A policy set from files only (the examples' policies)."""
        key = (tuple(str(f.resolve()) for f in files), None)
        found = self._sets.get(key)
        if found is None:
            found = self._sets[key] = compile_files([str(f) for f in files], home=HOME)
        return found


def manifest_of(case: Case, base: Path) -> Manifest:
    if isinstance(case.manifest, str):
        return load_manifest(base / case.manifest, home=HOME)
    return Manifest.model_validate(case.manifest)


def grant_of(case: Case, base: Path) -> Grant:
    if isinstance(case.grant, str):
        return load_grant(base / case.grant)
    return Grant.model_validate(case.grant)


# ---- deciding and running ----------------------------------------------------------------------


@dataclass(slots=True)
class Result:
    """What one case produced: the dry-run decision and, when run, the orchestrator's outcome."""

    decision: Decision
    explained: Explanation | None = None
    outcome: RunOutcome | None = None
    records: list[dict[str, Any]] = field(default_factory=list)


def decide(lc: LoadedCase, case: Case, policies: PolicyCache, state: Path | None) -> Result:
    """Explain the case (a dry run); run it through a real orchestrator when it says so.

    A revoked grant is only visible to the orchestrator (revocation is checked right before a
    call runs), so a ``revoked`` case's decision is the orchestrator's refusal.
    """
    base = lc.file.parent
    ps = policies.policyset(case, base)
    manifest, grant = manifest_of(case, base), grant_of(case, base)
    request = case.request.explain_request()
    if not (case.execute or case.revoked):
        explained = explain(ps, manifest, grant, request)
        return Result(explained.decision, explained)
    if state is None:
        raise ValueError(f"{lc.where}: an executed case needs a state directory")
    outcome, records, dry = orchestrate(case, ps, manifest, grant, request, state)
    return Result(dry.decision if dry else outcome.decision, dry, outcome, records)


def orchestrate(case: Case, ps: PolicySet, manifest: Manifest, grant: Grant,
                request: ExplainRequest, state: Path
                ) -> tuple[RunOutcome, list[dict[str, Any]], Explanation | None]:
    """One call through a fresh real Orchestrator (default plugins, JSONL evidence, memory
    budget): its outcome, the evidence records the sink wrote for it, and (unless the case is
    revoked: only the orchestrator sees that) its dry run with the same executors, as
    ``explain --config`` makes it (a cwd is a fact of the executor's view, issue 26)."""
    opts = case.engine or EngineOptions()
    config = EngineConfig(
        state_dir=state, backends={OpKind(k): v for k, v in opts.backends.items()},
        mode=opts.mode, fallback_to_local=opts.fallback_to_local, evidence_sinks=("jsonl",),
        budget_meter="memory", revocation="memory",
        # plain accounted directories: a tmpfs mount per case would outlive a crashed run
        options={"tmp": {"quota": "accounting"}})
    revocations = MemoryRevocationList()
    if case.revoked:
        revocations.revoke(grant.call_id)
    with Orchestrator(ps, config=config, revocations=revocations) as orch:
        dry = None if case.revoked else _dry_run(ps, manifest, grant, request, orch)
        used = request.budget_used or Usage()
        for kind, amount in used.model_dump().items():
            if amount:  # what the grant already consumed, as the dry run assumes it
                limit = getattr(grant.budget, kind)
                orch.meter.check_and_consume(grant_key(grant), kind, amount, limit)
        outcome = orch.run(grant, manifest, request.op, settings=request.settings,
                           overrides=request.overrides, context=request.context or None,
                           now_ms=request.now_ms)
    log = state / "evidence" / "evidence.jsonl"
    records = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
    mine = [r for r in records if r.get("envelope_id") == outcome.envelope_id]
    return outcome, mine, dry


def _dry_run(ps: PolicySet, manifest: Manifest, grant: Grant, request: ExplainRequest,
             orch: Orchestrator) -> Explanation:
    """The decision a case pins: the policy's, and the facts of the executor's own view (a
    cwd; issue 26). A backend that cannot take the call (unavailable, not serving the kind) is
    the run's status, not the decision."""
    with_view = explain(ps, manifest, grant, request, executors=orch.components.executors,
                        config=orch.config)
    trace = with_view.decision.trace or ()
    if with_view.decision.allowed or any(s.node == "fact" and s.outcome == "fail"
                                         for s in trace):
        return with_view
    return explain(ps, manifest, grant, request)


# ---- public views ------------------------------------------------------------------------------


def decision_view(d: Decision) -> dict[str, Any]:
    """The public, machine-independent view of a decision: what clients and dashboards key on."""
    spec = REGISTRY[ErrorCode(d.code)] if d.code else None
    rule = None
    if d.rule is not None:
        rule = {"id": d.rule.id, "file": Path(d.rule.file).name, "line": d.rule.line,
                "column": d.rule.column}
    return {
        "decision": d.decision,
        "code": d.code,
        "http_status": d.http_status,
        "retryable": spec.retryable if spec else None,
        "message": spec.public_message.format(reason=d.reason) if spec else None,
        "reason": d.reason,
        "rule": rule,
        "trace": [f"{s.node}:{s.outcome}" + (f":{s.rule.id}" if s.rule else "")
                  for s in d.trace or ()],
    }


_VOLATILE = frozenset({"envelope_id", "produced_at_ms", "finished_at_ms", "sandbox_latency_ms",
                       "profile_hash", "policy_version_hash", "duration_ms", "elapsed_ms",
                       "wall_ms", "cpu_ms", "pid", "started_at_ms", "artifacts_path",
                       "handle", "hmac_key",
                       # the hash chain of the log (evidence/chain.py) and the replay block
                       # (replay/record.py: grant, manifest, op view) differ with every state
                       # dir and envelope; their shape is pinned by their own tests
                       "chain", "replay"})
# argv_digest covers the interpreter's path (`@PYTHON@` is sys.executable: `python` or `python3`
# depending on how pytest was started), so only its presence is pinned
# `hmac`: per-argument digests keyed with the state directory's own key (evidence/redact.py)
_DIGEST_KEYS = frozenset({"inputs_digest", "outputs_digest", "digest", "sha256", "body_sha256",
                          "argv_digest", "hmac"})


def evidence_view(record: Mapping[str, Any], env: Env,
                  volatile: frozenset[str] = frozenset()) -> dict[str, Any]:
    """An evidence record with volatile fields replaced by markers; the contract fields (type,
    status, code, backend, profile label, network mode, side effects, degradations, budget
    counts) are kept as they are. ``volatile`` names more keys to mark (a case's own)."""
    out: dict[str, Any] = {}
    for key, value in record.items():
        out[key] = _stable(key, value, _VOLATILE | volatile)
    rule = out.get("rule")
    if isinstance(rule, dict) and isinstance(rule.get("file"), str):
        # the deciding rule (end records): its file by name, as decision_view pins it
        out["rule"] = {**rule, "file": Path(rule["file"]).name}
    label = out.get("sandbox_profile")
    if isinstance(label, str) and label.startswith("default:"):
        out["sandbox_profile"] = "default:<hash>"
    return env.normalize(out)  # type: ignore[no-any-return]


def _stable(key: str, value: Any, volatile: frozenset[str] = _VOLATILE) -> Any:
    if key in volatile:
        return "<set>" if value not in (None, "", 0) else value
    if key in _DIGEST_KEYS:
        if isinstance(value, dict):
            return "empty" if value.get("b64") == EMPTY_DIGEST.b64 else "<digest>"
        return "<digest>" if value else value
    if isinstance(value, dict):
        return {k: _stable(k, v, volatile) for k, v in value.items()}
    if isinstance(value, list):
        return [_stable(key, v, volatile) for v in value]
    return value


def iter_conditions(files: list[Path]) -> Iterator[tuple[str, Span]]:
    """Every CEL condition written in ``files`` (rules, consent rules and tool blocks)."""
    from policy_engine.dsl import ast
    from policy_engine.dsl.parser import parse_source

    for path in files:
        pf, diags = parse_source(path.read_text(), str(path))
        if diags:
            raise DiagnosticsError(diags)
        for item in pf.items:
            rules = item.permits if isinstance(item, ast.ToolDef) else (item,)
            for rule in rules:
                if isinstance(rule, ast.Rule):
                    for clause in rule.clauses:
                        if isinstance(clause, ast.Cel):
                            yield clause.source, clause.span
                elif isinstance(rule, ast.Consent) and rule.condition is not None:
                    yield rule.condition.source, rule.condition.span
