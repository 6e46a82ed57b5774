"""run_code's parts (seed 001 §4.1, §6): risk hint → sandbox choice → one op; the pool of
orchestrators pinned to a backend. The session face (``SandboxManager``) runs the op through
the gateway (policy_engine/gateway/sessions.py)."""

from __future__ import annotations

import re
import threading
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from policy_engine.config import EngineConfig
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
from policy_engine.orchestrator import Orchestrator, PolicyHolder, RunOutcome
from policy_engine.runcode.risk import (
    Language,
    RiskAssessment,
    SecurityMode,
    UnifiedRiskPolicy,
)

SESSION_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")
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
    refusal: dict[str, Any] | None = None  # the refusal document when refused or failed
    interpreter: dict[str, Any] | None = None  # a stateful call's (session_interpreter.py)

    def to_json(self) -> dict[str, Any]:
        return {"success": self.success, "stdout": self.stdout, "stderr": self.stderr,
                "exit_code": self.exit_code, "sandbox_type": self.sandbox_type,
                "risk": self.risk.to_json(), "error": self.error,
                "error_code": self.error_code, "exec_id": self.exec_id,
                "refusal": self.refusal, "interpreter": self.interpreter}


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
    holder: PolicyHolder | None = None
    """The running engine's policy holder (``Orchestrator.holder``): the pinned orchestrators
    then decide with its builder and guard and follow its hot reload; ``None``: their own."""
    _made: dict[str, Orchestrator] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def get(self, backend: str) -> Orchestrator:
        with self._lock:
            if backend not in self._made:
                pinned = replace(self.config, backends={**self.config.backends,
                                                        OpKind.PROC_EXEC: backend})
                if self.holder is None:  # the first one's holder is every other one's
                    made = Orchestrator(self.policyset, config=pinned)
                    self.holder = made.holder
                else:
                    made = Orchestrator(self.holder.active[0], config=pinned,
                                        holder=self.holder)
                self._made[backend] = made
            return self._made[backend]

    def orchestrators(self) -> list[Orchestrator]:
        """The orchestrators built so far (their metrics are merged on ``/metrics``)."""
        with self._lock:
            return list(self._made.values())

    def swap(self, policyset: PolicySet) -> None:
        """Every orchestrator of the pool, and those made later, run ``policyset`` (hot
        reload; calls already running finish under the old one). With the running engine's
        holder this is not needed: its reload reaches the pool through the holder."""
        with self._lock:
            self.policyset = policyset
            made = next(iter(self._made.values()), None)
            if made is not None:
                made.swap_policy(policyset)  # the one holder every pinned orchestrator reads

    def close(self) -> None:
        with self._lock:
            for orch in self._made.values():
                orch.close()
            self._made.clear()


@dataclass(frozen=True, slots=True)
class RunCodePlan:
    """One run_code call, built and not yet run: the sandbox the risk hint requires and the
    guarded op (the gateway runs it, policy_engine/gateway/sessions.py)."""

    backend: str
    risk: RiskAssessment
    grant: Grant
    settings: Settings
    op: ProcExecOp


def plan_run_code(code: str, language: str, timeout: float, *, session_id: str, tenant: str,
                  subject: str, manifest: Manifest, security_mode: SecurityMode,
                  work: Path, root: Path, backend: str | None = None,
                  host_paths: bool = False) -> RunCodePlan:
    """Assess ``code``, pick the sandbox the mode requires (or run on ``backend``: a
    session's fixed one, whose runtime checks the hint) and build its one op.

    :param host_paths: docker too runs at ``work`` beneath ``root`` (a session: docker binds
        ``root`` at its own path, plugins/executor_docker/bound.py), not at the container's
        ``/workspace/work`` of the token's project.

    :raises ValueError: ``language`` is not ``python`` or ``shell``.
    """
    if language not in _TOOLS:
        raise ValueError("language must be `python` or `shell`")
    lang: Language = "python" if language == "python" else "shell"
    risk = UnifiedRiskPolicy.assess(code, lang)
    backend = backend or UnifiedRiskPolicy.required_sandbox(risk, security_mode)
    tool, flag = _TOOLS[language]
    if backend == "docker" and not host_paths:
        cwd, root_fs = CONTAINER_WORK, "/workspace"
    else:
        work.mkdir(parents=True, exist_ok=True)
        cwd, root_fs = str(work), str(root)
    now = int(time.time() * 1000)
    grant = Grant.model_validate({
        "tenant": tenant, "subject_id": subject, "tool_name": manifest.name,
        "call_id": f"run_code-{session_id}-{now}", "expires_at": now + _GRANT_TTL_MS,
        "capabilities": [{"kind": "proc.exec", "tool": tool},
                         {"kind": "fs.read", "paths": [f"{cwd}/**"]},
                         {"kind": "fs.write", "paths": [f"{cwd}/**"]}]})
    timeout_ms = max(1, int(timeout * 1000))
    # ``session``: the policy's ``$SESSION`` is this session's workspace, as the guard sees it
    settings = Settings(network=NetworkMode.OFF, root_fs=root_fs, session=cwd,
                        limits=Limits(timeout_ms=timeout_ms, max_stdout_bytes=1 << 20,
                                      max_stderr_bytes=1 << 20))
    op = ProcExecOp(tool=tool, args=(flag, code), cwd=cwd, timeout_ms=timeout_ms)
    return RunCodePlan(backend, risk, grant, settings, op)


def run_code_result(outcome: RunOutcome, backend: str, risk: RiskAssessment,
                    refusal: dict[str, Any] | None = None) -> RunCodeResult:
    """What run_code answers for ``outcome`` (``refusal``: the gateway's refusal document)."""
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
        error_code=None if res.ok else res.code, exec_id=outcome.envelope_id,
        refusal=refusal, interpreter=out.get("interpreter") if isinstance(
            out.get("interpreter"), dict) else None)
