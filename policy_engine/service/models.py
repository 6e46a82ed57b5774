"""Request and response bodies of the HTTP API (pydantic; they make the OpenAPI document)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from policy_engine.model import ExecOp, Grant, Manifest, Overrides, Usage

# ids the service hands out; path parameters must match exactly (no traversal)
EXEC_ID = r"^[0-9a-f]{32}$"
PROJECT_ID = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$"
_BASE64 = r"^(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?$"
# a relative path: no leading `/`, no `..` segment, not only `.`/`/`, no NUL or backslash
# (what the service accepts; `x/./y` and `x//y` are normalized to `x/y`)
_REL_PATH = r"^(?!/)(?!.*(^|/)\.\.(/|$))(?!(\.?/)*\.?$)[^\x00\\]+$"


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
    pointer: str | None = Field(default=None, description="the JSON pointer of the input a "
                                "refused skill invocation broke (`/inputs/path`)")


class ConsentBody(_Body):
    """What consent the call met (docs/consent.md)."""

    asked: bool
    answer: Literal["approved", "refused", "timed_out", "no_service"] | None
    by: str | None = Field(description="`<mode>:<approver>` who answered")
    at: int | None = Field(description="when it was answered, ms since the epoch")


class RuleBody(_Body):
    id: str
    file: str | None = None
    line: int | None = None
    column: int | None = None


class RefusalBody(_Body):
    """The one refusal document every face answers with (docs/refusal.schema.json)."""

    code: str = Field(description="stable error code (docs/error-codes.md)")
    http_status: int
    retryable: bool
    message: str = Field(description="public, redacted")
    refused_by: Literal["policy", "manifest", "grant", "limits", "consent", "backend",
                        "service"]
    rule: RuleBody | None = Field(description="the rule that decided, when one did")
    consent: ConsentBody
    envelope_id: str | None = Field(description="the evidence envelope recording the call")
    location: str | None = Field(default=None,
                                 description="where malformed input broke (path or pointer)")


class ErrorBody(_Body):
    error: ErrorDetail
    refusal: RefusalBody | None = None
    envelope_id: str | None = Field(default=None, description="the evidence envelope of a "
                                    "refused skill invocation (its 422 names it)")


class TextInput(_Body):
    """A UTF-8 text file written under the project's ``inputs/`` (seed 002 §5.1)."""

    # the pattern is documented, not enforced by the model: the service answers a path that
    # leaves inputs/ with 400 SERVICE.BAD_REQUEST (seed 002 §5.1), not a generic 422
    path: str = Field(min_length=1, max_length=255, description="relative to inputs/",
                      json_schema_extra={"pattern": _REL_PATH})
    content: str = ""
    encoding: Literal["utf-8"] = "utf-8"


class Base64Input(_Body):
    """A binary file written under the project's ``inputs/``, base64-encoded (RFC 4648)."""

    path: str = Field(min_length=1, max_length=255, description="relative to inputs/",
                      json_schema_extra={"pattern": _REL_PATH})
    content: str = Field(pattern=_BASE64)
    encoding: Literal["base64"]


InputFile = TextInput | Base64Input


class ShellExec(_Body):
    """``bash -lc <script>``."""

    kind: Literal["shell"]
    script: str = Field(max_length=262_144)
    timeout_ms: int | None = Field(default=None, ge=1, le=600_000)


class PythonCodeExec(_Body):
    """``python3 -c <script>``."""

    kind: Literal["python"]
    script: str = Field(max_length=262_144)
    timeout_ms: int | None = Field(default=None, ge=1, le=600_000)


class PythonFileExec(_Body):
    """``python3 <inputs>/<file>``: a file of the project's ``inputs/``."""

    kind: Literal["python"]
    file: str = Field(min_length=1, max_length=255, json_schema_extra={"pattern": _REL_PATH})
    timeout_ms: int | None = Field(default=None, ge=1, le=600_000)


ExecSpec = ShellExec | PythonCodeExec | PythonFileExec


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
    refusal: RefusalBody | None = Field(default=None, description="when denied or failed")
    artifacts_truncated: bool = Field(
        default=False, description="more artifacts than --max-artifacts: the rest are unlisted")


class ExecList(_Body):
    execs: list[ExecRecord]


class Artifact(_Body):
    path: str
    size: int
    sha256: str
    # true when the name on disk is not UTF-8: ``path`` is then percent-encoded (each stray
    # byte and each ``%``), see docs/service.md "Artifact names"
    not_utf8: bool = False


class ArtifactList(_Body):
    exec_id: str
    artifacts: list[Artifact]
    truncated: bool = Field(
        default=False, description="the exec left more than --max-artifacts: the rest are unlisted")


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


class InterpreterNote(_Body):
    """A stateful call's interpreter (docs/sessions.md "Stateful Python")."""

    generation: int = Field(description="the session's interpreters started so far")
    fresh: bool = Field(description="this call started the interpreter")
    state_lost: str | None = Field(default=None, description="why the previous interpreter "
                                   "ended (timeout, cancel, crash, restart, policy change)")
    crashed: str | None = Field(default=None, description="this call ended the interpreter")


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
    refusal: RefusalBody | None = Field(default=None, description="when refused or failed")
    interpreter: InterpreterNote | None = Field(default=None, description="stateful calls")


class PolicyHealth(_Body):
    """The policy in force and hot reload's state."""

    name: str
    version: str
    version_hash: str
    reload: bool = Field(description="whether the policy files are watched (--reload-interval)")
    reloads: int = Field(description="policies swapped in since start-up")
    reload_error: str | None = Field(
        description="why the last changed bundle was not loaded (FILE:LINE:COL: ID message); "
        "the previous policy stays in force")


class Health(_Body):
    status: Literal["ok", "degraded"]
    policy: PolicyHealth
    runtime_mode: str
    workspace_root: str
    workspace_writable: bool
    docker_cli_path: str | None
    docker_version: str | None
    docker_context: str | None
    backends: dict[str, str]
