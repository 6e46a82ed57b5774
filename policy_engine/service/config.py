"""What `policy-engine serve` is configured with: limits, the workspace and the exec defaults."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from policy_engine.config import EngineConfig
from policy_engine.confirm.services import ConfirmationService, DenyConfirmation
from policy_engine.graph.policyset import PolicySet
from policy_engine.model import Limits, Manifest, NetworkMode, Settings
from policy_engine.runcode.risk import SecurityMode
from policy_engine.skills.model import Skill

MiB = 1024 * 1024

# seed 002 §5.2: the system defaults of a sandbox exec (policy and manifest may only narrow)
EXEC_LIMITS = Limits(timeout_ms=60_000, max_stdout_bytes=MiB, max_stderr_bytes=MiB,
                     memory_bytes=1024 * MiB, cpu_cores=1.0, pids=256)
MAX_ARTIFACTS_BYTES = 50 * MiB
MAX_ARTIFACTS = 1000


def exec_manifest(workspace_root: Path) -> Manifest:
    """The built-in manifest of `POST /sandbox/execs`: bash and python over the workspace."""
    root = f"{workspace_root}/**"
    return Manifest.model_validate({
        "name": "sandbox.exec", "version": "1.0.0",
        "description": "seed 002 sandbox exec: bash -lc or python -c inside a project workspace",
        "permissions": [
            {"kind": "proc.exec", "tool": "bash"}, {"kind": "proc.exec", "tool": "python3"},
            {"kind": "fs.read", "paths": [root]}, {"kind": "fs.list", "paths": [root]},
            {"kind": "fs.write", "paths": [root]}],
        "side_effects": ["Process", "Write"], "safety_class": "Medium",
        "network": "off", "limits": EXEC_LIMITS.model_dump(exclude_none=True)})


@dataclass(frozen=True, slots=True)
class ServiceConfig:
    """Everything one service instance needs besides its tokens.

    :param manifests: tool manifests a request may name instead of sending one inline, by name.
    :param max_body_bytes: largest request body accepted (413 beyond).
    :param max_input_bytes: largest total size of the ``inputs[]`` of one exec.
    :param max_artifacts: files of one exec listed (and other entries looked at) before the
        listing stops, marked ``artifacts_truncated``.
    :param rate_per_minute: requests per tenant per minute, counted by the budget meter.
    :param allow_inline_manifests: accept a manifest in the request body; a manifest declares
        the side effects and safety class the consent rules read, so by default only the
        operator's (``manifests``) are used.
    :param skills: the skills of `GET /skills` and `POST /skills/{id}/invoke`, by id.
    :param op_settings: the operator settings layer of `/v1/decide` and `/v1/ops` (the same
        for both, so a dry run answers as the run does).
    :param policy_files: the entry files ``policyset`` was compiled from (hot reload watches
        them and their imports).
    :param reload_interval_s: how often hot reload polls the bundle; 0 turns it off.
    :param console: serve the console under ``/console/`` (docs/console.md).
    :param console_secure_cookies: mark the console's cookies ``Secure`` (behind TLS).
    """

    policyset: PolicySet
    engine: EngineConfig
    workspace_root: Path
    manifests: dict[str, Manifest] = field(default_factory=dict)
    max_body_bytes: int = 4 * MiB
    max_input_bytes: int = 2 * MiB
    rate_per_minute: int = 6000
    max_concurrent_execs: int = 2
    max_artifacts_bytes: int = MAX_ARTIFACTS_BYTES
    max_artifacts: int = MAX_ARTIFACTS
    exec_settings: Settings | None = None
    op_settings: Settings | None = None
    security_mode: SecurityMode = SecurityMode.STRICT
    confirmation: ConfirmationService = field(default_factory=DenyConfirmation)
    allow_inline_manifests: bool = False
    policy_files: tuple[Path, ...] = ()
    reload_interval_s: float = 0.0
    skills: dict[str, Skill] = field(default_factory=dict)
    console: bool = False
    console_secure_cookies: bool = False

    def settings_for_exec(self) -> Settings:
        """Operator settings of an exec: root_fs is the workspace, network none (seed 002).
        The exec defaults (``EXEC_LIMITS``) are not among them: settings wider than the
        policy's value are refused, so `defaults { timeout 30s }` refused every exec; they are
        the exec tool's manifest limits, which only narrow (``exec_manifest``)."""
        if self.exec_settings is not None:
            return self.exec_settings
        return Settings(network=NetworkMode.OFF, root_fs=str(self.workspace_root))

    @property
    def exec_tool(self) -> Manifest:
        return self.manifests.get("sandbox.exec") or exec_manifest(self.workspace_root)
