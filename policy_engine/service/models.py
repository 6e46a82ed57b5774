"""Request and response bodies of the HTTP API (pydantic; they make the OpenAPI document)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from policy_engine.model import ExecOp, Grant, Manifest, Overrides, Usage

# ids the service hands out; path parameters must match exactly (no traversal)
EXEC_ID = r"^[0-9a-f]{32}$"
PROJECT_ID = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$"


class _Body(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class CallBody(_Body):
    """One op with its grant and manifest. The grant's tenant and subject must be the token's."""

    op: ExecOp
    grant: Grant
    manifest: Manifest | str = Field(
        description="the tool manifest, inline or the name of one the service was started with")
    overrides: Overrides | None = None
    context: dict[str, Any] = Field(default_factory=dict,
                                    description="extra CEL variables (tenant/subject are "
                                    "the token's and cannot be set)")


class DecideBody(CallBody):
    """`POST /v1/decide`: a dry run (the explain contract); nothing runs, nothing is consumed."""

    now_ms: int | None = Field(default=None, description="decision time, ms since epoch")
    budget_used: Usage | None = None


class ErrorDetail(_Body):
    code: str
    http_status: int
    retryable: bool = False
    message: str


class ErrorBody(_Body):
    error: ErrorDetail


class InputFile(_Body):
    """A file written under the project's ``inputs/`` before the exec (seed 002 §5.1)."""

    path: str = Field(min_length=1, max_length=255, description="relative to inputs/")
    content: str = Field(default="", description="UTF-8 text, or base64 with encoding=base64")
    encoding: Literal["utf-8", "base64"] = "utf-8"


class ExecSpec(_Body):
    """What to run: ``shell`` → ``bash -lc <script>``; ``python`` → ``python3 -c <code>`` or a
    file under ``inputs/``."""

    kind: Literal["shell", "python"]
    script: str | None = Field(default=None, max_length=262_144,
                               description="shell script (shell) or Python code (python)")
    file: str | None = Field(default=None, max_length=255,
                             description="python only: a file under inputs/ to run")
    timeout_ms: int | None = Field(default=None, ge=1, le=600_000)


class ExecBody(_Body):
    """`POST /sandbox/execs` (seed 002 §5)."""

    project_id: str = Field(pattern=PROJECT_ID)
    exec: ExecSpec
    inputs: list[InputFile] = Field(default_factory=list, max_length=256)
    skill_id: str | None = Field(default=None, max_length=128)
    task_id: str | None = Field(default=None, max_length=128)
    conversation_id: str | None = Field(default=None, max_length=128)
    policy_overrides: Overrides | None = None


class ExecRecord(_Body):
    """The ``sandbox_execs`` record of seed 002 §6 (env values are never stored)."""

    exec_id: str
    project_id: str
    task_id: str | None
    conversation_id: str | None
    skill_id: str | None
    cmd: str
    args: list[str]
    cwd: str
    env_keys: list[str]
    policy_snapshot: dict[str, Any]
    status: Literal["ok", "failed", "denied", "error"]
    exit_code: int | None
    error_code: str | None
    error_reason: str | None
    started_at: int
    ended_at: int
    duration_ms: float
    artifacts_path: str
    stdout_truncated: bool
    stderr_truncated: bool
    envelope_id: str


class ExecList(_Body):
    execs: list[ExecRecord]


class Artifact(_Body):
    path: str
    size: int
    sha256: str


class ArtifactList(_Body):
    exec_id: str
    artifacts: list[Artifact]


class RunCodeBody(_Body):
    """`POST /v1/run_code` (seed 001 §6): code for a session, run as the mode requires."""

    session_id: str = Field(pattern=PROJECT_ID)
    code: str = Field(max_length=262_144)
    language: Literal["python", "shell"] = "python"
    timeout_s: float = Field(default=30.0, gt=0, le=600)


class RiskBody(_Body):
    level: Literal["SAFE", "LOW", "MEDIUM", "HIGH", "CRITICAL"]
    patterns: list[str]
    language: str


class RunCodeResponse(_Body):
    success: bool
    stdout: str
    stderr: str
    exit_code: int | None
    sandbox_type: str
    risk: RiskBody
    error: str | None
    error_code: str | None
    exec_id: str = Field(description="the evidence envelope id of the run")


class Health(_Body):
    status: Literal["ok", "degraded"]
    runtime_mode: str
    workspace_root: str
    workspace_writable: bool
    docker_cli_path: str | None
    docker_version: str | None
    docker_context: str | None
    backends: dict[str, str]
