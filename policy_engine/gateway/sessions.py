"""The Python face of run_code: ``SandboxManager`` runs a session's code through the gateway."""

from __future__ import annotations

from pathlib import Path

from policy_engine.config import EngineConfig
from policy_engine.confirm.broker import ConsentBroker
from policy_engine.confirm.services import ConfirmationService, DenyConfirmation
from policy_engine.gateway.call import Call, Gateway
from policy_engine.graph.policyset import PolicySet
from policy_engine.model import Manifest
from policy_engine.refusal import PolicyRefusal
from policy_engine.runcode.manager import (
    SESSION_ID,
    OrchestratorPool,
    RunCodeResult,
    plan_run_code,
    run_code_manifest,
    run_code_result,
)
from policy_engine.runcode.risk import Language, SecurityMode


class SandboxManager:
    """The one entry point for running code for a session (docs/python-api.md).

    :param security_mode: which sandbox the risk hint requires (``UnifiedRiskPolicy``); the
        policy still decides the op either way.
    :param tenant, subject: who the grant is for (``subject`` defaults to ``session:<id>``).
    :param pool: orchestrators to share between managers (one is made, and closed, otherwise).
    :param gateway: the running engine's gateway (the service passes its own); otherwise one
        asking ``confirmation`` (default ``deny``: a call needing consent is refused).
    :raises ValueError: ``session_id`` is not a safe name (it names a directory).
    """

    def __init__(self, session_id: str, *, policyset: PolicySet,
                 config: EngineConfig | None = None,
                 security_mode: SecurityMode = SecurityMode.STRICT, tenant: str = "local",
                 subject: str | None = None, workspace_root: Path | None = None,
                 manifest: Manifest | None = None, pool: OrchestratorPool | None = None,
                 gateway: Gateway | None = None,
                 confirmation: ConfirmationService | None = None) -> None:
        if not SESSION_ID.fullmatch(session_id):
            raise ValueError(f"session id `{session_id}` must match {SESSION_ID.pattern}")
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
        self.gateway = gateway
        self.broker = gateway.broker if gateway is not None else ConsentBroker(
            confirmation or DenyConfirmation(), config.state_dir / "consent.jsonl")

    def close(self) -> None:
        if self._own_pool:
            self.pool.close()

    def __enter__(self) -> SandboxManager:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def run_code(self, code: str, language: Language = "python", timeout: float = 30.0, *,
                 check: bool = False) -> RunCodeResult:
        """Assess, pick the sandbox the mode requires, run the code as one guarded call.

        :param check: raise :class:`~policy_engine.refusal.PolicyRefusal` when the call is
            refused or fails, instead of answering ``success=False`` with ``refusal`` set.
        :raises ValueError: ``language`` is not ``python`` or ``shell``.
        """
        plan = plan_run_code(code, language, timeout, session_id=self.session_id,
                             tenant=self.tenant, subject=self.subject, manifest=self.manifest,
                             security_mode=self.security_mode, work=self.work, root=self.root)
        orch = self.pool.get(plan.backend)
        gateway = self.gateway or Gateway(orch, self.broker)
        called = gateway.run(Call(plan.grant, self.manifest, plan.op, settings=plan.settings,
                                  annotations={"risk": plan.risk.to_json()}),
                             orchestrator=orch)
        if check and called.refusal is not None:
            raise PolicyRefusal(called.refusal)
        return run_code_result(called.outcome, plan.backend, plan.risk,
                               called.refusal.to_json() if called.refusal else None)
