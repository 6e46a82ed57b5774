"""`/v1/sessions`: sessions an agent runtime lives in, over HTTP (docs/sessions.md)."""

# no `from __future__ import annotations`: FastAPI reads the dependency types handed to
# `register` from the route signatures, which must be real objects, not strings

from typing import Annotated, Any, Literal

from fastapi import FastAPI, Path
from pydantic import BaseModel, ConfigDict, Field

from policy_engine.gateway.session_runtime import Sessions
from policy_engine.gateway.session_store import SessionInfo
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


class SessionEvent(_Body):
    at_ms: int
    event: Literal["created", "extended", "ended"]
    detail: dict[str, Any]


class SessionEvents(_Body):
    session_id: str
    events: list[SessionEvent]


def _doc(info: SessionInfo) -> SessionDoc:
    return SessionDoc.model_validate(info.to_json())


def register(app: FastAPI, who_dep: Any, sessions_dep: Any) -> None:
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
                             timeout=body.timeout_s)
        return RunCodeResponse.model_validate(result.to_json())
