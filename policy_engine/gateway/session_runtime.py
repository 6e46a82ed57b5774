"""Sessions an agent runtime lives in: lifecycle (create, list, get, extend, delete, TTL expiry)
and each session's run_code calls, every one through the gateway (docs/sessions.md)."""

from __future__ import annotations

import builtins
import contextlib
import hashlib
import logging
import secrets
import shutil
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from policy_engine.config import EngineConfig
from policy_engine.errors import BackendRefusal, ErrorCode, PolicyEngineError
from policy_engine.executor import CancelToken
from policy_engine.gateway.call import Call, Gateway
from policy_engine.gateway.session_interpreter import SessionInterpreter
from policy_engine.gateway.session_store import SessionInfo, SessionStore
from policy_engine.refusal import PolicyRefusal, code_refusal, engine_refusal
from policy_engine.runcode.manager import (
    OrchestratorPool,
    RunCodeResult,
    plan_run_code,
    run_code_manifest,
    run_code_result,
)
from policy_engine.runcode.risk import SecurityMode, UnifiedRiskPolicy
from policy_engine.skills.refusals import record_refusal

log = logging.getLogger(__name__)
BACKENDS = ("proc-bwrap", "docker")
_STRENGTH = {"proc-bwrap": 0, "docker": 1}  # a container isolates more than bubblewrap


def _now_ms() -> int:
    return int(time.time() * 1000)


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:24]


@dataclass(frozen=True, slots=True)
class SessionLimits:
    """The runtime's bounds: live sessions per tenant, the TTLs a caller may ask for, and
    how many calls run at once (per session and in all: each is a sandboxed process)."""

    max_live_per_tenant: int = 16
    default_ttl_s: int = 600
    max_ttl_s: int = 86_400  # a session never lives longer than this after its creation
    max_running_per_session: int = 4
    max_running: int = 32


@dataclass
class _Live:
    """The in-process state of one session: the cancel tokens of its running calls."""

    running: set[CancelToken] = field(default_factory=set)
    idle: threading.Condition = field(default_factory=threading.Condition)


class Sessions:
    """The session runtime of one engine (the service holds one; the Python face may too).

    :param pool: the orchestrators pinned to a backend (shared with the service's run_code).
    :param gateway: the engine's gateway (its consent broker); each call runs on the
        orchestrator pinned to the session's backend.
    :param workspace_root: the host directory holding every session's workspace.
    :param reap_interval_s: how often expired sessions are ended (``0``: only on access).
    :param store: where sessions are kept (default ``STATE_DIR/sessions.db``; the service
        passes PostgreSQL's under ``service_postgres``, shared by its replicas).
    """

    def __init__(self, pool: OrchestratorPool, gateway: Gateway, *, config: EngineConfig,
                 workspace_root: Path | None = None, limits: SessionLimits | None = None,
                 default_mode: SecurityMode = SecurityMode.STRICT,
                 reap_interval_s: float = 1.0, store: SessionStore | None = None) -> None:
        self.pool = pool
        self.gateway = gateway
        self.config = config
        self.limits = limits or SessionLimits()
        self.default_mode = SecurityMode(default_mode)
        self.root = (workspace_root or config.state_dir / "run_code").absolute()
        self.manifest = run_code_manifest(self.root)
        self.store = store or SessionStore(config.state_dir / "sessions.db")
        self._live: dict[str, _Live] = {}
        self._interpreters: dict[str, SessionInterpreter] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._reaper: threading.Thread | None = None
        if reap_interval_s > 0:
            self._reaper = threading.Thread(target=self._reap_loop, args=(reap_interval_s,),
                                            name="session-reaper", daemon=True)
            self._reaper.start()

    def close(self) -> None:
        """Stop the reaper and the live interpreters (processes of this engine); live sessions
        stay stored (their workspaces outlive a restart; a stateful call then starts afresh)."""
        self._stop.set()
        if self._reaper is not None:
            self._reaper.join(timeout=5)
        with self._lock:
            slots, self._interpreters = list(self._interpreters.values()), {}
        for slot in slots:
            slot.close("the session runtime closed")
        self.store.close()

    # --- lifecycle ---------------------------------------------------------------------------

    def workspace(self, info: SessionInfo) -> Path:
        """``<root>/sessions/<tenant digest>/<subject digest>/<session id>/work`` (digests: any
        tenant or subject text names a safe, distinct directory)."""
        return (self.root / "sessions" / _digest(info.tenant) / _digest(info.subject)
                / info.session_id / "work")

    def create(self, tenant: str, subject: str, *, ttl_s: int | None = None,
               security_mode: str | None = None, backend: str = "auto") -> SessionInfo:
        """A new session for ``(tenant, subject)``; its backend is fixed now.

        :param backend: ``proc-bwrap``, ``docker`` or ``auto`` (``docker`` in ``strict`` mode,
            ``proc-bwrap`` in ``permissive``).
        :raises PolicyRefusal: a bad argument (422), the tenant's live-session cap (429).
        """
        mode = self._mode(security_mode)
        if backend == "auto":
            backend = "docker" if mode is SecurityMode.STRICT else "proc-bwrap"
        if backend not in BACKENDS:
            raise _bad(f"backend must be one of auto, {', '.join(BACKENDS)}", "backend")
        ttl = self._ttl(ttl_s)
        now = _now_ms()
        info = SessionInfo(f"s-{secrets.token_hex(12)}", tenant, subject, mode.value, backend,
                           now, now + ttl * 1000)
        # every backend runs the session in its own workspace (docker binds it at its own
        # path): any number of docker sessions per owner, nothing shared
        refused = self.store.insert_capped(info, self.limits.max_live_per_tenant)
        if refused == "cap":
            raise PolicyRefusal(code_refusal(
                ErrorCode.BUDGET_EXCEEDED.value, 429, f"the tenant has "
                f"{self.limits.max_live_per_tenant} live sessions (the cap): delete one or "
                "wait for one to expire", "limits", retryable=True))
        (self.workspace(info) / "artifacts").mkdir(parents=True, exist_ok=True)  # $PE_ARTIFACTS_DIR
        if backend == "docker":  # its own warm container, made while the caller goes on
            # the workspace stays root's (the engine made it): every backend writes it through
            # an id-mapped bind, nothing is handed over (plugins/executor_docker/identity.py).
            # Started before the event's write: the first call waits for this container
            threading.Thread(target=self._prewarm, args=(info,), name="session-prewarm",
                             daemon=True).start()
        self.store.event(info, now, "created", {"backend": backend, "security_mode":
                                                mode.value, "ttl_s": ttl})
        return info

    def get(self, tenant: str, subject: str, session_id: str) -> SessionInfo:
        """The caller's live session.

        :raises PolicyRefusal: ``SERVICE.NOT_FOUND`` (404) for an unknown, ended or expired
            session, or one of another tenant or subject (the same answer: no probing).
        """
        info = self.store.get(tenant, subject, session_id)
        if info is not None and info.live and info.expires_ms <= _now_ms():
            self.end(info, "expired")
            info = None
        if info is None or not info.live:
            raise PolicyRefusal(code_refusal("SERVICE.NOT_FOUND", 404,
                                             "not found: no such session", "service",
                                             location="session_id"))
        return info

    def list(self, tenant: str, subject: str) -> builtins.list[SessionInfo]:
        now = _now_ms()
        return [s for s in self.store.list(tenant, subject) if s.expires_ms > now]

    def extend(self, tenant: str, subject: str, session_id: str,
               ttl_s: int | None = None) -> SessionInfo:
        """Expire ``ttl_s`` from now (never past ``max_ttl_s`` after the creation)."""
        info = self.get(tenant, subject, session_id)
        until = min(_now_ms() + self._ttl(ttl_s) * 1000,
                    info.created_ms + self.limits.max_ttl_s * 1000)
        self.store.extend(info.session_id, until)
        self.store.event(info, _now_ms(), "extended", {"expires_ms": until})
        return self.get(tenant, subject, session_id)

    def delete(self, tenant: str, subject: str, session_id: str) -> dict[str, Any]:
        """End the session: its running calls are cancelled (process groups killed), its
        workspace removed and its warm container released; answers the ``ended`` event."""
        return self.end(self.get(tenant, subject, session_id), "deleted")

    def end(self, info: SessionInfo, reason: str) -> dict[str, Any]:
        """End ``info`` once (deleted or expired) and record what was released."""
        if not self.store.end(info.session_id, _now_ms(), reason):
            return {"session_id": info.session_id, "reason": reason, "already_ended": True}
        with self._lock:
            live = self._live.pop(info.session_id, None)
        cancelled = drained = 0
        if live is not None:
            with live.idle:
                cancelled = len(live.running)
                for token in live.running:
                    token.cancel(f"session {reason}")
                # the calls' evidence ends (`cancelled`) are written before the files go
                drained = int(live.idle.wait_for(lambda: not live.running, timeout=10.0))
        # after the calls' ends (a running stateful call killed it already; a slot a racing
        # call made is popped too): the live interpreter is killed with its cgroup
        with self._lock:
            interp = self._interpreters.pop(info.session_id, None)
        killed = interp.close(f"session {reason}") if interp is not None else None
        work = self.workspace(info)
        released = self._release_pool(info)  # the container goes before the files it binds
        files = sum(1 for _ in work.rglob("*")) if work.is_dir() else 0
        shutil.rmtree(work.parent, ignore_errors=True)
        detail: dict[str, Any] = {
            "reason": reason, "calls_cancelled": cancelled, "calls_drained": bool(drained),
            "workspace_removed": not work.parent.exists(), "files_removed": files,
            "pool_released": released,
            **({"interpreter_killed": killed} if killed is not None else {})}
        self.store.event(info, _now_ms(), "ended", detail)
        log.info("session %s ended: %s", info.session_id, detail)
        return {"session_id": info.session_id, **detail}

    def events(self, tenant: str, subject: str, session_id: str) -> builtins.list[dict[str, Any]]:
        """The session's lifecycle record (created, extended, ended with what was released);
        readable after the end too, by its owner only."""
        self.store_owner(tenant, subject, session_id)
        return self.store.events(session_id)

    def store_owner(self, tenant: str, subject: str, session_id: str) -> SessionInfo:
        """The caller's session, live or ended (its execs stay readable after its end).

        :raises PolicyRefusal: ``404`` for an unknown session or another owner's.
        """
        info = self.store.get(tenant, subject, session_id)
        if info is None:
            raise PolicyRefusal(code_refusal("SERVICE.NOT_FOUND", 404,
                                             "not found: no such session", "service"))
        return info

    # --- calls -------------------------------------------------------------------------------

    def run_code(self, tenant: str, subject: str, session_id: str, code: str,
                 language: str = "python", timeout: float = 30.0, *,
                 cancel: CancelToken | None = None,
                 on_output: Callable[[str, bytes], None] | None = None,
                 stateful: bool = False) -> RunCodeResult:
        """One guarded call in the session's workspace, on the session's backend.

        :param cancel: cancels the call (its process group is killed; evidence ends
            ``cancelled``); deleting or expiring the session cancels it too.
        :param on_output: sees stdout/stderr chunks as the process writes them.
        :param stateful: python only: run in the session's live interpreter, its variables
            kept between calls (session_interpreter.py; on docker a long-lived exec in the
            session's container, plugins/executor_docker/interpreter.py).

        :raises PolicyRefusal: unknown session (404); the risk hint requires a stronger
            sandbox than the session's backend (``SANDBOX.CAPABILITY_BLOCKED``: a session never
            moves between backends, its files would not follow).
        :raises ValueError: ``language`` is not ``python`` or ``shell``.
        """
        info = self.get(tenant, subject, session_id)
        work = self.workspace(info)
        plan = plan_run_code(code, language, timeout, session_id=info.session_id,
                             tenant=tenant, subject=subject, manifest=self.manifest,
                             security_mode=SecurityMode(info.security_mode), work=work,
                             root=work.parent, backend=info.backend, host_paths=True)
        if stateful and language != "python":
            raise _bad("stateful calls run python", "language")
        needed = UnifiedRiskPolicy.required_sandbox(plan.risk, SecurityMode(info.security_mode))
        if _STRENGTH[needed] > _STRENGTH[info.backend]:
            err = BackendRefusal(
                ErrorCode.CAPABILITY_BLOCKED, f"the code's risk ({plan.risk.level.name}) needs "
                f"{needed} in {info.security_mode} mode; this session runs on {info.backend}: "
                f"create a session with backend `{needed}`")
            # no op ran, but the call leaves evidence (the code as its size and keyed digest)
            envelope = record_refusal(
                self.pool.get(info.backend), tenant=tenant, subject=subject,
                tool_name=self.manifest.name, capability="proc.exec",
                arguments={"code": code, "language": language, "session": info.session_id},
                err=err)
            raise PolicyRefusal(engine_refusal(err, "backend", envelope_id=envelope))
        token = cancel or CancelToken()
        with self.tracked(info, token):
            slot = self._interpreter(info) if stateful else None
            if slot is not None and not slot.lock.acquire(timeout=timeout):
                raise PolicyRefusal(code_refusal(
                    ErrorCode.BUDGET_EXCEEDED.value, 429, "the session's interpreter is busy "
                    f"with another call for {timeout}s: one stateful call runs at a time",
                    "limits", retryable=True))
            try:
                orch = self.pool.get(info.backend)
                called = self.gateway.run(
                    Call(plan.grant, self.manifest, plan.op, settings=plan.settings,
                         annotations={"risk": plan.risk.to_json(), "session": info.session_id,
                                      **({"stateful": True} if stateful else {})},
                         identity=(tenant, subject), cancel=token, on_output=on_output,
                         via=slot.via if slot is not None else None),
                    orchestrator=orch)
            finally:
                if slot is not None:
                    slot.lock.release()
        return run_code_result(called.outcome, info.backend, plan.risk,
                               called.refusal.to_json() if called.refusal else None)

    def restart_interpreter(self, tenant: str, subject: str,
                            session_id: str) -> dict[str, Any]:
        """Kill the session's live interpreter (waiting for a running stateful call to end);
        the next stateful call starts a fresh one and says so (``state_lost``)."""
        info = self.get(tenant, subject, session_id)
        done = self._interpreter(info).restart("restarted on request")
        return {"session_id": info.session_id, **done}

    @contextlib.contextmanager
    def tracked(self, info: SessionInfo, token: CancelToken) -> Iterator[None]:
        """Count a call of ``info`` as running while the block runs: ending the session
        cancels ``token`` and waits for the call's evidence end before its files go.

        :raises PolicyRefusal: too many calls running (429), the session ended (404).
        """
        live = self._enter(info, token)
        try:
            yield
        finally:
            with live.idle:
                live.running.discard(token)
                live.idle.notify_all()

    # --- internals ---------------------------------------------------------------------------

    def _interpreter(self, info: SessionInfo) -> SessionInterpreter:
        with self._lock:
            slot = self._interpreters.get(info.session_id)
            if slot is None:
                slot = self._interpreters[info.session_id] = SessionInterpreter(
                    lambda event, detail: self.store.event(info, _now_ms(), event, detail),
                    float(self.limits.max_ttl_s))
            return slot

    def _enter(self, info: SessionInfo, token: CancelToken) -> _Live:
        with self._lock:
            live = self._live.setdefault(info.session_id, _Live())
            running = sum(len(x.running) for x in self._live.values())
            with live.idle:
                if len(live.running) >= self.limits.max_running_per_session or \
                        running >= self.limits.max_running:
                    raise PolicyRefusal(code_refusal(
                        ErrorCode.BUDGET_EXCEEDED.value, 429, "too many calls running: "
                        f"at most {self.limits.max_running_per_session} per session and "
                        f"{self.limits.max_running} in all; wait for one to end or cancel "
                        "one", "limits", retryable=True))
                live.running.add(token)
        if self.store.get(info.tenant, info.subject, info.session_id) != info:
            # ended (or extended) between the check and the registration: re-check liveness
            current = self.store.get(info.tenant, info.subject, info.session_id)
            if current is None or not current.live:
                with live.idle:
                    live.running.discard(token)
                raise PolicyRefusal(code_refusal("SERVICE.NOT_FOUND", 404,
                                                 "not found: no such session", "service"))
        return live

    def _release_pool(self, info: SessionInfo) -> bool:
        """Remove the session's own warm containers (docker binds its workspace into one per
        runtime, plugins/executor_docker/bound.py); ``True`` once none is left."""
        if info.backend != "docker":
            return False
        try:
            held = self._docker_call("release_bound", info, info.tenant, info.subject)
            if held is None:
                return False
            log.info("session %s: %d warm container(s) removed", info.session_id, held)
        except Exception:  # noqa: BLE001 -- the end is recorded whatever Docker says
            log.exception("session %s: releasing the warm container failed", info.session_id)
            return False
        return True

    def _prewarm(self, info: SessionInfo) -> None:
        """Make the docker session's own warm container (pool mode); its first call waits for
        it rather than making a second. Nothing is lost on failure: the call makes one."""
        try:
            self._docker_call("prewarm_bound", info, info.tenant, info.subject,
                              str(self.workspace(info)))
        except Exception as exc:  # noqa: BLE001 -- the first call reports what is wrong
            log.warning("session %s: no warm container made ahead: %s", info.session_id, exc)

    def _docker_call(self, name: str, info: SessionInfo, *args: str) -> Any:
        """``name(*args, <the session's root>)`` of the docker executor (``None``: it has no
        such method, e.g. a test double)."""
        executor = self.pool.get("docker").components.executors.get("docker")
        method = getattr(executor, name, None)
        return None if method is None else method(*args, str(self.workspace(info).parent))

    def _reap_loop(self, interval: float) -> None:
        while not self._stop.wait(interval):
            try:
                for info in self.store.due(_now_ms()):
                    self.end(info, "expired")
            except Exception:  # noqa: BLE001 -- the reaper outlives one bad round
                log.exception("session reaper")

    def _mode(self, raw: str | None) -> SecurityMode:
        if raw is None:
            return self.default_mode
        try:
            return SecurityMode(raw)
        except ValueError:
            raise _bad("security_mode must be `strict` or `permissive`",
                       "security_mode") from None

    def _ttl(self, ttl_s: int | None) -> int:
        ttl = self.limits.default_ttl_s if ttl_s is None else ttl_s
        if not 1 <= ttl <= self.limits.max_ttl_s:
            raise _bad(f"ttl_s must be between 1 and {self.limits.max_ttl_s}", "ttl_s")
        return ttl


def _bad(message: str, location: str) -> PolicyRefusal:
    return PolicyRefusal(engine_refusal(PolicyEngineError(
        ErrorCode.SCHEMA_VALIDATION_FAILED, message), "service", location=location))
