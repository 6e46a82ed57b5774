"""`POST /sandbox/execs`: an exec is one guarded proc.exec op through the orchestrator."""

from __future__ import annotations

import base64
import binascii
import json
import time
import uuid
from typing import Any

from policy_engine.gateway.call import Call, Gateway
from policy_engine.gateway.outcome import Called
from policy_engine.model import Grant, ProcExecOp
from policy_engine.refusal import code_refusal
from policy_engine.service.config import ServiceConfig
from policy_engine.service.errors import service_error
from policy_engine.service.execstore import ExecStore
from policy_engine.service.models import (
    Artifact,
    ExecBody,
    ExecRecord,
    PythonCodeExec,
    ShellExec,
)
from policy_engine.service.slots import ExecSlots
from policy_engine.service.workspace import (
    SERVICE_FILES,
    ProjectDirs,
    artifact_entry,
    artifact_os_name,
    normalize_input_path,
    scan_artifacts,
    write_service_file,
)
from policy_engine.tokens import Principal

_GRANT_TTL_MS = 15 * 60 * 1000


def _decode_inputs(body: ExecBody, cap: int) -> list[tuple[str, bytes]]:
    files: list[tuple[str, bytes]] = []
    total = 0
    seen: set[str] = set()
    for item in body.inputs:
        rel = normalize_input_path(item.path)
        if rel in seen:
            # well-formed one by one (the schema cannot say "distinct after normalising"):
            # a conflict between two inputs, not a malformed request
            raise service_error("SERVICE.CONFLICT", f"input `{rel}` is given twice")
        seen.add(rel)
        if item.encoding == "base64":
            try:
                data = base64.b64decode(item.content, validate=True)
            except (binascii.Error, ValueError):
                raise service_error("SERVICE.BAD_REQUEST",
                                    f"input `{rel}` is not valid base64") from None
        else:
            data = item.content.encode("utf-8")
        total += len(data)
        if total > cap:
            raise service_error("SERVICE.PAYLOAD_TOO_LARGE",
                                f"inputs exceed {cap} bytes in total")
        files.append((rel, data))
    return files


def _command(body: ExecBody, dirs: ProjectDirs, inputs: set[str]) -> tuple[str, tuple[str, ...]]:
    """seed 002 §5.1: shell → ``bash -lc <script>``; python → ``python3 -c <code>`` or a file
    of ``inputs/``."""
    spec = body.exec
    if isinstance(spec, ShellExec):
        return "bash", ("-lc", spec.script)
    if isinstance(spec, PythonCodeExec):
        return "python3", ("-c", spec.script)
    rel = normalize_input_path(spec.file)
    if rel not in inputs and not (dirs.inputs / rel).is_file():
        raise service_error("SERVICE.NOT_FOUND", f"`{rel}` is not a file of inputs/")
    return "python3", (str(dirs.inputs / rel),)


class ExecRunner:
    """Runs execs under a concurrency cap and records them; decides nothing itself."""

    def __init__(self, config: ServiceConfig, gateway: Gateway, store: ExecStore) -> None:
        self.config = config
        self.gateway = gateway
        self.store = store
        # shared with run_code (both start sandboxed processes) and with every worker process
        self.slots = ExecSlots(config.engine.state_dir / "exec-slots",
                               config.max_concurrent_execs)

    def run(self, who: Principal, body: ExecBody) -> ExecRecord:
        exec_id = uuid.uuid4().hex
        files = _decode_inputs(body, self.config.max_input_bytes)
        dirs = ProjectDirs(self.config.workspace_root, who.tenant, body.project_id)
        tool, args = _command(body, dirs, {rel for rel, _ in files})
        out_dir = dirs.create(exec_id)
        for rel, data in files:
            dirs.write_input(rel, data)
        manifest = self.config.exec_tool
        now = int(time.time() * 1000)
        binary = {"kind": "proc.exec", "tool": tool}
        grant = Grant.model_validate({
            "tenant": who.tenant, "subject_id": who.subject, "tool_name": manifest.name,
            "call_id": exec_id, "expires_at": now + _GRANT_TTL_MS,
            "capabilities": [
                binary,
                {"kind": "fs.read", "paths": [f"{dirs.base}/**"]},
                {"kind": "fs.list", "paths": [f"{dirs.base}/**"]},
                {"kind": "fs.write", "paths": [f"{dirs.work}/**", f"{out_dir}/**"]}]})
        op = ProcExecOp(tool=tool, args=args, cwd=str(dirs.work),
                        timeout_ms=body.exec.timeout_ms)
        started = time.perf_counter()
        settings = self.config.settings_for_exec()
        call = Call(grant, manifest, op, settings=settings, overrides=body.policy_overrides,
                    identity=(who.tenant, who.subject))
        # the slot is held while the approver is asked too: a call waiting for consent is
        # one of the execs running (--max-concurrent-execs), never an unbounded queue
        with self.slots.hold():
            called = self.gateway.run(call)
        record, artifacts = self._finish(who, body, exec_id, tool, args, dirs, called,
                                         now, started)
        self.store.add(who.tenant, who.subject, record, artifacts)
        return record

    def _finish(self, who: Principal, body: ExecBody, exec_id: str, tool: str,
                args: tuple[str, ...], dirs: ProjectDirs, called: Called, now: int,
                started: float) -> tuple[ExecRecord, list[Artifact]]:
        out_dir = dirs.artifacts / exec_id
        outcome = called.outcome
        res = outcome.result
        refusal = called.refusal.to_json() if called.refusal is not None else None
        out: dict[str, Any] = dict(res.out) if res.ok else {}
        # the service's own files are written below, replacing whatever the exec planted
        scan = scan_artifacts(out_dir, self.config.max_artifacts, skip=SERVICE_FILES)
        produced, total = scan.found, scan.total
        error_code, error_reason = (None, None) if res.ok else (res.code, res.message)
        if total > self.config.max_artifacts_bytes:
            # seed 002 §5.1: only artifacts/<exec_id>/ counts; over the cap nothing is kept
            for item in produced:
                (out_dir / artifact_os_name(str(item["path"]), bool(item["not_utf8"]))).unlink(
                    missing_ok=True)
            produced = []
            error_code = "QUOTA.BUDGET_EXCEEDED"
            error_reason = (f"budget exceeded: artifacts total {total} bytes over the cap of "
                            f"{self.config.max_artifacts_bytes}")
            refusal = code_refusal(error_code, 429, error_reason, "limits",
                                   envelope_id=outcome.envelope_id).to_json()
        streams = {name: str(out.get(key, "")).encode()
                   for name, key in (("stdout.txt", "stdout"), ("stderr.txt", "stderr"))}
        for name, data in streams.items():
            write_service_file(out_dir, name, data)
        exit_code = out.get("exit_code") if isinstance(out.get("exit_code"), int) else None
        if outcome.end.status == "denied":
            status = "denied"
        elif not res.ok:
            status = "error"
        else:
            status = "ok" if exit_code == 0 and error_code is None else "failed"
        profile = outcome.profile
        snapshot = {"profile_hash": profile.profile_hash if profile else None,
                    "policy_version_hash": outcome.begin.policy_version_hash,
                    "rule": outcome.decision.rule.id if outcome.decision.rule else None,
                    "limits": out.get("limits"), "network": out.get("network"),
                    "backend": outcome.end.sandbox_backend}
        record = ExecRecord(
            exec_id=exec_id, project_id=body.project_id, task_id=body.task_id,
            conversation_id=body.conversation_id, skill_id=body.skill_id, cmd=tool,
            args=list(args), cwd=str(dirs.work), env_keys=[], policy_snapshot=snapshot,
            status=status, exit_code=exit_code, error_code=error_code,
            error_reason=error_reason, started_at=now, ended_at=int(time.time() * 1000),
            duration_ms=round((time.perf_counter() - started) * 1000, 3),
            artifacts_path=str(out_dir),
            stdout_truncated=bool(out.get("stdout_truncated", False)),
            stderr_truncated=bool(out.get("stderr_truncated", False)),
            envelope_id=outcome.envelope_id, refusal=refusal,
            artifacts_truncated=scan.truncated)
        listed = produced + [artifact_entry(name, data) for name, data in streams.items()]
        listed.sort(key=lambda a: str(a["path"]))
        written = {"manifest.json": json.dumps(
            {"exec_id": exec_id, "artifacts": listed, "truncated": scan.truncated},
            indent=2).encode()}
        mounts = {"inputs": f"{dirs.inputs}:ro", "work": f"{dirs.work}:rw",
                  "artifacts": f"{out_dir}:rw"}
        written["meta.json"] = json.dumps(
            {**record.model_dump(), "mounts": mounts}, indent=2).encode()
        for name, data in written.items():
            write_service_file(out_dir, name, data)
        final = listed + [artifact_entry(name, data) for name, data in written.items()]
        final.sort(key=lambda a: str(a["path"]))
        artifacts = [Artifact.model_validate(a) for a in final]
        return record, artifacts
