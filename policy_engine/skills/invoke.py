"""Invoke a skill: inputs checked against its schema, then one guarded op (grant ∩ compiled
tool manifest ∩ policy) that the gateway runs, with begin/end evidence."""

from __future__ import annotations

import posixpath
import time
import uuid
from dataclasses import dataclass
from typing import Any

from policy_engine.config import EngineConfig
from policy_engine.errors import BackendRefusal, ErrorCode, PolicyEngineError
from policy_engine.graph.policyset import PolicySet
from policy_engine.inputs.text import first_not_unicode
from policy_engine.model import (
    BrowserNavOp,
    FsReadOp,
    Grant,
    Manifest,
    NetHttpOp,
    NetworkMode,
    ProcExecOp,
    Settings,
)
from policy_engine.orchestrator import Orchestrator, RunOutcome
from policy_engine.runcode.manager import OrchestratorPool
from policy_engine.skills.check import pointer_of
from policy_engine.skills.model import CONTAINER_ROOT, Skill, placeholder
from policy_engine.skills.refusals import record_refusal
from policy_engine.skills.schemas import input_validator

_GRANT_TTL_MS = 15 * 60 * 1000
DEFAULT_IMAGE = "policy-engine/sandbox:1"  # the docker executor's default (docs/docker.md)


class InputError(Exception):
    """The inputs do not match the skill's ``interface.inputs``: where (JSON pointer) and why."""

    def __init__(self, pointer: str, message: str) -> None:
        super().__init__(f"{pointer or '/'}: {message}")
        self.pointer = pointer
        self.message = message
        self.envelope_id: str | None = None  # the evidence of the refusal, once recorded

    def public_message(self) -> str:
        return f"invalid input at `{self.pointer or '/'}`: {self.message}"


@dataclass(frozen=True, slots=True)
class InvokeResult:
    """What an invocation answers: the skill's output, or the refusal's stable code."""

    skill: str
    ok: bool
    output: dict[str, Any]
    code: str | None
    http_status: int
    message: str | None
    envelope_id: str
    refusal: dict[str, Any] | None = None  # the refusal document (policy_engine/refusal.py)

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {"skill": self.skill, "ok": self.ok, "output": self.output,
                                "envelope_id": self.envelope_id}
        if not self.ok:
            data["error"] = {"code": self.code, "http_status": self.http_status,
                             "retryable": bool(self.refusal and self.refusal["retryable"]),
                             "message": self.message}
            data["refusal"] = self.refusal
        return data


@dataclass(frozen=True, slots=True)
class SkillCall:
    """A skill invocation built and not yet run: the gateway runs it on ``orchestrator``."""

    grant: Grant
    manifest: Manifest
    op: Any
    settings: Settings
    orchestrator: Orchestrator


@dataclass(frozen=True, slots=True)
class SessionScope:
    """Where a skill invoked in a session runs: the session's directory is the skill's root
    (its ``work/`` is the session's workspace, ``$SESSION``), on the session's backend."""

    session_id: str
    work: str  # the session's workspace, host path (bound at its own path in a container)
    backend: str  # ``proc-bwrap`` or ``docker``, fixed at the session's creation

    @property
    def root(self) -> str:
        return posixpath.dirname(self.work)


def validate_inputs(skill: Skill, inputs: Any) -> None:
    """:raises InputError: at the first (shallowest) place ``inputs`` breaks the skill's
    ``interface.inputs``."""
    validate_against(skill.inputs_schema, inputs)


def validate_against(schema: dict[str, Any], inputs: Any) -> None:
    """:raises InputError: at the first (shallowest) place ``inputs`` breaks ``schema``.
    The message names the rule, never the offending value (it may be a secret)."""
    validator = input_validator(schema)
    try:
        errors = sorted(validator.iter_errors(inputs), key=lambda e: (len(e.absolute_path),
                                                                      list(map(str, e.path))))
    except RecursionError:  # `skills check` refuses reference loops; inputs nested too deep
        raise InputError("", "nested too deeply to check against the schema") from None
    if errors:
        first = errors[0]
        rule = first.validator
        expected = first.validator_value
        if rule == "required" or rule == "additionalProperties":
            why = first.message.split("'", 2)[:2]
            detail = f"{rule}: `{why[1]}`" if len(why) == 2 else str(rule)
        elif rule in ("type", "enum", "const", "minimum", "maximum", "minLength",
                      "maxLength", "pattern", "format"):
            detail = f"must satisfy {rule}={expected!r}"
        else:
            detail = f"must satisfy `{rule}`"
        raise InputError(pointer_of(first), detail[:200])
    where = first_not_unicode(inputs)
    if where is not None:
        # a lone UTF-16 surrogate (`"\ud800"` is valid JSON) is no text any op can carry: the
        # op's model refused it later as an unhandled 500, with the value in the server log
        raise InputError(where, "must be valid Unicode text (a lone surrogate is not)")


def refuse_input(orch: Orchestrator, exc: InputError, *, tenant: str, subject: str,
                 tool_name: str, arguments: Any) -> str:
    """Record the refusal of arguments that break a tool's schema; its envelope id."""
    err = PolicyEngineError(ErrorCode.SCHEMA_VALIDATION_FAILED, exc.public_message())
    return record_refusal(orch, tenant=tenant, subject=subject, tool_name=tool_name,
                          capability=f"tool:{tool_name}", arguments=arguments, err=err)


class SkillInvoker:
    """Builds skill calls for a tenant and subject; decides and runs nothing itself (the
    gateway runs them: policy_engine/gateway/skills.py).

    :param fs_root: the operator's ``root_fs``: where an ``fs`` skill's ``inputs/``,
        ``work/`` and ``artifacts/`` are (a ``docker`` skill's are the container's).
    :param pool: orchestrators pinned to a backend; ``docker`` skills run on ``docker``.
    """

    def __init__(self, skills: dict[str, Skill], policyset: PolicySet, config: EngineConfig,
                 *, fs_root: str, orchestrator: Orchestrator, pool: OrchestratorPool) -> None:
        self.skills = skills
        self.policyset = policyset
        self.config = config
        self.fs_root = fs_root
        self.orch = orchestrator
        self.pool = pool
        self.image = str(config.plugin_options("docker").get("image", DEFAULT_IMAGE))

    def prepare(self, skill: Skill, inputs: Any, *, tenant: str, subject: str,
                scope: SessionScope | None = None) -> SkillCall:
        """Validate the inputs and build the skill's one op (the gateway runs it).

        :param scope: the session the skill is invoked in: its paths are the session's, the
            policy's ``$SESSION`` is the session's workspace, a process runs on its backend.
        :raises InputError: the inputs break ``interface.inputs`` (nothing ran; recorded).
        :raises PolicyEngineError: no op can be built (e.g. another image; recorded);
            :class:`BackendRefusal` for a container skill in a session without a container.
        """
        try:
            validate_inputs(skill, inputs)
        except InputError as exc:
            exc.envelope_id = refuse_input(self.orch, exc, tenant=tenant, subject=subject,
                                           tool_name=skill.id, arguments=inputs)
            raise
        now = int(time.time() * 1000)
        root = scope.root if scope is not None else None
        manifest = skill.tool_manifest(self.fs_root, root)
        grant = Grant.model_validate({
            "tenant": tenant, "subject_id": subject, "tool_name": skill.id,
            "call_id": f"{skill.id}-{uuid.uuid4().hex}", "expires_at": now + _GRANT_TTL_MS,
            "capabilities": skill.capabilities(self.fs_root, root)})
        try:
            op, settings, orch = self._op(skill, inputs, scope)
        except PolicyEngineError as exc:  # no op to decide: recorded, then refused
            # the refusal names its evidence, as an input error's does
            exc.envelope_id = record_refusal(  # type: ignore[attr-defined]
                self.orch, tenant=tenant, subject=subject, tool_name=skill.id,
                capability=f"skill:{skill.id}", arguments=inputs, err=exc)
            raise
        return SkillCall(grant, manifest, op, settings, orch)

    @staticmethod
    def answer(skill: Skill, outcome: RunOutcome,
               refusal: dict[str, Any] | None) -> InvokeResult:
        """What the invocation answers: the declared outputs, or the refusal."""
        res = outcome.result
        if res.ok:
            declared = skill.outputs_schema.get("properties", {})
            output = {k: v for k, v in res.out.items() if k in declared}
            return InvokeResult(skill.id, True, output, None, 200, None, outcome.envelope_id)
        code = ErrorCode(res.code) if res.code else ErrorCode.UNKNOWN_INTERNAL
        status = PolicyEngineError(code, "").http_status
        return InvokeResult(skill.id, False, {}, code.value, status, res.message,
                            outcome.envelope_id, refusal)

    def _op(self, skill: Skill, inputs: dict[str, Any], scope: SessionScope | None
            ) -> tuple[Any, Settings, Orchestrator]:
        runtime = skill.doc["runtime"]
        # in a session: the session's directory, and `$SESSION` its workspace (the engine's
        # own value, as for the session's run_code, execs and files)
        root = scope.root if scope is not None else None
        session = scope.work if scope is not None else None
        if skill.kind == "docker":
            if scope is not None and scope.backend != "docker":
                # never run elsewhere than the container the skill declares; a session never
                # moves between backends (its files would not follow)
                raise BackendRefusal(ErrorCode.CAPABILITY_BLOCKED, f"skill `{skill.id}` runs "
                                     f"in a container; this session runs on {scope.backend}: "
                                     "create a session with backend `docker`")
            if runtime["image"] != self.image:
                # the executor runs one configured image: a skill asking for another is
                # refused rather than silently run elsewhere
                raise PolicyEngineError(ErrorCode.CAPABILITY_BLOCKED, f"skill `{skill.id}` "
                                        f"needs image `{runtime['image']}`, the docker "
                                        f"executor runs `{self.image}`")
            entry = list(runtime["entrypoint"])
            args = [*entry[1:]]
            for arg in runtime.get("args", []):
                name = placeholder(arg)
                args.append(str(inputs[name]) if name is not None else arg)
            timeout = inputs.get("timeout_ms") if "timeout_ms" in skill.inputs_schema.get(
                "properties", {}) else None
            op: Any = ProcExecOp(tool=entry[0], args=tuple(args),
                                 cwd=session or f"{CONTAINER_ROOT}/work", timeout_ms=timeout)
            settings = Settings(network=NetworkMode.OFF, root_fs=root or CONTAINER_ROOT,
                                session=session)
            return op, settings, self.pool.get("docker")
        fields = {f: inputs[name] for f, name in runtime["op"].items() if name in inputs}
        settings = Settings(root_fs=root or self.fs_root, session=session)
        if skill.kind == "http":
            op = NetHttpOp(url=fields["url"], method=fields.get("method", "GET"))
        elif skill.kind == "browser":
            op = BrowserNavOp(url=fields["url"], extract=fields.get("extract", "text"))
        else:
            # joined as text, never path-joined: an absolute or `..` path stays beneath the
            # root here and the guard decides the normalized result against the skill's paths
            op = FsReadOp(path=f"{root or skill.root(self.fs_root)}/{fields['path']}")
        return op, settings, self.orch
