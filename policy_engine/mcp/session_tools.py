"""Sessions as MCP tools: lifecycle, run_code, streamed and cancellable execs, and files, each
parsed here and run by the gateway's session runtime exactly as the HTTP session routes run it
(docs/mcp.md, "Sessions")."""

from __future__ import annotations

import base64
import binascii
import codecs
import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from functools import partial
from typing import Any, Literal

import anyio
import anyio.to_thread
import mcp_types as types
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from policy_engine.errors import ErrorCode, PolicyEngineError
from policy_engine.gateway.session_execs import ExecJob, SessionExecs
from policy_engine.gateway.session_files import SessionFiles
from policy_engine.gateway.session_runtime import Sessions
from policy_engine.gateway.session_skills import SessionSkills
from policy_engine.refusal import ConsentSeen, PolicyRefusal, Refusal, engine_refusal
from policy_engine.skills.invoke import InputError, SkillInvoker
from policy_engine.skills.jsonpos import escape

# (progress, message): a progress notification to the caller (a no-op without a progressToken)
Report = Callable[[float, str], Awaitable[None]]
_SID = r"^s-[0-9a-f]{24}$"
_MAX_READ = 1 << 20  # bytes a download gives the model at most (the rest: `truncated`)


class _Args(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class CreateArgs(_Args):
    ttl_s: int | None = Field(default=None, ge=1, description="seconds until it expires")
    security_mode: Literal["strict", "permissive"] | None = None
    backend: Literal["auto", "proc-bwrap", "docker"] = Field(
        default="auto", description="fixed for the session's life; `auto`: docker in strict "
        "mode, proc-bwrap in permissive")


class NoArgs(_Args):
    pass


class SessionArgs(_Args):
    session_id: str = Field(pattern=_SID)


class ExtendArgs(SessionArgs):
    ttl_s: int | None = Field(default=None, ge=1, description="expire this many seconds from "
                              "now (never past the maximum lifetime)")


class RunCodeArgs(SessionArgs):
    code: str = Field(max_length=262_144)
    language: Literal["python", "shell"] = "python"
    timeout_s: float = Field(default=30.0, gt=0, le=600)
    stateful: bool = Field(default=False, description="python: keep the globals between "
                           "stateful calls of the session")


class ExecArgs(RunCodeArgs):
    wait: bool = Field(default=True, description="false: answer at once with the exec id "
                       "(poll with session.exec.get, stop with session.exec.cancel)")


class ExecRefArgs(SessionArgs):
    exec_id: str = Field(pattern=r"^[0-9a-f]{32}$")


class UploadArgs(SessionArgs):
    path: str = Field(max_length=1024, description="relative to the workspace")
    text: str | None = Field(default=None, description="the content as UTF-8 text")
    content_b64: str | None = Field(default=None, description="or the bytes in base64")
    overwrite: bool = True


class PathArgs(SessionArgs):
    path: str = Field(max_length=1024, description="relative to the workspace")


class ListArgs(SessionArgs):
    path: str = Field(default=".", max_length=1024)
    depth: int = Field(default=3, ge=0, le=16)


class SkillArgs(SessionArgs):
    skill: str = Field(pattern=r"^[a-z0-9]+(\.[a-z0-9]+)+$", max_length=64,
                       description="the skill's id (`files.read`, `python.run`, …)")
    inputs: dict[str, Any] = Field(default_factory=dict, description="the skill's inputs "
                                   "(its `interface.inputs`)")


@dataclass(frozen=True, slots=True)
class _Spec:
    args: type[_Args]
    description: str
    read_only: bool
    destructive: bool
    idempotent: bool


_SPECS: dict[str, _Spec] = {
    "session.create": _Spec(CreateArgs, "Create a session: a workspace that outlives one call, "
                            "on a sandbox fixed at create (tenant and subject: the caller's)",
                            False, False, False),
    "session.list": _Spec(NoArgs, "The caller's live sessions, newest first", True, False, True),
    "session.get": _Spec(SessionArgs, "One live session of the caller", True, False, True),
    "session.extend": _Spec(ExtendArgs, "Push a session's expiry", False, False, True),
    "session.delete": _Spec(SessionArgs, "End a session: running calls killed, workspace "
                            "removed, warm container released", False, True, True),
    "session.run_code": _Spec(RunCodeArgs, "Run python or shell code in the session's "
                              "workspace (one guarded call); stdout and stderr come as "
                              "progress notifications while it runs", False, True, False),
    "session.exec": _Spec(ExecArgs, "Start code in the session; streams progress while it "
                          "runs, or answers at once with `wait: false`", False, True, False),
    "session.exec.get": _Spec(ExecRefArgs, "An exec's status and, once ended, its record",
                              True, False, True),
    "session.exec.cancel": _Spec(ExecRefArgs, "Cancel an exec (its process group is killed; "
                                 "its evidence ends `cancelled`)", False, True, True),
    "session.files.upload": _Spec(UploadArgs, "Write a file in the session's workspace "
                                  "(`text` or `content_b64`)", False, True, True),
    "session.files.read": _Spec(PathArgs, "Read a file of the session's workspace (as text "
                                "when it is UTF-8, else base64)", True, False, True),
    "session.files.list": _Spec(ListArgs, "The workspace's entries under a path", True, False,
                                True),
    "session.files.delete": _Spec(PathArgs, "Delete a file of the workspace", False, True,
                                  True),
    "session.skill": _Spec(SkillArgs, "Invoke a skill in the session: its `work/` is the "
                           "session's workspace, a container skill runs in a docker "
                           "session's own container (one guarded call)", False, True, False),
}


def _parse(model: type[_Args], arguments: dict[str, Any]) -> Any:
    """:raises InputError: the first problem, with its JSON pointer."""
    try:
        return model.model_validate(arguments)
    except ValidationError as exc:
        first = exc.errors()[0]
        pointer = "".join(f"/{escape(str(p))}" for p in first["loc"])
        raise InputError(pointer, str(first["msg"])[:200]) from None


def _bytes(args: UploadArgs) -> bytes:
    if (args.text is None) == (args.content_b64 is None):
        raise InputError("", "give exactly one of `text` and `content_b64`")
    if args.text is not None:
        return args.text.encode("utf-8")
    try:
        return base64.b64decode(args.content_b64 or "", validate=True)
    except (binascii.Error, ValueError):
        raise InputError("/content_b64", "not base64") from None


def _as_text(path: str, data: bytes, truncated: bool) -> dict[str, Any]:
    """The model reads words, not base64: UTF-8 bytes come back as ``text``."""
    out: dict[str, Any] = {"path": path, "size": len(data), "truncated": truncated}
    try:
        out["text"] = data.decode("utf-8")
    except UnicodeDecodeError:
        out["bytes_b64"] = base64.b64encode(data).decode()
    return out


def with_text(output: dict[str, Any]) -> dict[str, Any]:
    """A file skill's bytes as text for the model when they are UTF-8 (``text`` beside
    ``bytes_b64``; the model reads words, not base64); other bytes stay base64 only."""
    raw = output.get("bytes_b64")
    if not isinstance(raw, str) or "text" in output:
        return output
    cut = bool(output.get("preview_truncated"))
    try:
        # a preview's cut may split a character: its incomplete tail is dropped, not a reason
        # to give the model base64 (`final=False`); anywhere else a bad byte means not text
        text = codecs.getincrementaldecoder("utf-8")().decode(
            base64.b64decode(raw, validate=True), final=not cut)
    except (ValueError, UnicodeDecodeError):
        return output
    if cut:
        text += f"\n[… truncated: {output.get('size')} bytes in all]"
    return {**output, "text": text}


class SessionTools:
    """The ``session.*`` tools of one MCP server, over one session runtime (its execs live in
    this process, as the HTTP service's do in its own)."""

    def __init__(self, sessions: Sessions, *, max_upload_bytes: int = 1 << 20,
                 invoker: SkillInvoker | None = None) -> None:
        self.sessions = sessions
        self.files = SessionFiles(sessions, max_upload_bytes=max_upload_bytes)
        self.execs = SessionExecs(sessions)
        # `session.skill` when the server offers skills
        self.skills = SessionSkills(sessions, invoker) if invoker is not None else None

    def handles(self, name: str) -> bool:
        return name in _SPECS and (name != "session.skill" or self.skills is not None)

    def tools(self) -> list[types.Tool]:
        listed = []
        for name, spec in _SPECS.items():
            if not self.handles(name):
                continue
            schema = spec.args.model_json_schema()
            schema.pop("title", None)
            listed.append(types.Tool(
                name=name, title=name, description=spec.description, input_schema=schema,
                annotations=types.ToolAnnotations(
                    title=name, read_only_hint=spec.read_only,
                    destructive_hint=spec.destructive, idempotent_hint=spec.idempotent,
                    open_world_hint=False),
                meta={"policy-engine/sessions": True}))
        return listed

    async def call(self, name: str, arguments: dict[str, Any], *, tenant: str, subject: str,
                   report: Report) -> dict[str, Any]:
        """Run the tool ``name``; answers its structured output.

        :raises InputError: the arguments do not fit the tool (nothing ran).
        :raises PolicyRefusal: the runtime refused (unknown session: 404, caps, policy).
        """
        args = _parse(_SPECS[name].args, arguments)
        rt, who = self.sessions, (tenant, subject)

        def sync(fn: Callable[..., Any], *a: Any, **kw: Any) -> Awaitable[Any]:
            return anyio.to_thread.run_sync(partial(fn, *who, *a, **kw))

        if name == "session.create":
            info = await anyio.to_thread.run_sync(partial(
                rt.create, tenant, subject, ttl_s=args.ttl_s,
                security_mode=args.security_mode, backend=args.backend))
            return dict(info.to_json())
        if name == "session.list":
            found = await sync(rt.list)
            return {"sessions": [s.to_json() for s in found]}
        if name == "session.get":
            return dict((await sync(rt.get, args.session_id)).to_json())
        if name == "session.extend":
            return dict((await sync(rt.extend, args.session_id, args.ttl_s)).to_json())
        if name == "session.delete":
            return dict(await sync(rt.delete, args.session_id))
        if name in ("session.run_code", "session.exec"):
            return await self._exec(args, who, report, as_run_code=name == "session.run_code")
        if name == "session.exec.get":
            job = await sync(self.execs.get, args.session_id, args.exec_id)
            return dict(job.to_json())
        if name == "session.exec.cancel":
            job = await sync(self.execs.cancel, args.session_id, args.exec_id)
            return dict(job.to_json())
        if name == "session.files.upload":
            data = _bytes(args)
            return dict(await sync(self.files.upload, args.session_id, args.path, data,
                                   overwrite=args.overwrite))
        if name == "session.files.read":
            return dict(await sync(self._read, args.session_id, args.path))
        if name == "session.files.list":
            return dict(await sync(self.files.list, args.session_id, args.path, args.depth))
        if name == "session.skill":
            return dict(await sync(self._skill, args.session_id, args.skill, args.inputs))
        return dict(await sync(self.files.delete, args.session_id, args.path))

    def _skill(self, tenant: str, subject: str, session_id: str, skill: str,
               inputs: dict[str, Any]) -> dict[str, Any]:
        """The skill's document, a file's bytes as text when UTF-8; a refusal raises."""
        assert self.skills is not None  # INVARIANT: handles() offered the tool
        result = self.skills.invoke(tenant, subject, session_id, skill, inputs)
        if result.refusal is not None:
            raise PolicyRefusal(refusal_from_json(result.refusal))
        return {**result.to_json(), "output": with_text(result.output)}

    def _read(self, tenant: str, subject: str, session_id: str, path: str) -> dict[str, Any]:
        got: list[bytes] = []
        size = 0
        for chunk in self.files.download(tenant, subject, session_id, path):
            got.append(chunk)  # each chunk one guarded fs.read
            size += len(chunk)
            if size > _MAX_READ:  # one chunk past the cap tells a cut from an exact fit
                break
        return _as_text(path, b"".join(got)[:_MAX_READ], size > _MAX_READ)

    async def _exec(self, args: ExecArgs | RunCodeArgs, who: tuple[str, str], report: Report,
                    *, as_run_code: bool) -> dict[str, Any]:
        """Start the exec, stream its output as progress, and answer its end; a cancelled
        request (``notifications/cancelled``) cancels the exec as ``DELETE …/execs/{id}``
        does and waits for its evidence end before the cancellation goes on."""
        job: ExecJob = await anyio.to_thread.run_sync(partial(
            self.execs.start, *who, args.session_id, args.code, args.language,
            args.timeout_s, wait=False, stateful=args.stateful))
        if isinstance(args, ExecArgs) and not args.wait:
            return job.to_json()
        try:
            async for chunk in self.execs.astream(job, keep_alive_s=3600):
                if chunk is not None:
                    text = chunk.text if chunk.stream == "stdout" else f"[stderr] {chunk.text}"
                    await report(chunk.seq + 1, text)
        except anyio.get_cancelled_exc_class():
            with anyio.CancelScope(shield=True):
                await anyio.to_thread.run_sync(partial(
                    self.execs.cancel, *who, args.session_id, job.exec_id))
            raise
        if job.error is not None:
            raise PolicyRefusal(refusal_from_json(job.error))
        if as_run_code:
            if job.result is None:  # not reached: an ended exec has a result or an error
                raise PolicyRefusal(engine_refusal(PolicyEngineError(
                    ErrorCode.UNKNOWN_INTERNAL, "the call ended without a record"), "service"))
            return job.result.to_json()
        return {**job.to_json(), "truncated": dict(job.truncated)}


def refusal_from_json(doc: dict[str, Any]) -> Refusal:
    """The refusal a document (``Refusal.to_json``) describes."""
    return Refusal(code=doc["code"], http_status=doc["http_status"],
                   retryable=doc["retryable"], message=doc["message"],
                   refused_by=doc["refused_by"], rule=doc.get("rule"),
                   consent=ConsentSeen(**(doc.get("consent") or {})),
                   envelope_id=doc.get("envelope_id"), location=doc.get("location"))


def text_of(name: str, output: dict[str, Any]) -> str:
    """What the model reads: a file's text, run_code's output, else the JSON."""
    if name == "session.files.read" and isinstance(output.get("text"), str):
        return str(output["text"])
    if name == "session.skill" and isinstance(output.get("output", {}).get("text"), str):
        return str(output["output"]["text"])
    return json.dumps(output, ensure_ascii=False)
