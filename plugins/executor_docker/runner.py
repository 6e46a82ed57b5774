"""Running one command: a fresh container (run-once) or an exec in a warm one, output bounded.

Output is streamed (attach / exec start with demux) into head+tail buffers on a pump thread; the
process is never killed for talking too much. The wall deadline kills it: the whole container
in run-once mode, every sandbox process (``kill -9 -1`` as uid 1000) in a warm one. So does the
call's cancel token (polled while waiting).
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from plugins.executor_docker import cpu, writequota
from plugins.executor_docker.engine import SANDBOX_USER, Hardening, map_error
from policy_engine.capture import HeadTail
from policy_engine.executor import CancelToken
from policy_engine.lazy import lazy_module

if TYPE_CHECKING:
    import docker
    import docker.errors
    import requests.exceptions
    from docker.types import Mount

    from plugins.executor_proc.writewatch import WriteWatch
else:  # the SDK on first use: a start that runs no container does not import it
    docker = lazy_module("docker")
    requests = lazy_module("requests")

KILL_ALL = ("/bin/kill", "-9", "-1")
_CANCEL_POLL_S = 0.1


@dataclass(slots=True)
class Outcome:
    """What one command did."""

    stdout: HeadTail
    stderr: HeadTail
    exit_code: int | None = None
    timed_out: bool = False
    cancelled: bool = False  # ExecContext.cancel fired: the command was killed
    started: float = field(default_factory=time.time)
    ended: float = 0.0
    cpu_ns: int | None = None  # from the cgroup (cpu.py); None where it cannot be read
    # the disk write quota's watch (writequota.py), when one ran
    write_watch: WriteWatch | None = None
    # compat: why a bound call's root-owned tree was bound unwritable (identity.py)
    degraded: str | None = None
    # ExecContext.on_output: sees each chunk as it comes, before the caps (as proc-bwrap's
    # pump); ``close()`` drops it once the call's result is made
    on_output: Callable[[str, bytes], None] | None = None

    @property
    def duration_ms(self) -> float:
        return round((self.ended - self.started) * 1000, 3)

    def feed(self, stream: str, data: bytes) -> None:
        """One chunk of ``stdout`` or ``stderr``, in the order the process wrote them: handed
        to the hook, then kept within the record's head + tail."""
        hook = self.on_output
        if hook is not None:
            hook(stream, data)
        (self.stdout if stream == "stdout" else self.stderr).feed(data)

    def close(self) -> None:
        """No chunk reaches the hook after this (a pump outliving its join after a kill)."""
        self.on_output = None


def _pump(stream: Iterable[Any], out: Outcome, errors: list[BaseException]) -> None:
    try:
        for chunk in stream:
            o, e = chunk if isinstance(chunk, tuple) else (chunk, None)
            if o:
                out.feed("stdout", o)
            if e:
                out.feed("stderr", e)
    except BaseException as exc:  # noqa: BLE001 -- reported by the caller after the join
        errors.append(exc)


def _start_pump(stream: Iterator[Any], out: Outcome) -> tuple[threading.Thread,
                                                                list[BaseException]]:
    errors: list[BaseException] = []
    t = threading.Thread(target=_pump, args=(stream, out, errors), daemon=True,
                         name="docker-output")
    t.start()
    return t, errors


def bind_mounts(system_binds: Iterable[str], ws_mounts: Iterable[tuple[str, str, bool]]
                ) -> list[Mount]:
    mount = docker.types.Mount
    mounts = [mount(target=p, source=p, type="bind", read_only=True) for p in system_binds]
    mounts += [mount(target=t, source=s, type="bind", read_only=ro) for s, t, ro in ws_mounts]
    return mounts


def _feed(attached: Any, data: bytes) -> None:
    """Write a call's stdin into the container's attached stdin, then close it (EOF)."""
    raw = getattr(attached, "_sock", attached)  # the SDK hands a SocketIO over the socket
    try:
        with contextlib.suppress(OSError):
            raw.sendall(data)
        with contextlib.suppress(OSError):
            raw.shutdown(socket.SHUT_WR)
    finally:
        with contextlib.suppress(OSError):
            attached.close()


def _start_by(streams: docker.APIClient, container_id: str, deadline: float,
              cancel: CancelToken | None) -> bool:
    """Start the container; ``False`` when ``deadline`` passes or ``cancel`` fires first. The
    start runs on the streaming client (no read timeout) on a thread: the control client's
    short timeout would report a slow start as an unresponsive engine."""
    box: list[Any] = []
    t = threading.Thread(target=_into, args=(box, lambda: streams.start(container_id)),
                         daemon=True, name="docker-start")
    t.start()
    while t.is_alive():
        left = deadline - time.monotonic()
        if left <= 0 or (cancel is not None and cancel.cancelled):
            return False
        t.join(min(left, 0.05))
    if isinstance(box[0], BaseException):
        raise box[0]
    return True


def _wait(container: Any, remaining: float, cancel: CancelToken | None
          ) -> tuple[dict[str, Any] | None, bool]:
    """The container's wait result (``None`` on the deadline) and whether ``cancel`` fired
    first; the wait runs on a thread so a cancellation is seen within 50 ms."""
    box: list[Any] = []
    t = threading.Thread(target=_into, args=(box, lambda: container.wait(timeout=remaining)),
                         daemon=True, name="docker-wait")
    t.start()
    while t.is_alive():
        if cancel is not None and cancel.wait(0.05):
            return None, True
        t.join(0.05 if cancel is not None else None)
    got = box[0]
    if isinstance(got, requests.exceptions.ReadTimeout | requests.exceptions.ConnectionError):
        return None, False
    if isinstance(got, BaseException):
        raise got
    return dict(got), False


def run_once(client: docker.DockerClient, streams: docker.APIClient, image: str,
             argv: list[str], env: dict[str, str], cwd: str, hard: Hardening,
             mounts: list[Mount], limits: tuple[int, int], deadline: float,
             cgroup_parent: str | None = None, cancel: CancelToken | None = None,
             stdin: bytes | None = None, disk_write: int | None = None,
             user: str = SANDBOX_USER,
             on_output: Callable[[str, bytes], None] | None = None) -> Outcome:
    """Create, attach, start, wait (until ``deadline`` or ``cancel``), remove; with
    ``cgroup_parent``, the CPU time the container used is read from it (``cpu.py``) and the
    parent removed. ``on_output`` sees each chunk of the attach stream as it comes."""
    out = Outcome(HeadTail(limits[0]), HeadTail(limits[1]), on_output=on_output)
    extra: dict[str, Any] = {"cgroup_parent": cgroup_parent} if cgroup_parent else {}
    if stdin is not None:
        # with detach=False the SDK also sets StdinOnce: EOF once our attachment closes
        extra["stdin_open"] = True
    container = client.containers.create(
        image, argv, environment=env, mounts=mounts, detach=stdin is None,
        **{**hard.create_kwargs(), "working_dir": cwd, "user": user, **extra},
    )
    try:
        stream = streams.attach(container.id, stdout=True, stderr=True, stream=True, demux=True)
        pump, errors = _start_pump(stream, out)
        feeder = (streams.attach_socket(container.id, params={"stdin": 1, "stream": 1})
                  if stdin is not None else None)
        out.started = time.time()
        try:
            if not _start_by(streams, container.id, deadline, cancel):
                # runc's own start-up runs in the container's cgroup: at a hundredth of a
                # core it takes minutes, and it is the call's time, not the engine's
                out.cancelled = cancel is not None and cancel.cancelled
                out.timed_out = not out.cancelled
                if cgroup_parent:  # the engine's kill waits for the start to finish
                    writequota.kill_members(cgroup_parent)
                with contextlib.suppress(docker.errors.APIError,
                                         requests.exceptions.RequestException):
                    container.kill()
                out.ended = time.time()
                return out
        except docker.errors.APIError as exc:
            code = _not_started(exc)
            if code is None:
                raise
            # the tool could not be executed: report it as a shell would (127 not found,
            # 126 not executable), like the proc executors and the pool's launcher
            out.feed("stderr", f"policy-engine: cannot execute `{argv[0]}`: "
                            f"{'not found' if code == 127 else 'not executable'}\n".encode())
            out.exit_code = code
            out.ended = time.time()
            return out
        if disk_write is not None and cgroup_parent:
            out.write_watch = writequota.watch_run_once(disk_write, cgroup_parent,
                                                        container.kill)
        if feeder is not None and stdin is not None:
            threading.Thread(target=_feed, args=(feeder, stdin), daemon=True,
                             name="docker-stdin").start()
        remaining = deadline - time.monotonic()
        result, out.cancelled = (_wait(container, remaining, cancel) if remaining > 0
                                 else (None, False))
        if result is not None:
            out.exit_code = int(result.get("StatusCode", -1))
        else:
            out.timed_out = not out.cancelled
            with contextlib.suppress(docker.errors.APIError):  # it may have just exited
                container.kill()
        pump.join(timeout=10)
        out.ended = time.time()
        if errors and not (out.timed_out or out.cancelled):
            raise map_error(errors[0])
        return out
    finally:
        out.close()
        if out.write_watch is not None:
            out.write_watch.stop()
        # never mask the result: a leftover container is visible in `docker ps -a`
        with contextlib.suppress(docker.errors.APIError, requests.exceptions.RequestException):
            container.remove(force=True)
        if cgroup_parent:
            out.cpu_ns = cpu.usage_ns(cgroup_parent)  # the exited child's usage stays here
            cpu.remove_parent(cgroup_parent)


def _not_started(exc: docker.errors.APIError) -> int | None:
    """127 or 126 when the runtime could not execute the command itself, else ``None``."""
    text = str(getattr(exc, "explanation", None) or exc).lower()
    if "executable file not found" in text or "no such file or directory" in text:
        return 127
    if "permission denied" in text:
        return 126
    return None


def exec_in(client: docker.DockerClient, streams: docker.APIClient, container_id: str,
            argv: list[str], env: dict[str, str], cwd: str, limits: tuple[int, int],
            deadline: float, cancel: CancelToken | None = None,
            user: str = SANDBOX_USER, on_kill: Callable[[], None] | None = None,
            on_output: Callable[[str, bytes], None] | None = None) -> Outcome:
    """Run ``argv`` in a warm container as ``user`` (the container's own: uid 1000, or a bound
    tree's owner); kill every sandbox process on timeout, first calling ``on_kill`` (the pool
    gives the container its CPU back: the kill runs in the call's cgroup too). ``on_output``
    sees each chunk of the exec's stream as it comes."""
    out = Outcome(HeadTail(limits[0]), HeadTail(limits[1]), on_output=on_output)
    api = client.api
    created = api.exec_create(container_id, argv, user=user, workdir=cwd,
                              environment=env, stdout=True, stderr=True)
    exec_id = created["Id"]
    out.started = time.time()
    # the exec's start-up runs in the container's cgroup: at a hundredth of a core it takes
    # minutes, so the start, like the run, ends at the deadline
    box: list[Any] = []
    starter = threading.Thread(target=_into, daemon=True, name="docker-exec-start", args=(
        box, lambda: streams.exec_start(exec_id, stream=True, demux=True)))
    starter.start()
    pump: threading.Thread | None = None
    errors: list[BaseException] = []
    while time.monotonic() < deadline:
        if cancel is not None and cancel.cancelled:
            out.cancelled = True
            break
        if pump is None and not starter.is_alive():
            if isinstance(box[0], BaseException):
                raise map_error(box[0])
            pump, errors = _start_pump(box[0], out)
        if pump is not None and not pump.is_alive():
            break
        (pump or starter).join(timeout=min(0.05, max(0.0, deadline - time.monotonic())))
    if pump is None or pump.is_alive():
        out.timed_out = not out.cancelled
        if on_kill is not None:
            on_kill()
        run_quiet(client, container_id, list(KILL_ALL), timeout_s=10, user=user)
        if pump is not None:
            pump.join(timeout=10)
    out.ended = time.time()
    out.close()
    if errors and not (out.timed_out or out.cancelled):
        raise map_error(errors[0])
    if not (out.timed_out or out.cancelled):
        out.exit_code = _exit_code(api, exec_id)
    return out


def _into(box: list[Any], call: Callable[[], Any]) -> None:
    """``call()``'s result, or what it raised, appended to ``box`` (for a thread)."""
    try:
        box.append(call())
    except BaseException as exc:  # noqa: BLE001 -- handed to the caller
        box.append(exc)


def _exit_code(api: docker.APIClient, exec_id: str) -> int | None:
    for _ in range(50):  # the stream can end a moment before the exec is marked finished
        info = api.exec_inspect(exec_id)
        if not info.get("Running"):
            code = info.get("ExitCode")
            return int(code) if code is not None else None
        time.sleep(0.01)
    return None


def run_quiet(client: docker.DockerClient, container_id: str, argv: list[str],
              timeout_s: float = 30, user: str = SANDBOX_USER) -> int | None:
    """Run a housekeeping command as ``user`` (the container's) and return its exit code
    (output discarded)."""
    api = client.api
    created = api.exec_create(container_id, argv, user=user, stdout=True, stderr=True)
    end = time.monotonic() + timeout_s
    api.exec_start(created["Id"], stream=False, demux=False)
    while time.monotonic() < end:
        info = api.exec_inspect(created["Id"])
        if not info.get("Running"):
            code = info.get("ExitCode")
            return int(code) if code is not None else None
        time.sleep(0.01)
    return None
