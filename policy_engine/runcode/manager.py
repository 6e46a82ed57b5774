"""SandboxManager (seed 001 §4.1, §6): run_code = risk hint → sandbox choice → one guarded op."""

from __future__ import annotations

import re
import threading
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from policy_engine.config import EngineConfig
from policy_engine.confirm.broker import ConsentBroker, consent_notes
from policy_engine.graph.policyset import PolicySet
from policy_engine.model import (
    Grant,
    Limits,
    Manifest,
    NetworkMode,
    OpKind,
    ProcExecOp,
    Settings,
)
from policy_engine.orchestrator import Orchestrator, RunOutcome
from policy_engine.runcode.risk import (
    Language,
    RiskAssessment,
    SecurityMode,
    UnifiedRiskPolicy,
)

_SESSION = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")
CONTAINER_WORK = "/workspace/work"  # the docker executor's working directory (seed 002 §4)
_TOOLS = {"python": ("python3", "-c"), "shell": ("bash", "-lc")}
_GRANT_TTL_MS = 10 * 60 * 1000


@dataclass(frozen=True, slots=True)
class RunCodeResult:
    """What run_code answers (seed 001 §6); ``exec_id`` is the evidence envelope id."""

    success: bool
    stdout: str
    stderr: str
    exit_code: int | None
    sandbox_type: str
    risk: RiskAssessment
    error: str | None
    error_code: str | None
    exec_id: str

    def to_json(self) -> dict[str, Any]:
        return {"success": self.success, "stdout": self.stdout, "stderr": self.stderr,
                "exit_code": self.exit_code, "sandbox_type": self.sandbox_type,
                "risk": self.risk.to_json(), "error": self.error,
                "error_code": self.error_code, "exec_id": self.exec_id}


def run_code_manifest(workspace_root: Path) -> Manifest:
    """The built-in manifest of run_code: python3 and bash over the session workspaces (host
    paths for bubblewrap, the container's ``/workspace/work`` for docker)."""
    paths = [f"{workspace_root}/**", f"{CONTAINER_WORK}/**"]
    return Manifest.model_validate({
        "name": "run_code", "version": "1.0.0",
        "description": "seed 001 run_code: python or shell code in a session workspace",
        "permissions": [{"kind": "proc.exec", "tool": "python3"},
                        {"kind": "proc.exec", "tool": "bash"},
                        {"kind": "fs.read", "paths": paths},
                        {"kind": "fs.write", "paths": paths}],
        "side_effects": ["Process", "Write"], "safety_class": "Medium", "network": "off"})


@dataclass
class OrchestratorPool:
    """One orchestrator per backend proc.exec is pinned to, built on first use and shared."""

    policyset: PolicySet
    config: EngineConfig
    _made: dict[str, Orchestrator] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def get(self, backend: str) -> Orchestrator:
        with self._lock:
            if backend not in self._made:
                pinned = replace(self.config, backends={**self.config.backends,
                                                        OpKind.PROC_EXEC: backend})
                self._made[backend] = Orchestrator(self.policyset, config=pinned)
            return self._made[backend]

    def orchestrators(self) -> list[Orchestrator]:
        """The orchestrators built so far (their metrics are merged on ``/metrics``)."""
        with self._lock:
            return list(self._made.values())

    def swap(self, policyset: PolicySet) -> None:
        """Every orchestrator of the pool, and those made later, run ``policyset`` (hot
        reload; calls already running finish under the old one)."""
        with self._lock:
            self.policyset = policyset
            for orch in self._made.values():
                orch.swap_policy(policyset)

    def close(self) -> None:
        with self._lock:
            for orch in self._made.values():
                orch.close()
            self._made.clear()


class SandboxManager:
    """The one entry point for running code for a session.

    :param security_mode: which sandbox the risk hint requires (``UnifiedRiskPolicy``); the
        policy still decides the op either way.
    :param tenant, subject: who the grant is for (``subject`` defaults to ``session:<id>``).
    :param pool: orchestrators to share between managers (one is made, and closed, otherwise).
    :param broker: asks a confirmation service when consent is needed and missing (none:
        such a call is denied).
    :raises ValueError: ``session_id`` is not a safe name (it names a directory).
    """

    def __init__(self, session_id: str, *, policyset: PolicySet,
                 config: EngineConfig | None = None,
                 security_mode: SecurityMode = SecurityMode.STRICT, tenant: str = "local",
                 subject: str | None = None, workspace_root: Path | None = None,
                 manifest: Manifest | None = None, pool: OrchestratorPool | None = None,
                 broker: ConsentBroker | None = None) -> None:
        if not _SESSION.fullmatch(session_id):
            raise ValueError(f"session id `{session_id}` must match {_SESSION.pattern}")
        config = config or EngineConfig()
        self.session_id = session_id
        self.security_mode = SecurityMode(security_mode)
        self.tenant = tenant
        self.subject = subject or f"session:{session_id}"
        self.root = (workspace_root or config.state_dir / "run_code").absolute()
        self.manifest = manifest or run_code_manifest(self.root)
        self._own_pool = pool is None
        self.pool = pool or OrchestratorPool(policyset, config)
        self.work = self.root / "tenants" / tenant / "sessions" / session_id / "work"
        self.broker = broker

    def close(self) -> None:
        if self._own_pool:
            self.pool.close()

    def __enter__(self) -> SandboxManager:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def run_code(self, code: str, language: Language = "python",
                 timeout: float = 30.0) -> RunCodeResult:
        """Assess, pick the sandbox the mode requires, run the code as one guarded op."""
        if language not in _TOOLS:
            raise ValueError("language must be `python` or `shell`")
        risk = UnifiedRiskPolicy.assess(code, language)
        backend = UnifiedRiskPolicy.required_sandbox(risk, self.security_mode)
        tool, flag = _TOOLS[language]
        if backend == "docker":
            cwd, root = CONTAINER_WORK, "/workspace"
        else:
            self.work.mkdir(parents=True, exist_ok=True)
            cwd, root = str(self.work), str(self.root)
        now = int(time.time() * 1000)
        grant = Grant.model_validate({
            "tenant": self.tenant, "subject_id": self.subject, "tool_name": self.manifest.name,
            "call_id": f"run_code-{self.session_id}-{now}", "expires_at": now + _GRANT_TTL_MS,
            "capabilities": [{"kind": "proc.exec", "tool": tool},
                             {"kind": "fs.read", "paths": [f"{cwd}/**"]},
                             {"kind": "fs.write", "paths": [f"{cwd}/**"]}]})
        timeout_ms = max(1, int(timeout * 1000))
        settings = Settings(network=NetworkMode.OFF, root_fs=root,
                            limits=Limits(timeout_ms=timeout_ms, max_stdout_bytes=1 << 20,
                                          max_stderr_bytes=1 << 20))
        op = ProcExecOp(tool=tool, args=(flag, code), cwd=cwd, timeout_ms=timeout_ms)
        asked = None
        if self.broker is not None:  # consent needed and missing: ask the approver
            grant, asked = self.broker.prepare(grant, self.manifest, op, settings=settings)
        notes: dict[str, Any] = {"risk": risk.to_json(), **(consent_notes(asked) or {})}
        outcome = self.pool.get(backend).run(grant, self.manifest, op, settings=settings,
                                             annotations=notes)
        if self.broker is not None:
            self.broker.record(asked, outcome.envelope_id)
        return _result(outcome, backend, risk)


def _result(outcome: RunOutcome, backend: str, risk: RiskAssessment) -> RunCodeResult:
    res = outcome.result
    out = res.out if res.ok else {}
    exit_code = out.get("exit_code") if isinstance(out.get("exit_code"), int) else None
    error = None if res.ok else res.message
    if res.ok and exit_code != 0:
        error = f"exit code {exit_code}"
    return RunCodeResult(
        success=res.ok and exit_code == 0, stdout=str(out.get("stdout", "")),
        stderr=str(out.get("stderr", "")), exit_code=exit_code,
        sandbox_type=outcome.end.sandbox_backend or backend, risk=risk, error=error,
        error_code=None if res.ok else res.code, exec_id=outcome.envelope_id)
