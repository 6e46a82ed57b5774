"""`/v1/sessions`: sessions an agent runtime lives in, over HTTP (docs/sessions.md)."""

# no `from __future__ import annotations`: FastAPI reads the dependency types handed to
# `register` from the route signatures, which must be real objects, not strings

import base64
import binascii
import json
from collections.abc import AsyncIterator
from typing import Annotated, Any, Literal

from fastapi import FastAPI, Path, Query, Request
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field
from starlette.concurrency import run_in_threadpool
from starlette.datastructures import UploadFile

from policy_engine.errors import ErrorCode, PolicyEngineError
from policy_engine.gateway.session_execs import ExecJob, SessionExecs
from policy_engine.gateway.session_files import SessionFiles
from policy_engine.gateway.session_runtime import Sessions
from policy_engine.gateway.session_store import SessionInfo
from policy_engine.refusal import PolicyRefusal, engine_refusal
from policy_engine.service.models import RunCodeResponse

SESSION_ID = r"^s-[0-9a-f]{24}$"


class _Body(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class CreateSessionBody(_Body):
    """A new session for the token's tenant and subject."""

    ttl_s: int | None = Field(default=None, ge=1, description="seconds until it expires "
                              "(default: the service's; at most its maximum)")
    security_mode: Literal["strict", "permissive"] | None = Field(
        default=None, description="which sandbox the risk hint requires (default: the "
        "service's --security-mode)")
    backend: Literal["auto", "proc-bwrap", "docker"] = Field(
        default="auto", description="fixed for the session's life; `auto`: docker in strict "
        "mode, proc-bwrap in permissive")


class ExtendSessionBody(_Body):
    ttl_s: int | None = Field(default=None, ge=1, description="expire this many seconds from "
                              "now (never past the maximum lifetime after creation)")


class SessionRunCodeBody(_Body):
    """Code run in the session's workspace on the session's backend."""

    code: str = Field(max_length=262_144)
    language: Literal["python", "shell"] = "python"
    timeout_s: float = Field(default=30.0, gt=0, le=600)
    stateful: bool = Field(default=False, description="python: keep the globals between "
                           "stateful calls of the session (docs/sessions.md)")


class SessionDoc(_Body):
    session_id: str
    tenant: str
    subject: str
    security_mode: Literal["strict", "permissive"]
    backend: Literal["proc-bwrap", "docker"]
    created_ms: int
    expires_ms: int
    ended_ms: int | None
    end_reason: Literal["deleted", "expired"] | None
    status: Literal["live", "ended"]


class SessionList(_Body):
    sessions: list[SessionDoc]


class SessionEnded(_Body):
    """What ending the session released (also its last lifecycle event)."""

    session_id: str
    reason: Literal["deleted", "expired"]
    calls_cancelled: int = Field(description="running calls cancelled (process groups killed)")
    calls_drained: bool = Field(description="every cancelled call recorded its evidence end")
    workspace_removed: bool
    files_removed: int
    pool_released: bool = Field(description="the session's warm container was released")
    interpreter_killed: int | None = Field(default=None, description="the pid of the "
                                           "session's live interpreter, killed")


class InterpreterRestarted(_Body):
    """The session's interpreter was killed; the next stateful call starts a fresh one."""

    session_id: str
    killed: bool = Field(description="an interpreter was live")
    pid: int | None
    reason: str


class SessionEvent(_Body):
    at_ms: int
    event: Literal["created", "extended", "ended", "interpreter_started",
                   "interpreter_ended"]
    detail: dict[str, Any]


class SessionEvents(_Body):
    session_id: str
    events: list[SessionEvent]


class UploadBody(_Body):
    """A file as JSON: its path in the workspace and its bytes in base64."""

    path: str = Field(max_length=1024)
    content_b64: str
    overwrite: bool = True


class FileWritten(_Body):
    path: str
    size: int
    digest: dict[str, Any] = Field(description="SHA-256 of the bytes written")
    envelope_id: str = Field(description="the evidence envelope of the guarded fs.write")


class FileEntry(BaseModel):
    model_config = ConfigDict(extra="allow")
    path: str
    type: str
    size: int | None = None


class FileList(_Body):
    path: str
    entries: list[FileEntry]
    truncated: bool
    envelope_id: str


class FileDeleted(_Body):
    path: str
    envelope_id: str


class ExecStartBody(SessionRunCodeBody):
    """An exec of the session: `wait: false` answers at once (`202`, `queued|running`)."""

    wait: bool = True


class ExecDoc(_Body):
    exec_id: str
    session_id: str
    status: Literal["queued", "running", "completed", "cancelled"]
    created_ms: int
    result: RunCodeResponse | None = Field(description="the final record, once ended")
    refusal: dict[str, Any] | None = Field(
        description="a refusal raised before the call ran (e.g. the session ended)")


# still escaped: the line breaks a reader splitting with Python's str.splitlines (not SSE's
# CR/LF) would cut an event at; JSON escapes the C0 ones already
_LINE_BREAKS = str.maketrans({"\x85": "\\u0085", "\u2028": "\\u2028", "\u2029": "\\u2029"})


async def _sse(job: ExecJob, execs: SessionExecs) -> AsyncIterator[bytes]:
    """`stdout`/`stderr` events in order (`data`: `{"seq", "text"}`), `: keep-alive`
    comments while quiet, and one `end` event with the exec document."""
    async for chunk in execs.astream(job):
        if chunk is None:
            yield b": keep-alive\n\n"
            continue
        # UTF-8 on the wire: escaping every non-ASCII character (six bytes for each undecodable
        # byte's U+FFFD) made 1 MiB of binary output 7.9 MB
        data = json.dumps({"seq": chunk.seq, "text": chunk.text},
                          ensure_ascii=False).translate(_LINE_BREAKS)
        yield f"event: {chunk.stream}\ndata: {data}\n\n".encode()
    end = {**job.to_json(), "truncated": job.truncated}
    data = json.dumps(end, ensure_ascii=False).translate(_LINE_BREAKS)
    yield f"event: end\ndata: {data}\n\n".encode()


def _doc(info: SessionInfo) -> SessionDoc:
    return SessionDoc.model_validate(info.to_json())


def register(app: FastAPI, who_dep: Any, sessions_dep: Any, *,
             max_upload_bytes: int = 1 << 20) -> None:
    """Add the session routes; ``who_dep`` authenticates, ``sessions_dep`` is the runtime."""
    Sid = Annotated[str, Path(pattern=SESSION_ID, description="`s-` and 24 hex digits")]
    tags: list[str | Any] = ["sessions"]

    @app.post("/v1/sessions", tags=tags, status_code=201, response_model=SessionDoc)
    def create_session(body: CreateSessionBody, who: who_dep,
                       sessions: sessions_dep) -> SessionDoc:
        """Create a session (tenant and subject from the token). `429` at the tenant's cap
        of live sessions."""
        rt: Sessions = sessions
        return _doc(rt.create(who.tenant, who.subject, ttl_s=body.ttl_s,
                              security_mode=body.security_mode, backend=body.backend))

    @app.get("/v1/sessions", tags=tags, response_model=SessionList)
    def list_sessions(who: who_dep, sessions: sessions_dep) -> SessionList:
        """The token's live sessions, newest first."""
        rt: Sessions = sessions
        return SessionList(sessions=[_doc(s) for s in rt.list(who.tenant, who.subject)])

    @app.get("/v1/sessions/{session_id}", tags=tags, response_model=SessionDoc)
    def get_session(session_id: Sid, who: who_dep, sessions: sessions_dep) -> SessionDoc:
        """One live session of the token (`404` for any other: unknown, ended, expired, or
        another token's)."""
        rt: Sessions = sessions
        return _doc(rt.get(who.tenant, who.subject, session_id))

    @app.post("/v1/sessions/{session_id}/extend", tags=tags, response_model=SessionDoc)
    def extend_session(session_id: Sid, body: ExtendSessionBody, who: who_dep,
                       sessions: sessions_dep) -> SessionDoc:
        rt: Sessions = sessions
        return _doc(rt.extend(who.tenant, who.subject, session_id, body.ttl_s))

    @app.delete("/v1/sessions/{session_id}", tags=tags, response_model=SessionEnded)
    def delete_session(session_id: Sid, who: who_dep, sessions: sessions_dep
                       ) -> SessionEnded:
        """End the session: running calls cancelled, workspace removed, warm container
        released."""
        rt: Sessions = sessions
        return SessionEnded.model_validate(rt.delete(who.tenant, who.subject, session_id))

    @app.post("/v1/sessions/{session_id}/interpreter/restart", tags=tags,
              response_model=InterpreterRestarted)
    def restart_interpreter(session_id: Sid, who: who_dep, sessions: sessions_dep
                            ) -> InterpreterRestarted:
        """Kill the session's stateful interpreter (after a running stateful call ends); the
        next stateful call starts a fresh one and reports `interpreter.state_lost`."""
        rt: Sessions = sessions
        return InterpreterRestarted.model_validate(
            rt.restart_interpreter(who.tenant, who.subject, session_id))

    @app.get("/v1/sessions/{session_id}/events", tags=tags, response_model=SessionEvents)
    def session_events(session_id: Sid, who: who_dep, sessions: sessions_dep
                       ) -> SessionEvents:
        """The session's lifecycle record, readable after its end by its owner."""
        rt: Sessions = sessions
        return SessionEvents(session_id=session_id,
                             events=[SessionEvent.model_validate(e) for e in
                                     rt.events(who.tenant, who.subject, session_id)])

    @app.post("/v1/sessions/{session_id}/run_code", tags=tags,
              response_model=RunCodeResponse)
    def session_run_code(session_id: Sid, body: SessionRunCodeBody, who: who_dep,
                         sessions: sessions_dep) -> RunCodeResponse:
        """Run code in the session (one guarded call: decision, limits, evidence). `200`
        with `success` false and `refusal` when the policy refused or the run failed."""
        rt: Sessions = sessions
        result = rt.run_code(who.tenant, who.subject, session_id, body.code, body.language,
                             timeout=body.timeout_s, stateful=body.stateful)
        return RunCodeResponse.model_validate(result.to_json())

    def files(rt: Sessions) -> SessionFiles:
        return SessionFiles(rt, max_upload_bytes=max_upload_bytes)

    Rel = Annotated[str, Path(max_length=1024, description="relative to the workspace")]

    @app.post("/v1/sessions/{session_id}/files", tags=tags, status_code=201,
              response_model=FileWritten)
    def upload_json(session_id: Sid, body: UploadBody, who: who_dep,
                    sessions: sessions_dep) -> FileWritten:
        """Upload one file as JSON (`content_b64`); `413` over the cap, before writing."""
        try:
            data = base64.b64decode(body.content_b64, validate=True)
        except (binascii.Error, ValueError):
            raise PolicyRefusal(engine_refusal(PolicyEngineError(
                ErrorCode.SCHEMA_VALIDATION_FAILED, "content_b64 is not base64"), "service",
                location="content_b64")) from None
        return FileWritten.model_validate(files(sessions).upload(
            who.tenant, who.subject, session_id, body.path, data, overwrite=body.overwrite))

    @app.put("/v1/sessions/{session_id}/files/{path:path}", tags=tags, status_code=201,
             response_model=FileWritten)
    async def upload_raw(session_id: Sid, path: Rel, request: Request, who: who_dep,
                         sessions: sessions_dep) -> FileWritten:
        """Upload one file as the raw body (any media type; `multipart/form-data` with one
        `file` part too). `413` over the cap, before a byte is written."""
        box = files(sessions)
        declared = request.headers.get("content-length")
        if declared is not None and declared.isdigit():
            box.check_size(int(declared) if "multipart" not in
                           request.headers.get("content-type", "") else 0)
        if "multipart/form-data" in request.headers.get("content-type", ""):
            form = await request.form(max_files=1, max_fields=1)
            part = form.get("file")
            if not isinstance(part, UploadFile):
                raise PolicyRefusal(engine_refusal(PolicyEngineError(
                    ErrorCode.SCHEMA_VALIDATION_FAILED, "multipart body needs a `file` part"),
                    "service", location="file"))
            data = await part.read(box.max_upload_bytes + 1)
        else:
            chunks: list[bytes] = []
            size = 0
            async for chunk in request.stream():
                size += len(chunk)
                box.check_size(size)  # stops reading at the cap
                chunks.append(chunk)
            data = b"".join(chunks)
        box.check_size(len(data))
        return FileWritten.model_validate(await run_in_threadpool(
            box.upload, who.tenant, who.subject, session_id, path, data))

    @app.get("/v1/sessions/{session_id}/files", tags=tags, response_model=FileList)
    def list_files(session_id: Sid, who: who_dep, sessions: sessions_dep,
                   path: Annotated[str, Query(max_length=1024)] = ".",
                   depth: Annotated[int, Query(ge=0, le=16)] = 3) -> FileList:
        """The workspace's entries under `path` (one guarded fs.list)."""
        return FileList.model_validate(files(sessions).list(
            who.tenant, who.subject, session_id, path, depth))

    @app.get("/v1/sessions/{session_id}/files/{path:path}", tags=tags,
             response_class=StreamingResponse,
             responses={200: {"content": {"application/octet-stream": {}}}})
    def download(session_id: Sid, path: Rel, who: who_dep,
                 sessions: sessions_dep) -> StreamingResponse:
        """The file's bytes, streamed; each 64 KiB chunk is one guarded fs.read."""
        chunks = files(sessions).download(who.tenant, who.subject, session_id, path)
        return StreamingResponse(chunks, media_type="application/octet-stream")

    @app.delete("/v1/sessions/{session_id}/files/{path:path}", tags=tags,
                response_model=FileDeleted)
    def delete_file(session_id: Sid, path: Rel, who: who_dep,
                    sessions: sessions_dep) -> FileDeleted:
        return FileDeleted.model_validate(files(sessions).delete(
            who.tenant, who.subject, session_id, path))

    boxes: dict[int, SessionExecs] = {}

    def execs(rt: Sessions) -> SessionExecs:
        return boxes.setdefault(id(rt), SessionExecs(rt))

    Eid = Annotated[str, Path(pattern=r"^[0-9a-f]{32}$", description="32 hex digits")]

    @app.post("/v1/sessions/{session_id}/execs", tags=tags, response_model=ExecDoc,
              responses={202: {"model": ExecDoc, "description": "started (`wait: false`)"}})
    def start_exec(session_id: Sid, body: ExecStartBody, who: who_dep,
                   sessions: sessions_dep) -> JSONResponse:
        """Run code in the session: by default answers the ended exec (`200`); with
        `wait: false` answers at once (`202`) — poll it, stream its events, cancel it."""
        job = execs(sessions).start(who.tenant, who.subject, session_id, body.code,
                                    body.language, body.timeout_s, wait=body.wait,
                                    stateful=body.stateful)
        doc = ExecDoc.model_validate(job.to_json())
        return JSONResponse(doc.model_dump(mode="json"), status_code=200 if body.wait else 202)

    @app.get("/v1/sessions/{session_id}/execs/{exec_id}", tags=tags, response_model=ExecDoc)
    def get_exec(session_id: Sid, exec_id: Eid, who: who_dep,
                 sessions: sessions_dep) -> ExecDoc:
        return ExecDoc.model_validate(execs(sessions).get(
            who.tenant, who.subject, session_id, exec_id).to_json())

    @app.delete("/v1/sessions/{session_id}/execs/{exec_id}", tags=tags,
                response_model=ExecDoc)
    def cancel_exec(session_id: Sid, exec_id: Eid, who: who_dep,
                    sessions: sessions_dep) -> ExecDoc:
        """Cancel the exec: its process group is killed, its evidence ends `cancelled`."""
        return ExecDoc.model_validate(execs(sessions).cancel(
            who.tenant, who.subject, session_id, exec_id).to_json())

    @app.get("/v1/sessions/{session_id}/execs/{exec_id}/events", tags=tags,
             response_class=StreamingResponse,
             responses={200: {"content": {"text/event-stream": {}}}})
    def exec_events(session_id: Sid, exec_id: Eid, who: who_dep,
                    sessions: sessions_dep) -> StreamingResponse:
        """stdout and stderr as Server-Sent Events while the exec runs (from its start,
        order kept, capped per stream), then an `end` event with the final document."""
        box = execs(sessions)
        job = box.get(who.tenant, who.subject, session_id, exec_id)
        return StreamingResponse(_sse(job, box), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-store",
                                          "X-Accel-Buffering": "no"})
