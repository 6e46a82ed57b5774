"""The evidence-sink kit: drives allowed, denied, failed and refused calls through the real
orchestrator into an installed sink, then reads back what the sink *stored* and checks it is
complete (one begin and one end per call, agreeing with the result), holds no raw content, and
survives being closed and reopened.

A sink makes its store readable to the kit with two methods (docs/conformance.md):
``read_records() -> Iterable[Mapping]`` (the begin/end records, each with ``type``) and,
optionally, ``stored_text() -> Iterable[str]`` (every value it stored, every table or column;
defaults to the records as JSON). The kit runs the calls on its own tiny executor, so a sink can
be checked without any sandbox installed.
"""

from __future__ import annotations

import base64
import hashlib
import json
import secrets
import shutil
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from policy_engine.compiler import compile_files
from policy_engine.config import EngineConfig
from policy_engine.conformance.report import CheckResult, Report
from policy_engine.errors import ErrorCode, PolicyEngineError
from policy_engine.executor import ExecContext, ExecutorCapabilities
from policy_engine.hookspecs import hookimpl
from policy_engine.model import (
    Capability,
    ExecResult,
    FsCapability,
    FsReadOp,
    Grant,
    Manifest,
    OpKind,
    ProcCapability,
    ProcExecOp,
    Usage,
)
from policy_engine.orchestration import MemoryRevocationList
from policy_engine.orchestrator import Orchestrator, RunOutcome
from policy_engine.plugin_manager import PluginManager

SINK_CHECKS: tuple[tuple[str, str], ...] = (
    ("sink.readable", "the sink exposes what it stored (read_records)"),
    ("sink.complete", "allowed, denied, failed and refused calls each stored one begin and one "
                      "end, agreeing with the result"),
    ("sink.no-raw-content", "no planted secret (file content, argv, stdin, request context) "
                            "appears anywhere the sink stored"),
    ("sink.durable", "records survive close() and a fresh instance from the plugin"),
)
_TITLES = dict(SINK_CHECKS)
_EXECUTOR = "conformance-sink-kit"


class _KitExecutor:
    """Reads a file and returns its digest (a missing file is TOOL.EXECUTION_FAILED); a
    ``proc.exec`` is *not* run: it reports exit code 0, so the sink sees a process record.
    """

    name = _EXECUTOR
    capabilities = ExecutorCapabilities(op_kinds=frozenset({OpKind.FS_READ, OpKind.PROC_EXEC}),
                                        bind_mounts=True, readonly_rootfs=True,
                                        resource_limits=True, env_filtering=True)

    def execute(self, ctx: ExecContext, op: Any) -> ExecResult:
        if isinstance(op, ProcExecOp):
            return ExecResult(ok=True, out={"exit_code": 0}, used=Usage())
        try:
            data = Path(op.path).read_bytes()
        except OSError as exc:
            raise PolicyEngineError(ErrorCode.EXECUTION_FAILED,
                                    f"cannot read: {exc.strerror}") from None
        return ExecResult(ok=True, out={"sha256": hashlib.sha256(data).hexdigest(),
                                        "size": len(data)}, used=Usage(bytes_in=len(data)))

    def close(self) -> None:
        """Nothing held."""


class _KitPlugin:
    @hookimpl
    def policy_engine_executors(self, config: EngineConfig) -> list[_KitExecutor]:
        return [_KitExecutor()]


def _result(cid: str, problems: Sequence[str]) -> CheckResult:
    return CheckResult(cid, _TITLES[cid], "fail" if problems else "pass", tuple(problems))


def _components(extra: Sequence[object]) -> PluginManager:
    manager = PluginManager.default()
    for i, plugin in enumerate(extra):
        manager.register(plugin, f"policy_engine_sink_kit_extra_{i}")
    manager.register(_KitPlugin(), "policy_engine_sink_kit_executor")
    return manager


def _calls(orch: Orchestrator, root: Path, secret: str) -> list[RunOutcome]:
    data = root / "data"
    data.mkdir(parents=True)
    (data / "hello.txt").write_text(f"content secret={secret}\n", encoding="utf-8")
    cap = FsCapability(kind="fs.read", paths=(f"{data}/**",))
    echo = ProcCapability(tool="/bin/echo")
    manifest = Manifest(name="sink-kit", version="1", permissions=(cap, echo))
    expires = int(time.time() * 1000) + 3_600_000

    def grant(call: str, caps: tuple[Capability, ...] = (cap, echo),
              exp: int = expires) -> Grant:
        return Grant(tenant="conformance", subject_id="agent:sink-kit", tool_name="sink-kit",
                     call_id=f"{call}-{secret[:6]}", capabilities=caps, expires_at=exp)

    context = {"conformance_token": secret}
    return [
        orch.run(grant("allowed"), manifest, FsReadOp(path=str(data / "hello.txt")),
                 context=context),
        orch.run(grant("denied", ()), manifest, FsReadOp(path=str(data / "hello.txt")),
                 context=context),
        orch.run(grant("failed"), manifest, FsReadOp(path=str(data / "missing.txt")),
                 context=context),
        orch.run(grant("process"), manifest,
                 ProcExecOp(tool="/bin/echo", args=("--token", secret),
                            env={}, stdin_b64=base64.b64encode(secret.encode()).decode()),
                 context=context),
        orch.run(grant("expired", exp=1), manifest, FsReadOp(path=str(data / "hello.txt")),
                 context=context),
    ]


def _read(sink: object) -> tuple[list[Mapping[str, Any]], list[str]] | None:
    reader = getattr(sink, "read_records", None)
    if not callable(reader):
        return None
    records: list[Mapping[str, Any]] = [dict(r) for r in reader()]
    texter = getattr(sink, "stored_text", None)
    texts = [str(t) for t in texter()] if callable(texter) else [json.dumps(r) for r in records]
    return records, texts


def _complete(records: list[Mapping[str, Any]], outcomes: list[RunOutcome]) -> list[str]:
    problems = []
    for outcome in outcomes:
        mine = [r for r in records if r.get("envelope_id") == outcome.envelope_id]
        types = [r.get("type") for r in mine]
        label = f"call {outcome.begin.call_id} ({outcome.end.status})"
        if types != ["begin", "end"]:
            problems.append(f"{label}: stored records {types}; one begin then one end required")
            continue
        end = mine[1]
        if end.get("status") != outcome.end.status or \
                end.get("error_code") != outcome.result.code:
            problems.append(f"{label}: stored end says {end.get('status')}/"
                            f"{end.get('error_code')}, the call ended "
                            f"{outcome.end.status}/{outcome.result.code}")
    return problems


def run_sink_suite(name: str, *, options: Mapping[str, Mapping[str, Any]] | None = None,
                   extra_plugins: Sequence[object] = ()) -> Report:
    """Check the installed evidence sink ``name``; a report like the executor suite's."""
    base = Path(tempfile.mkdtemp(prefix="policy-engine-sink-kit-"))
    secret = "pe-sink-secret-" + secrets.token_hex(12)
    try:
        (base / "p.sbpolicy").write_text(
            f'policy "conformance/sinks" version "1.0.0"\n'
            f'permit fs.read paths ["{base}/root/**"]\n'
            'permit proc.exec tool "/bin/echo"\n', encoding="utf-8")
        policyset = compile_files([base / "p.sbpolicy"])
        config = EngineConfig(state_dir=base / "state", evidence_sinks=(name,),
                              budget_meter="memory", revocation="memory",
                              backends={OpKind.FS_READ: _EXECUTOR, OpKind.PROC_EXEC: _EXECUTOR},
                              options=dict(options or {}))
        with Orchestrator(policyset, config=config,
                          plugins=_components(extra_plugins),
                          revocations=MemoryRevocationList()) as orch:
            outcomes = _calls(orch, base / "root", secret)
            sink = orch.components.sinks[name]
            first = _read(sink)
        report = Report(executor=f"sink:{name}", capabilities={}, results=[])
        if first is None:
            report.results.append(_result("sink.readable", [
                f"`{name}` has no read_records(); the kit cannot see what it stored "
                "(see docs/conformance.md, evidence sinks)"]))
            return report
        report.results.append(_result("sink.readable", []))
        records, texts = first
        report.results.append(_result("sink.complete", _complete(records, outcomes)))
        leaks = [t[max(0, t.index(secret) - 60):t.index(secret)] for t in texts if secret in t]
        report.results.append(_result("sink.no-raw-content", [
            f"a planted secret is stored, after `…{leak}`; store digests and redacted forms "
            "only" for leak in leaks[:3]]))
        reopened = PluginManager.default()
        for i, plugin in enumerate(extra_plugins):
            reopened.register(plugin, f"policy_engine_sink_kit_extra_{i}")
        comps = reopened.components(config)
        try:
            again = _read(comps.sinks[name]) if name in comps.sinks else None
        finally:
            comps.close()
        lost = [] if again is not None and len(again[0]) >= len(records) else [
            f"a fresh `{name}` instance reads {len(again[0]) if again else 0} records back, "
            f"{len(records)} were stored"]
        report.results.append(_result("sink.durable", lost))
        return report
    finally:
        shutil.rmtree(base, ignore_errors=True)
