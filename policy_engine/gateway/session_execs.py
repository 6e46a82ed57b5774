"""A session's asynchronous execs: start without waiting, poll, cancel, and stream stdout and
stderr while the call runs (each exec is one run_code call through the gateway)."""

from __future__ import annotations

import asyncio
import codecs
import secrets
import threading
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any, Literal

from policy_engine.executor import CancelToken
from policy_engine.gateway.session_runtime import Sessions
from policy_engine.refusal import PolicyRefusal, code_refusal
from policy_engine.runcode.manager import RunCodeResult

Status = Literal["queued", "running", "completed", "cancelled"]
_KEEP = 64  # finished execs remembered per session (their records are in the evidence too)
_FORGET_MS = 3_600_000  # and for an hour at most


@dataclass
class Chunk:
    seq: int
    stream: str  # "stdout" | "stderr"
    text: str


@dataclass
class ExecJob:
    """One exec of a session and what it streamed so far (capped per stream)."""

    exec_id: str
    session_id: str
    tenant: str
    subject: str
    max_stream_bytes: int
    status: Status = "queued"
    created_ms: int = field(default_factory=lambda: int(time.time() * 1000))
    token: CancelToken = field(default_factory=CancelToken)
    chunks: list[Chunk] = field(default_factory=list)
    sent: dict[str, int] = field(default_factory=lambda: {"stdout": 0, "stderr": 0})
    truncated: dict[str, bool] = field(default_factory=lambda: {"stdout": False,
                                                                "stderr": False})
    result: RunCodeResult | None = None
    error: dict[str, Any] | None = None  # a refusal raised before the call ran
    changed: threading.Condition = field(default_factory=threading.Condition)
    decoders: dict[str, Any] = field(default_factory=lambda: {
        s: codecs.getincrementaldecoder("utf-8")("replace") for s in ("stdout", "stderr")})

    @property
    def done(self) -> bool:
        return self.status in ("completed", "cancelled")

    def feed(self, stream: str, data: bytes) -> None:
        """The executor's output hook: keeps order, applies the per-stream byte cap."""
        with self.changed:
            room = self.max_stream_bytes - self.sent[stream]
            if room <= 0:
                self.truncated[stream] = True
                return
            part = data[:room]
            self.truncated[stream] |= len(part) < len(data)
            self.sent[stream] += len(part)
            text = self.decoders[stream].decode(part)
            if text:
                self.chunks.append(Chunk(len(self.chunks), stream, text))
            self.changed.notify_all()

    def to_json(self) -> dict[str, Any]:
        return {"exec_id": self.exec_id, "session_id": self.session_id, "status": self.status,
                "created_ms": self.created_ms,
                "result": self.result.to_json() if self.result else None,
                "refusal": self.error}


class SessionExecs:
    """The execs of every session of one runtime (in memory: an exec lives as long as the
    process that runs it; its evidence is durable).

    :param max_stream_bytes: the streamed bytes per stream and exec (the run's own capture
        cap, 1 MiB, is the final record's).
    """

    def __init__(self, sessions: Sessions, *, max_stream_bytes: int = 1 << 20) -> None:
        self.sessions = sessions
        self.max_stream_bytes = max_stream_bytes
        self._jobs: dict[str, ExecJob] = {}
        self._lock = threading.Lock()

    def start(self, tenant: str, subject: str, session_id: str, code: str,
              language: str = "python", timeout: float = 30.0, *,
              wait: bool = True, stateful: bool = False) -> ExecJob:
        """Run ``code`` in the session; ``wait=False`` answers at once (``queued`` or
        ``running``)."""
        info = self.sessions.get(tenant, subject, session_id)
        job = ExecJob(secrets.token_hex(16), info.session_id, tenant, subject,
                      self.max_stream_bytes)
        self._remember(job)
        if wait:
            self._run(job, code, language, timeout, stateful)
        else:
            threading.Thread(target=self._run, args=(job, code, language, timeout, stateful),
                             name=f"session-exec-{job.exec_id[:8]}", daemon=True).start()
        return job

    def get(self, tenant: str, subject: str, session_id: str, exec_id: str) -> ExecJob:
        """:raises PolicyRefusal: ``404`` for another owner's, another session's or an
        unknown exec."""
        self.sessions.store_owner(tenant, subject, session_id)
        with self._lock:
            job = self._jobs.get(exec_id)
        if job is None or (job.tenant, job.subject, job.session_id) != (
                tenant, subject, session_id):
            raise PolicyRefusal(code_refusal("SERVICE.NOT_FOUND", 404,
                                             "not found: no such exec", "service"))
        return job

    def cancel(self, tenant: str, subject: str, session_id: str, exec_id: str) -> ExecJob:
        """Cancel the exec (its process group is killed) and wait for its evidence end."""
        job = self.get(tenant, subject, session_id, exec_id)
        job.token.cancel("cancelled by the caller")
        with job.changed:
            job.changed.wait_for(lambda: job.done, timeout=15.0)
        return job

    async def astream(self, job: ExecJob, *, keep_alive_s: float = 15.0,
                      poll_s: float = 0.005) -> AsyncIterator[Chunk | None]:
        """The exec's chunks in order as they come (from its first), ``None`` as a keep-alive
        while it is quiet; ends once the exec has ended and every chunk was given. Polls
        (5 ms) rather than holding a thread: open streams never starve the worker threads."""
        seen, quiet = 0, 0.0
        while True:
            with job.changed:
                fresh, done = job.chunks[seen:], job.done
            seen += len(fresh)
            for chunk in fresh:
                yield chunk
            if done and seen >= len(job.chunks):
                return
            if fresh:
                quiet = 0.0
                continue
            await asyncio.sleep(poll_s)
            quiet += poll_s
            if quiet >= keep_alive_s:
                quiet = 0.0
                yield None

    # --- internals ---------------------------------------------------------------------------

    def _run(self, job: ExecJob, code: str, language: str, timeout: float,
             stateful: bool) -> None:
        with job.changed:
            job.status = "running"
        try:
            result = self.sessions.run_code(job.tenant, job.subject, job.session_id, code,
                                            language, timeout, cancel=job.token,
                                            on_output=job.feed, stateful=stateful)
        except PolicyRefusal as refused:
            result, job.error = None, refused.refusal.to_json()
        with job.changed:
            job.result = result
            job.status = "cancelled" if job.token.cancelled else "completed"
            job.changed.notify_all()

    def _remember(self, job: ExecJob) -> None:
        """Keep ``job``; forget ended execs beyond the last ``_KEEP`` of a session and any
        ended more than ``_FORGET_MS`` ago (sessions come and go: memory stays bounded)."""
        with self._lock:
            self._jobs[job.exec_id] = job
            mine = [j for j in self._jobs.values() if j.session_id == job.session_id and j.done]
            stale = job.created_ms - _FORGET_MS
            old = mine[:-_KEEP] + [j for j in self._jobs.values()
                                   if j.done and j.created_ms < stale]
            for gone in old:
                self._jobs.pop(gone.exec_id, None)
