"""``Client`` and ``AsyncClient``: the service's sessions, files, execs (streamed), run_code,
decide and ops over httpx; every refusal raises :class:`PolicyRefusal` with its document."""

from __future__ import annotations

import base64
import json
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx

from policy_engine.client.models import (
    CodeResult,
    Exec,
    FileWritten,
    OpOutcome,
    OutputEvent,
    Session,
    SkillResult,
    refusal_from,
)
from policy_engine.refusal import PolicyRefusal, code_refusal


def _check(resp: httpx.Response) -> dict[str, Any]:
    """The JSON body of a success; a refusal (any status ≥ 400) raises ``PolicyRefusal``."""
    try:
        body = resp.json()
    except ValueError:
        body = None
    if resp.status_code < 400 and isinstance(body, dict):
        return body
    if isinstance(body, dict) and isinstance(body.get("refusal"), dict):
        raise PolicyRefusal(refusal_from(body["refusal"]))
    raise PolicyRefusal(code_refusal("UNKNOWN.INTERNAL", resp.status_code,
                                     f"HTTP {resp.status_code} without a refusal document",
                                     "service"))


def _op(body: dict[str, Any]) -> OpOutcome:
    return OpOutcome(ok=bool(body["result"].get("ok")), envelope_id=body["envelope_id"],
                     result=body["result"], raw=body)


def _event(kind: str, data: str) -> OutputEvent:
    doc = json.loads(data)
    if kind == "end":
        return OutputEvent("end", final=Exec.of(doc))
    return OutputEvent(kind, doc["seq"], doc["text"])


def _sse(lines: Iterator[str]) -> Iterator[OutputEvent]:
    kind = ""
    for line in lines:
        if line.startswith("event: "):
            kind = line[7:]
        elif line.startswith("data: "):
            yield _event(kind, line[6:])


class Client:
    """A synchronous client of one service with one token.

    :param base_url: e.g. ``http://127.0.0.1:8080``.
    :param timeout: seconds per request (a synchronous exec waits as long as it runs).
    """

    def __init__(self, base_url: str, token: str, *, timeout: float = 120.0,
                 transport: httpx.BaseTransport | None = None) -> None:
        self.http = httpx.Client(base_url=base_url, timeout=timeout, transport=transport,
                                 headers={"Authorization": f"Bearer {token}"})

    def close(self) -> None:
        self.http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # sessions
    def create_session(self, *, ttl_s: int | None = None, security_mode: str | None = None,
                       backend: str = "auto") -> Session:
        body = {"ttl_s": ttl_s, "security_mode": security_mode, "backend": backend}
        return Session.of(_check(self.http.post("/v1/sessions", json=body)))

    def list_sessions(self) -> list[Session]:
        return [Session.of(s) for s in _check(self.http.get("/v1/sessions"))["sessions"]]

    def get_session(self, session_id: str) -> Session:
        return Session.of(_check(self.http.get(f"/v1/sessions/{session_id}")))

    def extend_session(self, session_id: str, ttl_s: int | None = None) -> Session:
        return Session.of(_check(self.http.post(f"/v1/sessions/{session_id}/extend",
                                                json={"ttl_s": ttl_s})))

    def delete_session(self, session_id: str) -> dict[str, Any]:
        return _check(self.http.delete(f"/v1/sessions/{session_id}"))

    # code
    def run_code(self, session_id: str, code: str, language: str = "python", *,
                 timeout_s: float = 30.0, stateful: bool = False) -> CodeResult:
        """One call; a refused or failed run answers ``success=False`` with ``refusal``."""
        return CodeResult.of(_check(self.http.post(
            f"/v1/sessions/{session_id}/run_code",
            json={"code": code, "language": language, "timeout_s": timeout_s,
                  "stateful": stateful})))

    def restart_interpreter(self, session_id: str) -> dict[str, Any]:
        """Kill the session's stateful interpreter; the next stateful call starts afresh."""
        return _check(self.http.post(f"/v1/sessions/{session_id}/interpreter/restart"))

    def start_exec(self, session_id: str, code: str, language: str = "python", *,
                   timeout_s: float = 30.0, stateful: bool = False,
                   wait: bool = False) -> Exec:
        return Exec.of(_check(self.http.post(
            f"/v1/sessions/{session_id}/execs",
            json={"code": code, "language": language, "timeout_s": timeout_s,
                  "stateful": stateful, "wait": wait})))

    def get_exec(self, session_id: str, exec_id: str) -> Exec:
        return Exec.of(_check(self.http.get(f"/v1/sessions/{session_id}/execs/{exec_id}")))

    def cancel_exec(self, session_id: str, exec_id: str) -> Exec:
        return Exec.of(_check(self.http.delete(
            f"/v1/sessions/{session_id}/execs/{exec_id}")))

    def stream_exec(self, session_id: str, exec_id: str) -> Iterator[OutputEvent]:
        """stdout/stderr chunks in order as the exec writes them, then the ``end`` event."""
        with self.http.stream("GET", f"/v1/sessions/{session_id}/execs/{exec_id}/events",
                              timeout=None) as resp:
            if resp.status_code >= 400:
                resp.read()
                _check(resp)
            yield from _sse(resp.iter_lines())

    # files
    def upload(self, session_id: str, path: str, data: bytes) -> FileWritten:
        doc = _check(self.http.put(f"/v1/sessions/{session_id}/files/{path}", content=data))
        return FileWritten(doc["path"], doc["size"], doc["envelope_id"])

    def download(self, session_id: str, path: str) -> bytes:
        resp = self.http.get(f"/v1/sessions/{session_id}/files/{path}")
        if resp.status_code >= 400:
            _check(resp)
        return resp.content

    def list_files(self, session_id: str, path: str = ".") -> list[dict[str, Any]]:
        doc = _check(self.http.get(f"/v1/sessions/{session_id}/files", params={"path": path}))
        return list(doc["entries"])

    def delete_file(self, session_id: str, path: str) -> str:
        return str(_check(self.http.delete(
            f"/v1/sessions/{session_id}/files/{path}"))["envelope_id"])

    def invoke_skill(self, session_id: str, skill_id: str,
                     inputs: dict[str, Any] | None = None) -> SkillResult:
        """Invoke a skill in the session (its `work/` is the session's workspace); a refusal
        raises ``PolicyRefusal``."""
        return SkillResult.of(_check(self.http.post(
            f"/v1/sessions/{session_id}/skills/{skill_id}/invoke",
            json={"inputs": inputs or {}})))

    # decisions
    def decide(self, body: dict[str, Any]) -> dict[str, Any]:
        """`/v1/decide`: the explain document (a dry run; never raises for a deny)."""
        return _check(self.http.post("/v1/decide", json=body))

    def op(self, body: dict[str, Any]) -> OpOutcome:
        """`/v1/ops`: run one op; a refusal raises ``PolicyRefusal`` (``envelope_id`` set)."""
        return _op(_check(self.http.post("/v1/ops", json=body)))


class AsyncClient:
    """The asynchronous twin of :class:`Client` (same methods, awaited)."""

    def __init__(self, base_url: str, token: str, *, timeout: float = 120.0,
                 transport: httpx.AsyncBaseTransport | None = None) -> None:
        self.http = httpx.AsyncClient(base_url=base_url, timeout=timeout, transport=transport,
                                      headers={"Authorization": f"Bearer {token}"})

    async def aclose(self) -> None:
        await self.http.aclose()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def create_session(self, *, ttl_s: int | None = None,
                             security_mode: str | None = None,
                             backend: str = "auto") -> Session:
        body = {"ttl_s": ttl_s, "security_mode": security_mode, "backend": backend}
        return Session.of(_check(await self.http.post("/v1/sessions", json=body)))

    async def list_sessions(self) -> list[Session]:
        doc = _check(await self.http.get("/v1/sessions"))
        return [Session.of(s) for s in doc["sessions"]]

    async def get_session(self, session_id: str) -> Session:
        return Session.of(_check(await self.http.get(f"/v1/sessions/{session_id}")))

    async def extend_session(self, session_id: str, ttl_s: int | None = None) -> Session:
        return Session.of(_check(await self.http.post(f"/v1/sessions/{session_id}/extend",
                                                      json={"ttl_s": ttl_s})))

    async def delete_session(self, session_id: str) -> dict[str, Any]:
        return _check(await self.http.delete(f"/v1/sessions/{session_id}"))

    async def run_code(self, session_id: str, code: str, language: str = "python", *,
                       timeout_s: float = 30.0, stateful: bool = False) -> CodeResult:
        return CodeResult.of(_check(await self.http.post(
            f"/v1/sessions/{session_id}/run_code",
            json={"code": code, "language": language, "timeout_s": timeout_s,
                  "stateful": stateful})))

    async def restart_interpreter(self, session_id: str) -> dict[str, Any]:
        return _check(await self.http.post(f"/v1/sessions/{session_id}/interpreter/restart"))

    async def start_exec(self, session_id: str, code: str, language: str = "python", *,
                         timeout_s: float = 30.0, stateful: bool = False,
                         wait: bool = False) -> Exec:
        return Exec.of(_check(await self.http.post(
            f"/v1/sessions/{session_id}/execs",
            json={"code": code, "language": language, "timeout_s": timeout_s,
                  "stateful": stateful, "wait": wait})))

    async def get_exec(self, session_id: str, exec_id: str) -> Exec:
        return Exec.of(_check(await self.http.get(
            f"/v1/sessions/{session_id}/execs/{exec_id}")))

    async def cancel_exec(self, session_id: str, exec_id: str) -> Exec:
        return Exec.of(_check(await self.http.delete(
            f"/v1/sessions/{session_id}/execs/{exec_id}")))

    async def stream_exec(self, session_id: str, exec_id: str
                          ) -> AsyncIterator[OutputEvent]:
        async with self.http.stream(
                "GET", f"/v1/sessions/{session_id}/execs/{exec_id}/events",
                timeout=None) as resp:
            if resp.status_code >= 400:
                await resp.aread()
                _check(resp)
            kind = ""
            async for line in resp.aiter_lines():
                if line.startswith("event: "):
                    kind = line[7:]
                elif line.startswith("data: "):
                    yield _event(kind, line[6:])

    async def upload(self, session_id: str, path: str, data: bytes) -> FileWritten:
        doc = _check(await self.http.put(f"/v1/sessions/{session_id}/files/{path}",
                                         content=data))
        return FileWritten(doc["path"], doc["size"], doc["envelope_id"])

    async def upload_b64(self, session_id: str, path: str, data: bytes) -> FileWritten:
        doc = _check(await self.http.post(f"/v1/sessions/{session_id}/files", json={
            "path": path, "content_b64": base64.b64encode(data).decode()}))
        return FileWritten(doc["path"], doc["size"], doc["envelope_id"])

    async def download(self, session_id: str, path: str) -> bytes:
        resp = await self.http.get(f"/v1/sessions/{session_id}/files/{path}")
        if resp.status_code >= 400:
            _check(resp)
        return resp.content

    async def list_files(self, session_id: str, path: str = ".") -> list[dict[str, Any]]:
        doc = _check(await self.http.get(f"/v1/sessions/{session_id}/files",
                                         params={"path": path}))
        return list(doc["entries"])

    async def delete_file(self, session_id: str, path: str) -> str:
        return str(_check(await self.http.delete(
            f"/v1/sessions/{session_id}/files/{path}"))["envelope_id"])

    async def invoke_skill(self, session_id: str, skill_id: str,
                           inputs: dict[str, Any] | None = None) -> SkillResult:
        return SkillResult.of(_check(await self.http.post(
            f"/v1/sessions/{session_id}/skills/{skill_id}/invoke",
            json={"inputs": inputs or {}})))

    async def decide(self, body: dict[str, Any]) -> dict[str, Any]:
        return _check(await self.http.post("/v1/decide", json=body))

    async def op(self, body: dict[str, Any]) -> OpOutcome:
        return _op(_check(await self.http.post("/v1/ops", json=body)))
