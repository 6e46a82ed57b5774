"""A warm pool of idle sandbox containers, each handed to one session and then discarded.

Seed 001 §4.4 asks that a pooled container carry nothing from one session to the next. A reset in
place cannot promise that: the container's IPC namespace (``/dev/shm``, SysV segments, POSIX
message queues), its network namespace (abstract sockets) and its writable layer outlive any
wipe a process without capabilities can do, and a fresh IPC namespace cannot be entered from
inside (``unshare`` needs CAP_SYS_ADMIN, which the sandbox never has). So on release the
container is removed and a fresh one is created in the background: the next session waits only
when every container is still being replaced (one container create, ≈ 0.3–0.6 s).

TOCTOU-safe: a slot changes state only under the pool lock (``IDLE → ACQUIRING`` is claimed
there, so two sessions can never take the same container); slow work (limit updates, copying
inputs, replacements) happens outside the lock on a slot nobody else can claim.

The container's root file system is read-only (``Hardening``);
``/workspace/{inputs,work,artifacts}`` are anonymous volumes of the container (the engine's
archive API reaches volumes, not a tmpfs), removed with it. Each container is created with its
own empty host directory mounted read-only at the netproxy's ``SANDBOX_DIR``: a
restricted-network call starts its proxy in there (mounts cannot be added to a running
container). The container itself never has a network (``--network=none``).

A session holds its container from its first call until it is released: at session end
(``release``, which the executor's ``end_session``/``release_session`` call) or once it has had
no call for ``idle_s`` seconds (issue 32 item 3: nothing else gave a container back, so with
one slot a second tenant waited and got ``PROVIDER.UNAVAILABLE``). A slot with a call in
progress is never taken back; the idle clock starts when the session's last call ends.

A bound session (``bound.py``: a session's workspace at its own path) cannot use a pre-made
container (a mount cannot be added later): ``acquire_bound`` makes it its own, with its binds
and masks, outside the slots; it is released the same ways and then removed, not replaced.
A session's live interpreter holds its container for its whole life (``Slot.holder``): a call
that needs the container re-made with other masks stops it first rather than wait on it.
"""

from __future__ import annotations

import contextlib
import enum
import shutil
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

from plugins.executor_docker.control import CONTROL_DIR, Control, launcher_argv
from plugins.executor_docker.engine import SANDBOX_USER, Hardening, map_error
from policy_engine.errors import ErrorCode, PolicyEngineError
from policy_engine.lazy import lazy_module
from policy_engine.netproxy import SANDBOX_DIR

if TYPE_CHECKING:
    import docker
    import docker.errors
    import docker.types
    import requests.exceptions
else:  # the SDK on first use: a start that runs no container does not import it
    docker = lazy_module("docker")
    requests = lazy_module("requests")

POOL_LABEL = "io.policy-engine.pool"
# writable (inputs: by the engine only) over the read-only root; seeded from the image's modes
WORKSPACE_VOLUMES = ("/workspace/inputs", "/workspace/work", "/workspace/artifacts")


class SlotState(enum.Enum):
    IDLE = "idle"
    ACQUIRING = "acquiring"
    BUSY = "busy"
    RESETTING = "resetting"


@dataclass(slots=True)
class Slot:
    """One warm container and who holds it."""

    container_id: str
    hard: Hardening
    net_dir: str = ""
    control: Control | None = None
    state: SlotState = SlotState.IDLE
    session: str | None = None
    dirty_inputs: bool = False  # the session's inputs were copied in
    # one command at a time: calls of one session share the container, and a cancelled or
    # timed-out call's `kill -9 -1` must not land on the next call's processes
    running: threading.Lock = field(default_factory=threading.Lock)
    calls: int = 0  # the session's calls between acquire and done: never reaped while > 0
    last_used: float = 0.0  # monotonic end of the session's last call
    # a bound session's own container (``acquire_bound``): not one of the pool's slots, made
    # with these extra mounts (its root, the masks over it), removed (not replaced) on release
    extra: tuple[docker.types.Mount, ...] | None = None
    user: str = SANDBOX_USER  # the container's uid:gid (a bound tree's owner, identity.py)
    ident: tuple[object, ...] = ()  # what else it was made for (user, id-mapped roots, links)
    # the mounts it was made with when not ``extra`` (an id-mapped bind's) and what detaches
    # them once it is removed
    made: tuple[docker.types.Mount, ...] | None = None
    detach: Callable[[], None] | None = None
    note: str | None = None  # compat: why its root-owned tree was bound unwritable
    # after a call's kill: the pool's CPU quota back (WarmPool._lift_cpu)
    on_kill: Callable[[], None] | None = None
    # a session's live interpreter holding it (interpreter.py): stopped before a re-make
    # (it would hold the old container for its whole life), given the time left; ``True``
    # once it no longer holds the slot
    holder: Callable[[str, float], bool] | None = None
    # a pool slot's masks over the system binds (``acquire``; a bound one's are in ``extra``)
    masks: tuple[docker.types.Mount, ...] = ()


class WarmPool:
    """``size`` pre-started containers with the pool's hardening, idle until a session comes.

    :param hard: hardening of the pool's containers; a session asking for other limits gets its
        container updated in place (memory, cpus, pids) and restored on release.
    :param launcher: run the in-container launcher as PID 1 (``control.py``; commands are forked
        by it) instead of ``sleep infinity`` (commands are ``docker exec``-ed).
    :param updatable: the runtime can change a running container's limits (runc); runsc has no
        ``update``, so a session asking for other limits gets a fresh container with them.
    """

    def __init__(self, client: docker.DockerClient, image: str, size: int, hard: Hardening,
                 system_mounts: list[docker.types.Mount], pool_id: str,
                 launcher: bool = True, updatable: bool = True, idle_s: float = 60.0) -> None:
        self.client = client
        self.image = image
        self.size = size
        self.hard = hard
        self.mounts = system_mounts
        # the masks over them a fresh slot is made with: the last call's (``acquire``)
        self.masks: tuple[docker.types.Mount, ...] = ()
        self.pool_id = pool_id
        self.launcher = launcher
        self.updatable = updatable
        self.idle_s = idle_s
        self.idle_released = 0  # sessions given back after idle_s without a call
        self._reaper: threading.Thread | None = None
        self.replaced = 0  # containers replaced: unhealthy, or made with other limits or masks
        self.recycled = 0  # containers discarded after their session and created afresh
        self.recycle_s: list[float] = []  # how long each discard-and-create took
        self._recyclers: list[threading.Thread] = []
        self._cond = threading.Condition()
        self._slots: list[Slot] = []
        self._by_session: dict[str, Slot] = {}
        self._creating: set[str] = set()  # bound sessions whose container is being made
        self._abandoned: set[str] = set()  # released while being made: removed once made
        self.bound_released = 0  # bound sessions' containers removed
        self._closed = False
        self._net_root = Path(tempfile.mkdtemp(prefix="pe-pool-net-"))
        self._net_root.chmod(0o755)

    def start(self) -> None:
        """Create and start the idle containers."""
        for _ in range(self.size):
            slot = self._create(self.hard, masks=self.masks)
            with self._cond:
                self._slots.append(slot)
                self._cond.notify_all()
        self._reaper = threading.Thread(target=self._reap_loop, daemon=True,
                                        name="policy-engine-pool-idle")
        self._reaper.start()

    def _create(self, hard: Hardening, state: SlotState = SlotState.IDLE,
                session: str | None = None,
                extra: tuple[docker.types.Mount, ...] | None = None,
                made: tuple[docker.types.Mount, ...] | None = None,
                user: str = SANDBOX_USER,
                masks: tuple[docker.types.Mount, ...] = ()) -> Slot:
        net_dir = Path(tempfile.mkdtemp(prefix="slot-", dir=self._net_root))
        net_dir.chmod(0o755)  # INVARIANT: only proxy runtime directories are made in here
        (net_dir / "net").mkdir(mode=0o755)
        mounts = [*self.mounts, docker.types.Mount(target=SANDBOX_DIR, source=str(net_dir / "net"),
                                                   type="bind", read_only=True)]
        mounts += [docker.types.Mount(target=t, source=None, type="volume")
                   for t in WORKSPACE_VOLUMES if extra is None or t != "/workspace/work"]
        mounts += list(made if made is not None else extra or ())
        mounts += masks
        control: Control | None = None
        command = ["/usr/bin/sleep", "infinity"]
        container_id: str | None = None
        try:
            if self.launcher:
                (net_dir / "ctl").mkdir(mode=0o755)
                control = Control(net_dir / "ctl")
                mounts.append(docker.types.Mount(target=CONTROL_DIR, source=str(net_dir / "ctl"),
                                                 type="bind", read_only=True))
                command = launcher_argv()
            # created, then started: a start that fails (a bind source gone) leaves a
            # container that must be removed, and `run` would not say its id
            container = self.client.containers.create(
                self.image, command, mounts=mounts,
                labels={POOL_LABEL: self.pool_id}, **{**self.hard.create_kwargs(),
                                                      "user": user})
            container_id = str(container.id)
            container.start()
            if control is not None:
                control.accept(timeout_s=30)
        except Exception as exc:  # noqa: BLE001 -- every failure gets a registry code
            if control is not None:
                control.close()
            if container_id is not None:
                with contextlib.suppress(docker.errors.DockerException,
                                         requests.exceptions.RequestException):
                    self.client.api.remove_container(container_id, force=True, v=True)
            shutil.rmtree(net_dir, ignore_errors=True)
            raise map_error(exc) from None
        slot = Slot(container_id, hard, str(net_dir / "net"), control=control, state=state,
                    session=session, extra=extra, user=user, made=made, masks=masks)
        slot.on_kill = lambda: self._lift_cpu(slot)
        if control is not None:
            control.on_kill = slot.on_kill
        return slot

    def states(self) -> dict[str, str]:
        with self._cond:
            return {s.container_id: s.state.value for s in self._slots}

    # --- acquire / release -------------------------------------------------------------------

    def acquire(self, session: str, timeout_s: float,
                masks: tuple[docker.types.Mount, ...] = ()) -> Slot:
        """The session's container; claims an idle one (waiting up to ``timeout_s``). It has
        ``masks`` over the system binds (the call's: a container cannot get a mount later):
        one made with others is re-made first, a held one once its running calls end."""
        end = time.monotonic() + timeout_s
        with self._cond:
            self.masks = masks  # fresh slots are made with the masks calls ask for now
            while True:
                if self._closed:
                    raise PolicyEngineError(ErrorCode.PROVIDER_UNAVAILABLE, "pool is closed")
                held = self._by_session.get(session)
                if held is not None and held.masks != masks:
                    if held.calls > 0:  # another call of the session runs in it: wait
                        left = end - time.monotonic()
                        if left <= 0:
                            raise PolicyEngineError(
                                ErrorCode.PROVIDER_UNAVAILABLE, "the session's container, "
                                "made with other masks, was busy until the deadline")
                        self._cond.wait(left)
                        continue
                    self._release_locked(session)  # a denied path appeared or went
                    held = None
                if held is not None and held.calls == 0 and not _usable(held):
                    # its launcher's connection broke (a call it could not report): the
                    # session gets a fresh container, this one is replaced in the background
                    self._release_locked(session)
                    held = None
                if held is not None:
                    held.calls += 1
                    return held
                next_expiry = self._reap_idle()
                idle = next((s for s in self._slots if s.state is SlotState.IDLE), None)
                if idle is not None:
                    idle.state, idle.session, idle.calls = SlotState.ACQUIRING, session, 1
                    self._by_session[session] = idle
                    break
                left = end - time.monotonic()
                if left <= 0:
                    raise PolicyEngineError(ErrorCode.PROVIDER_UNAVAILABLE,
                                            "no warm container free before the deadline",
                                            audit={"pool_size": self.size})
                self._cond.wait(min(left, next_expiry))
        # INVARIANT: only this thread touches ``idle`` until it is BUSY (claimed under the lock)
        if idle.masks != masks or not self._healthy(idle):
            try:
                idle = self._replace(idle, masks=masks)
            except BaseException:
                with self._cond:  # the slot stays unhealthy: a later acquire tries again
                    idle.state, idle.session, idle.calls = SlotState.IDLE, None, 0
                    self._by_session.pop(session, None)
                    self._cond.notify_all()
                raise
        with self._cond:
            idle.state = SlotState.BUSY
        return idle

    def acquire_bound(self, session: str, extra: tuple[docker.types.Mount, ...],
                      timeout_s: float, user: str = SANDBOX_USER, ident: tuple[object, ...] = (),
                      make: Callable[[], tuple[tuple[docker.types.Mount, ...],
                                               Callable[[], None] | None, str | None]]
                      | None = None
                      ) -> Slot:
        """A bound session's own container (``bound.py``), made on its first call with
        ``extra`` (its root at its own path, the masks over it) as ``user``: a warm container
        cannot get a mount later. A held one made with other masks (a denied path appeared
        since), another user or ``ident`` (``identity.BoundIdentity.key``) is replaced, so the
        masks are always the call's own. ``make`` gives the mounts a new container gets instead
        of ``extra`` (an id-mapped bind of its root) and what detaches them once it is removed.
        Released like a pool slot (session end, ``idle_s``), then removed without
        replacement (its mappings detached)."""
        end = time.monotonic() + timeout_s
        stopped: list[object] = []  # the interpreters this call asked to stop (each once)
        while True:
            with self._cond:
                action, held = self._bound_wait(session, extra, user, ident, end, stopped)
                if action == "take" and held is not None:
                    return held
                stop = held.holder if action == "stop" and held is not None else None
            if stop is None:
                break  # made now, or re-made with our masks
            # outside the lock: its end gives the slot back (`done`) after its running call
            stop("the masks changed: the session's container is re-made for a call with "
                 "other masks (a denied path appeared or went)", max(0.0, end - time.monotonic()))
        if held is not None:
            self._remove(held)
            with self._cond:
                self.bound_released += 1
        detach: Callable[[], None] | None = None
        try:
            made, detach, note = make() if make is not None else (None, None, None)
            fresh = self._create(self.hard, SlotState.BUSY, session, extra, made, user)
            fresh.ident, fresh.detach, fresh.note = ident, detach, note
        except BaseException:
            if detach is not None:
                detach()
            with self._cond:
                self._creating.discard(session)
                self._cond.notify_all()
            raise
        with self._cond:
            self._creating.discard(session)
            closed = self._closed or session in self._abandoned
            self._abandoned.discard(session)
            if not closed:
                fresh.calls = 1
                self._by_session[session] = fresh
            self._cond.notify_all()
        if closed:
            self._remove(fresh)
            raise PolicyEngineError(ErrorCode.PROVIDER_UNAVAILABLE, "pool is closed")
        return fresh

    def _bound_wait(self, session: str, extra: tuple[docker.types.Mount, ...], user: str,
                    ident: tuple[object, ...], end: float, stopped: list[object]
                    ) -> tuple[str, Slot | None]:
        """Under the lock: ``take`` the held container made as asked, ``make`` one (the old,
        if any, out of the reaper's reach: its maker removes it), or ``stop`` the live
        interpreter that holds an old one; waits while it is being made or other calls use it.
        """
        while True:
            if self._closed:
                raise PolicyEngineError(ErrorCode.PROVIDER_UNAVAILABLE, "pool is closed")
            held = self._by_session.get(session)
            if session not in self._creating:
                if held is not None and _usable(held) and (
                        held.extra, held.user, held.ident) == (extra, user, ident):
                    held.calls += 1
                    return "take", held
                if held is None or held.calls == 0:
                    if held is not None:
                        del self._by_session[session]
                    self._creating.add(session)
                    return "make", held
                if held.holder is not None and not any(h is held.holder for h in stopped):
                    # an interpreter would hold the old masks' container for its life
                    stopped.append(held.holder)
                    return "stop", held
            left = end - time.monotonic()  # being made, or other calls on old masks
            if left <= 0:
                raise PolicyEngineError(ErrorCode.PROVIDER_UNAVAILABLE, "the session's "
                                        "container was not ready before the deadline")
            self._cond.wait(left)

    def hold(self, slot: Slot, holder: Callable[[str, float], bool] | None) -> None:
        """``holder`` (a live interpreter's stop) holds ``slot`` from now on: a call already
        waiting for a re-make sees it at once."""
        with self._cond:
            slot.holder = holder
            self._cond.notify_all()

    def done(self, slot: Slot) -> None:
        """One call of the slot's session ended: the idle clock starts when none is left."""
        with self._cond:
            slot.calls = max(0, slot.calls - 1)
            slot.last_used = time.monotonic()
            self._cond.notify_all()

    def holds(self, session: str) -> bool:
        """Whether ``session`` holds a container now."""
        with self._cond:
            return session in self._by_session

    def release(self, session: str) -> None:
        """Discard the session's container; a fresh one takes its place in the background (a
        bound session's own is removed before this returns: its end is recorded after)."""
        with self._cond:
            slot = self._by_session.get(session)
            if session in self._creating:
                self._abandoned.add(session)  # its maker removes it
            if slot is None or slot.extra is None:
                self._release_locked(session)
                return
            del self._by_session[session]
            slot.state = SlotState.RESETTING
        self._remove(slot)
        with self._cond:
            self.bound_released += 1
            self._cond.notify_all()

    def _release_locked(self, session: str) -> None:
        slot = self._by_session.pop(session, None)
        if slot is None:
            return
        slot.state = SlotState.RESETTING
        worker = threading.Thread(target=self._recycle, args=(slot,),
                                  name="policy-engine-pool-recycle", daemon=True)
        self._recyclers = [t for t in self._recyclers if t.is_alive()] + [worker]
        worker.start()  # it takes the lock only once this caller has let it go

    def _reap_idle(self) -> float:
        """Release (under the lock) every session idle for ``idle_s``; seconds until the next
        one may expire."""
        now = time.monotonic()
        wait = self.idle_s
        for session, slot in list(self._by_session.items()):
            if slot.state is not SlotState.BUSY or slot.calls > 0:
                continue
            left = slot.last_used + self.idle_s - now
            if left <= 0:
                self._release_locked(session)
                self.idle_released += 1
            else:
                wait = min(wait, left)
        return max(0.01, wait)

    def _reap_loop(self) -> None:
        with self._cond:
            while not self._closed:
                self._cond.wait(self._reap_idle())

    def update_limits(self, slot: Slot, hard: Hardening) -> Slot:
        """Apply a session's memory, cpu and pids limits to its container; the slot to use (a
        fresh container where the runtime cannot update one: what the session wrote is gone)."""
        if hard == slot.hard:
            return slot
        if not self.updatable:
            return self._replace(slot, hard)
        api = self.client.api
        # the SDK's update_container lacks NanoCpus and PidsLimit; the Engine API has both
        resp = api._post_json(api._url("/containers/{0}/update", slot.container_id), data={
            "Memory": hard.mem_limit, "MemorySwap": hard.mem_limit,
            "NanoCpus": hard.nano_cpus, "PidsLimit": hard.host_pids_limit()})
        api._raise_for_status(resp)
        slot.hard = hard
        return slot

    def _lift_cpu(self, slot: Slot) -> None:
        """After a call's kill was sent: the pool's CPU quota again, so a launcher starved by
        the call's (0.01 core) kills and reports within the grace instead of breaking the
        slot. The call's processes are being killed; its other limits stay until release."""
        if not self.updatable or slot.hard.nano_cpus >= self.hard.nano_cpus:
            return
        with contextlib.suppress(docker.errors.DockerException,
                                 requests.exceptions.RequestException):
            self.update_limits(slot, replace(slot.hard, nano_cpus=self.hard.nano_cpus))

    # --- health, recycling, replacement -----------------------------------------------------

    def _healthy(self, slot: Slot) -> bool:
        if slot.control is not None and not slot.control.alive:
            return False
        try:
            info = self.client.api.inspect_container(slot.container_id)
        except (docker.errors.DockerException, requests.exceptions.RequestException):
            return False
        return bool(info.get("State", {}).get("Running"))

    def _recycle(self, old: Slot) -> None:
        """Remove a released container and put a fresh one in its slot (never reused)."""
        started = time.monotonic()
        self._remove(old)
        if old.extra is not None:  # a bound session's own: not a slot of the pool
            with self._cond:
                self.bound_released += 1
                self._cond.notify_all()
            return
        fresh: Slot | None = None
        with contextlib.suppress(PolicyEngineError):
            fresh = self._create(self.hard, masks=self.masks)
        orphan: Slot | None = None
        with self._cond:
            if self._closed or old not in self._slots:
                orphan = fresh
            elif fresh is None:
                # the engine failed: the removed container reads unhealthy, so the next
                # acquire replaces it (or reports the engine's error to that caller)
                old.state, old.session, old.dirty_inputs = SlotState.IDLE, None, False
            else:
                self._slots[self._slots.index(old)] = fresh
                self.recycled += 1
                self.recycle_s.append(time.monotonic() - started)
            self._cond.notify_all()
        if orphan is not None:
            self._remove(orphan)

    def _replace(self, slot: Slot, hard: Hardening | None = None,
                 masks: tuple[docker.types.Mount, ...] | None = None) -> Slot:
        """A fresh container (with ``hard``, default the pool's, and ``masks``, default the
        slot's) for an unhealthy one, one whose limits cannot be updated or one made with other
        masks, kept by the same session."""
        detach, slot.detach = slot.detach, None  # the id-mapped binds go to its successor
        self._remove(slot)
        try:
            fresh = self._create(hard or self.hard, state=slot.state, session=slot.session,
                                 extra=slot.extra, made=slot.made, user=slot.user,
                                 masks=slot.masks if masks is None else masks)
        except BaseException:
            slot.detach = detach  # still the slot's: detached when it is removed again
            raise
        fresh.ident, fresh.detach, fresh.note = slot.ident, detach, slot.note
        fresh.calls, fresh.last_used = slot.calls, slot.last_used
        with self._cond:
            if slot in self._slots:
                self._slots[self._slots.index(slot)] = fresh
            if fresh.session is not None:
                self._by_session[fresh.session] = fresh
        self.replaced += 1
        return fresh

    def _remove(self, slot: Slot) -> None:
        # gone already, or the engine is down: the pool label lets a janitor find it later
        with contextlib.suppress(docker.errors.DockerException,
                                 requests.exceptions.RequestException):
            self.client.api.remove_container(slot.container_id, force=True, v=True)
        if slot.control is not None:
            slot.control.close()
        if slot.net_dir:
            shutil.rmtree(Path(slot.net_dir).parent, ignore_errors=True)
        detach, slot.detach = slot.detach, None
        if detach is not None:  # its id-mapped binds, once no container holds them
            detach()

    def close(self) -> None:
        """Remove every container of the pool."""
        with self._cond:
            self._closed = True
            slots, self._slots = list(self._slots), []
            slots += [s for s in self._by_session.values() if s.extra is not None]
            recyclers, self._recyclers = self._recyclers, []
            self._by_session.clear()
            self._cond.notify_all()
        if self._reaper is not None:
            self._reaper.join(timeout=5)
        for s in slots:
            self._remove(s)
        for worker in recyclers:  # each removes what it created once it sees the pool closed
            worker.join(timeout=60)
        shutil.rmtree(self._net_root, ignore_errors=True)


def _usable(slot: Slot) -> bool:
    """Whether a held slot can run a command: no launcher, or one still connected."""
    return slot.control is None or slot.control.connected()
