"""The `docker` executor: proc.exec in a hardened container, run-once or on a warm pool.

Every call gets ``projects/<project_id>/artifacts/<exec_id>`` with ``stdout.txt``,
``stderr.txt``, ``manifest.json`` and ``meta.json`` (policy snapshot, exit code, mounts, image,
timings), written even when the call times out or its artifacts are over the limit.

Network ``off`` is ``--network=none``; ``restricted`` keeps that and adds the host-side policy
proxy through an in-container bridge (``network.py``), in both modes; ``on`` is refused.
Containers run on the configured OCI runtime; a profile requiring ``isolation gvisor`` runs on the
gVisor one (``runtimes.py``), with a warm pool per runtime.
"""

from __future__ import annotations

import base64
import binascii
import logging
import posixpath
import shutil
import signal
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from plugins.executor_docker import (
    cpu,
    engine,
    identity,
    interpreter,
    masks,
    network,
    runtimes,
    setid,
    transfer,
    writequota,
)
from plugins.executor_docker.bound import (
    binds_of,
    bound_note,
    bound_refusal,
    bound_root,
    root_refusal,
)
from plugins.executor_docker.engine import SANDBOX_USER, DockerOptions, Hardening
from plugins.executor_docker.pool import Slot, WarmPool
from plugins.executor_docker.runner import (
    KILL_ALL,
    Outcome,
    bind_mounts,
    exec_in,
    run_once,
    run_quiet,
)
from plugins.executor_docker.workspace import (
    ExecWorkspace,
    collect_artifacts,
    default_root,
    prepare,
    project_id,
    write_record,
)
from plugins.executor_proc import spec
from plugins.executor_proc.seccomp import unix_filter
from policy_engine.config import default_state_dir
from policy_engine.errors import BackendRefusal, ErrorCode, PolicyEngineError
from policy_engine.executor import ExecContext, ExecutorCapabilities, refusal_of
from policy_engine.guard.env import profile_env_refusal
from policy_engine.guard.gitfiles import GIT_PINS
from policy_engine.lazy import lazy_module
from policy_engine.model import (
    SYSTEM_DEFAULT_LIMITS,
    ExecOp,
    ExecResult,
    Isolation,
    NetworkMode,
    OpKind,
    ProcExecOp,
    Profile,
    SideEffect,
    SideEffectRec,
    Usage,
)
from policy_engine.netproxy import SANDBOX_DIR, RestrictedHandle
from policy_engine.sandbox.artifacts import ARTIFACTS_ENV, artifacts_dir

if TYPE_CHECKING:
    import docker
    import docker.errors
    import requests.exceptions
else:  # the SDK on first use: a start that runs no container does not import it
    docker = lazy_module("docker")
    requests = lazy_module("requests")

# GIT_PINS: git never runs a program a workspace file names (repo config, hooks, ~/.gitconfig)
BASE_ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": "/workspace/work",
            "LANG": "C.UTF-8", **GIT_PINS}
_UNIX_FILTER = unix_filter().hex()  # a pooled command's, with network off (``_exec_warm``)
log = logging.getLogger(__name__)


def session_key(profile: Profile) -> str:
    """Warm containers are bound per tenant, subject and tool (the caller's session)."""
    return f"{profile.tenant}\x1f{profile.subject_id}\x1f{profile.tool_name}"


def bound_key(tenant: str, subject_id: str, root: str) -> str:
    """A bound call's warm container is its root's own (a session's workspace)."""
    return f"{tenant}\x1f{subject_id}\x1fbound:{root}"


def _limit(ctx: ExecContext, name: str) -> int:
    """The call's effective limit ``name`` (``ctx.limits``: the permitting rule's included)."""
    value = getattr(ctx.limits, name)
    return int(value if value is not None else getattr(SYSTEM_DEFAULT_LIMITS, name))


def _cpu_ms(out: Outcome, hard: Hardening) -> tuple[int, str]:
    """CPU time to charge: the cgroup's figure, else wall time times the CPU quota (an upper
    bound, reported as such)."""
    if out.cpu_ns is not None:
        return out.cpu_ns // 1_000_000, "cgroup"
    return int(out.duration_ms * max(hard.nano_cpus / 1e9, 1.0)), "wall-time bound"


def _stdin(raw: str | None, ctx: ExecContext) -> bytes | None:
    """The call's stdin; second line after the guard (base64, at most ``bytes_in``)."""
    if raw is None:
        return None
    try:
        data = base64.b64decode(raw, validate=True)
    except (binascii.Error, ValueError):
        raise PolicyEngineError(ErrorCode.SCHEMA_VALIDATION_FAILED,
                                "`stdin_b64` is not valid base64") from None
    if len(data) > _limit(ctx, "max_bytes_in"):
        raise PolicyEngineError(ErrorCode.CAPABILITY_BLOCKED,
                                f"stdin of {len(data)} bytes exceeds max_bytes_in")
    return data


def _cwd(raw: str | None) -> str:
    if raw is None:
        return "/workspace/work"
    path = raw if raw.startswith("/") else f"/workspace/work/{raw}"
    norm = posixpath.normpath(path)
    if "\0" in raw or not (norm == "/workspace/work" or norm.startswith("/workspace/work/")):
        raise PolicyEngineError(ErrorCode.CAPABILITY_BLOCKED,
                                f"cwd `{raw[:200]}` is outside /workspace/work")
    return norm


def _env(extra: dict[str, str], profile: Profile, tool: str) -> dict[str, str]:
    for key, value in extra.items():
        if not key or "=" in key or "\0" in key or "\0" in value:
            raise PolicyEngineError(ErrorCode.SCHEMA_VALIDATION_FAILED,
                                    f"invalid environment variable `{key[:100]}`")
    # second line: the guard decided the env against the policy's allow-lists, which the
    # profile's capabilities carry
    why = profile_env_refusal(profile, tool, extra) if extra else None
    if why is not None:
        raise PolicyEngineError(ErrorCode.CAPABILITY_BLOCKED, why)
    return {**BASE_ENV, **extra}


def _container_facts_refusal(profile: Profile, op: ProcExecOp, workspace_root: str | None,
                             state_dir: Path) -> PolicyEngineError | None:
    """What ``execute`` refuses from the container's view alone (docker view, never the
    host's disk at the op's paths): a cwd outside the container's ``/workspace/work``, and a
    workspace root beneath ``root_fs`` (``default_root``: outsider N6, the dry run agrees)."""
    try:
        _cwd(op.cwd)
        if not workspace_root:
            default_root(state_dir, profile)
    except PolicyEngineError as exc:
        return PolicyEngineError(exc.code, f"{exc.reason} (docker view)", audit=exc.audit)
    return None


class DockerExecutor:
    """Serves proc.exec in containers with the seed 002 §4 flags."""

    name = "docker"
    capabilities = ExecutorCapabilities(
        op_kinds=frozenset({OpKind.PROC_EXEC}),
        network_modes=frozenset({NetworkMode.OFF, NetworkMode.RESTRICTED}),
        bind_mounts=True, readonly_rootfs=True, resource_limits=True, env_filtering=True,
        streaming_output=True, mandatory_denies=True,
    )
    charges_at_start = True  # ctx.started() before a workspace or container is made

    def __init__(self, options: DockerOptions | None = None,
                 state_dir: Path | None = None,
                 mode: Literal["strict", "compat"] = "strict", warm_ahead: bool = True) -> None:
        """:param state_dir: holds ``docker/projects/`` unless ``options.workspace_root`` is
        set (default ``$POLICY_ENGINE_STATE`` or ``./var``).
        :param warm_ahead: start the system trees' mask walk now (``EngineConfig.warm_ahead``);
            else the first call's ``spec.system_masks`` starts it.
        :param mode: the engine's; strict refuses a bound call on a root-owned tree where no
            id-mapped bind can be made, compat runs it with that tree unwritable
            (``identity.py``).
        :raises ValueError: a configured OCI runtime is not registered with dockerd, or dockerd
            cannot be asked (only checked when ``runtime``/``gvisor_runtime`` is set)."""
        self.options = options or DockerOptions()
        self.mode = mode
        self.state_dir = state_dir if state_dir is not None else default_state_dir()
        # the state directory whose facts `refusal` judges: the run's own, also when a dry run
        # built this executor in a throwaway one (explain.backend.judge_in_state_dir)
        self.view_state_dir = self.state_dir
        self._lock = threading.Lock()
        self._client: docker.DockerClient | None = None
        self._streams: docker.APIClient | None = None
        self._pools: dict[str | None, WarmPool] = {}  # one per OCI runtime: never mixed
        self._cgroups: dict[str, str | None] = {}  # warm container id -> its cgroup (cpu.py)
        self.daemon_cpus = 0  # the daemon's CPU count, read on connecting (0: not yet known)
        self.runtimes = self._check_runtimes()
        if self.options.system_binds and warm_ahead:
            spec.prewarm()  # the system trees' mask walk (masks.py), off the first call's path
        if self.runtimes.gvisor is not None:
            self.capabilities = replace(DockerExecutor.capabilities,
                                        isolation=frozenset({Isolation.GVISOR}))

    def _check_runtimes(self) -> runtimes.RuntimePlan:
        """At start-up: the configured runtimes exist (else ``ValueError`` naming those that
        do); without any configured, dockerd is not contacted here."""
        if self.options.runtime is None and self.options.gvisor_runtime is None:
            return runtimes.RuntimePlan()
        try:
            client = engine.connect(self.options)
        except PolicyEngineError as exc:
            raise ValueError(f"docker: cannot check the configured runtimes: {exc.reason}"
                             ) from None
        try:
            return runtimes.probe(client, self.options)
        finally:
            client.close()

    # --- engine and pool ---------------------------------------------------------------------

    def client(self) -> tuple[docker.DockerClient, docker.APIClient]:
        """The control client (short timeout) and the streaming client (no read timeout)."""
        with self._lock:
            if self._client is None or self._streams is None:
                client = engine.connect(self.options)
                engine.check_image(client, self.options.image)
                if self.runtimes != runtimes.RuntimePlan():
                    try:  # dockerd may have restarted without them since start-up
                        self.runtimes = runtimes.probe(client, self.options)
                    except ValueError as exc:
                        client.close()
                        raise PolicyEngineError(ErrorCode.PROVIDER_UNAVAILABLE,
                                                str(exc)) from None
                self._client = client
                self._streams = docker.APIClient(base_url=self.options.base_url, timeout=86400)
                self.daemon_cpus = _daemon_cpus(client)
            elif self.options.base_url.startswith("unix://"):
                sock = self.options.base_url.removeprefix("unix://")
                if not Path(sock).exists():
                    raise PolicyEngineError(ErrorCode.PROVIDER_UNAVAILABLE,
                                            f"docker engine socket `{sock}` is gone")
            return self._client, self._streams

    def pool(self, runtime: str | None = None) -> WarmPool:
        """The warm pool of containers on ``runtime``, started on first use with the
        system-default limits (a gVisor call never gets a runc container, nor the reverse)."""
        client, _ = self.client()
        with self._lock:
            if runtime not in self._pools:
                hard = Hardening(
                    network_mode="none", pids_limit=int(SYSTEM_DEFAULT_LIMITS.pids or 256),
                    mem_limit=int(SYSTEM_DEFAULT_LIMITS.memory_bytes or 1 << 30),
                    nano_cpus=int((SYSTEM_DEFAULT_LIMITS.cpu_cores or 1.0) * 1e9),
                    runtime=runtime,
                    gvisor=runtime is not None and runtime == self.runtimes.gvisor)
                launcher = self.options.pool_launcher and network.python_bound(
                    self.options.system_binds)
                pool = WarmPool(client, self.options.image, self.options.pool_size, hard,
                                bind_mounts(self.options.system_binds, []),
                                pool_id=f"{id(self)}:{runtime or 'default'}", launcher=launcher,
                                updatable=not hard.gvisor, idle_s=self.options.pool_idle_s)
                try:
                    pool.start()
                except BaseException:
                    pool.close()
                    raise
                self._pools[runtime] = pool
            return self._pools[runtime]

    def end_session(self, profile: Profile) -> None:
        """Release the caller's warm container: it is discarded, a fresh one takes its slot."""
        self.release_session(profile.tenant, profile.subject_id, profile.tool_name)

    def prewarm_bound(self, tenant: str, subject_id: str, work: str, root: str) -> bool:
        """Make a bound session's own warm container now (a session is created: its first
        call then finds it), with ``work`` bound read-write (what its calls' profiles bind: a
        call binding other paths re-makes it), on the default runtime, in pool mode only.
        ``False``: nothing made (run-once, or a path that may not be bound)."""
        if self.options.mode != "pool" or root_refusal(
                work, self.options.system_binds, str(self._docker_root(self.state_dir))):
            return False
        try:  # the identity its calls get: the workspace (root's) through an id-mapped bind
            ident = identity.plan(((work, False),), [], self.options, self.mode,
                                  self.runtimes.default is not None
                                  and self.runtimes.default == self.runtimes.gvisor)
        except PolicyEngineError:
            return False  # its first call says why
        pool = self.pool(self.runtimes.default)
        slot = self._acquire_bound(pool, bound_key(tenant, subject_id, root), ident,
                                   [(work, work, False)], [], 60)
        pool.done(slot)
        return True

    def _acquire_bound(self, pool: WarmPool, key: str, ident: identity.BoundIdentity,
                       binds: list[tuple[str, str, bool]], masked: list[Any],
                       timeout_s: float) -> Slot:
        """A bound session's warm container, made with ``binds`` (root's writable ones through
        their id-mapped mounts, which live as long as it) and the ``masked`` mounts over them."""
        def make() -> tuple[tuple[Any, ...], identity.Detach | None, str | None]:
            mapped, detach, note = identity.mount(ident, binds, self.mode)
            return (*bind_mounts([], mapped), *masked), detach, note

        return pool.acquire_bound(key, tuple(self.bound_extra(binds, masked)), timeout_s,
                                  user=ident.user, ident=ident.key, make=make)

    @staticmethod
    def bound_extra(binds: list[tuple[str, str, bool]], masked: list[Any]) -> list[Any]:
        """The mounts a bound session's container is made with (and compared by)."""
        return [*bind_mounts([], binds), *masked]

    def release_bound(self, tenant: str, subject_id: str, root: str) -> int:
        """A bound session ends (docs/sessions.md): its own warm containers on every runtime
        are removed, and its project's per-exec records (``meta.json`` with the argv — the
        session's code in plain text — and the output kept in ``stdout.txt``/``stderr.txt``),
        which outlived the session before; answers how many containers were held."""
        key = bound_key(tenant, subject_id, root)
        with self._lock:
            pools = list(self._pools.values())
        held = 0
        for pool in pools:
            held += pool.holds(key)
            pool.release(key)
        # fd-based on Linux: a link the container left among its artifacts is removed, never
        # followed
        shutil.rmtree(self._docker_root(self.state_dir) / "projects"
                      / project_id(tenant, subject_id, root), ignore_errors=True)
        return held

    def start_interpreter(self, ctx: ExecContext, op: ExecOp,
                          lifetime_s: float) -> interpreter.DockerInterpreter:
        """A live Python interpreter in a stateful session's own container (interpreter.py)."""
        return interpreter.start(self, ctx, self._admit(ctx, op), lifetime_s)

    def _admit(self, ctx: ExecContext, op: ExecOp) -> ProcExecOp:
        """``op`` when this executor serves it and its own second-line checks pass."""
        if not isinstance(op, ProcExecOp):
            raise PolicyEngineError(ErrorCode.EXECUTION_FAILED,
                                    f"the docker executor does not serve `{op.kind}`")
        refused = refusal_of(self, ctx.profile, op)
        if refused is not None:
            raise refused
        return op

    def release_session(self, tenant: str, subject_id: str, tool_name: str) -> None:
        """The session-end call (the sessions feature calls it when a session closes; until
        then ``pool_idle_s`` gives an idle session's container back): the session's warm
        containers on every runtime are discarded and replaced. No-op for an unknown one."""
        key = f"{tenant}\x1f{subject_id}\x1f{tool_name}"
        with self._lock:
            pools = list(self._pools.values())
        for pool in pools:
            pool.release(key)

    def close(self) -> None:
        with self._lock:
            pools, self._pools = list(self._pools.values()), {}
            client, self._client = self._client, None
            streams, self._streams = self._streams, None
        for pool in pools:
            pool.close()
        for c in (client, streams):
            if c is not None:
                c.close()

    # --- execute -----------------------------------------------------------------------------

    def refusal(self, profile: Profile, op: ExecOp) -> PolicyEngineError | None:
        """What ``execute`` refuses from the profile, the op and the options alone (the
        executor SPI's ``refusal``: the backend selection asks it, so the dry run answers it).
        The runtime a required isolation needs is the selection's own check (capabilities)."""
        if not isinstance(op, ProcExecOp):
            return None
        if (op.stdin_b64 is not None and self.options.mode == "pool"
                and not self.options.pool_launcher):
            # `docker exec` streams are read-only here; the launcher and run-once take stdin
            return BackendRefusal(ErrorCode.CAPABILITY_BLOCKED, "stdin is not offered by "
                                  "the docker executor with `pool_launcher: false`")
        refused = engine.network_refusal(profile, self.options)
        if refused is not None:
            return refused
        if profile.network is NetworkMode.RESTRICTED:
            try:
                network.check_bridge_binds(self.options.system_binds)
            except PolicyEngineError as exc:
                return exc
        if bound_root(op):
            return bound_refusal(profile, op, self.options.system_binds,
                                 str(self._docker_root(self.view_state_dir))
                                 ) or identity.strict_refusal(binds_of(profile), self.options,
                                                              self.mode, self._on_gvisor(profile))
        return _container_facts_refusal(profile, op, self.options.workspace_root,
                                        self.view_state_dir)

    def _on_gvisor(self, profile: Profile) -> bool:
        """Whether ``profile``'s calls run on the gVisor runtime (a profile requiring one this
        executor lacks is the backend selection's refusal, not this one's)."""
        try:
            runtime = runtimes.for_profile(profile, self.runtimes)
        except PolicyEngineError:
            return False
        return runtime is not None and runtime == self.runtimes.gvisor

    def _docker_root(self, state_dir: Path) -> Path:
        """Where ``projects/`` lie (a bound root may neither hold nor lie in it)."""
        return (Path(self.options.workspace_root) if self.options.workspace_root
                else (state_dir / "docker").absolute())

    def fact_notes(self, profile: Profile, op: ExecOp) -> list[str]:
        """What the dry run's trace says of the facts this executor judged (its view)."""
        if not isinstance(op, ProcExecOp):
            return []
        cwd, bound = self._placement(profile, op)
        env = f"; the engine sets {ARTIFACTS_ENV}=`{self._artifacts(cwd, bound)}`"
        if bound is not None:
            return [bound_note(profile, op) + env]
        return [f"cwd `{cwd}` lies in the container's workspace (docker view: the "
                "container's filesystem, not this host's)" + env]

    @staticmethod
    def _placement(profile: Profile, op: ProcExecOp) -> tuple[str, str | None]:
        """The call's cwd in the container and its bound root (``None``: the project's
        ``/workspace/work``)."""
        if bound_root(op):
            return posixpath.normpath(str(op.cwd)), posixpath.normpath(profile.mappings.root_fs)
        return _cwd(op.cwd), None

    @staticmethod
    def _artifacts(cwd: str, bound: str | None) -> str:
        """The engine's artifacts directory of a call: the per-exec one mounted at
        ``/workspace/artifacts``, or a bound call's beneath its cwd (a session's files)."""
        return artifacts_dir(cwd) if bound is not None else "/workspace/artifacts"

    def execute(self, ctx: ExecContext, op: ExecOp) -> ExecResult:
        op = self._admit(ctx, op)
        stdin = _stdin(op.stdin_b64, ctx)
        profile = ctx.profile
        runtime = runtimes.for_profile(profile, self.runtimes)
        hard = engine.hardening(profile, self.options, ctx.limits, runtime=runtime,
                                gvisor=runtime is not None and runtime == self.runtimes.gvisor)
        if self.options.mode != "pool" and profile.network is NetworkMode.OFF:
            # nothing in a run-once container needs AF_UNIX then (engine.Hardening.deny_unix)
            hard = replace(hard, deny_unix=True)
        cwd, bound = self._placement(profile, op)
        env = {**_env(op.env, profile, op.tool), ARTIFACTS_ENV: self._artifacts(cwd, bound)}
        if bound is not None:
            env["HOME"] = cwd  # the container's /workspace/work is not there
        # ctx.limits.timeout_ms already holds the profile's (or a rule's replacing a built-in)
        timeout_s = min((t for t in (op.timeout_ms, ctx.limits.timeout_ms) if t),
                        default=profile.timeout_ms) / 1000
        deadline = min(ctx.deadline, time.monotonic() + timeout_s)
        binds = binds_of(profile) if bound is not None else ()
        # who writes a bound call's files, and through which binds: never a chown
        ident = (identity.plan(binds, masks.masked(profile, [p for p, ro in binds if not ro]),
                               self.options, self.mode, hard.gvisor)
                 if bound is not None else identity.BoundIdentity(SANDBOX_USER))
        ctx.started()  # refusals above (stdin, cwd, env, network mode) created nothing
        client, streams = self.client()
        hard = hard.on_host_of(self.daemon_cpus)
        root = (Path(self.options.workspace_root) if self.options.workspace_root
                else default_root(self.state_dir, profile))
        ws = prepare(root, profile, bound, binds)
        argv = [op.tool, *op.args]
        limits = (_limit(ctx, "max_stdout_bytes"), _limit(ctx, "max_stderr_bytes"))
        art_limit = self.options.max_artifacts_bytes
        removed: list[str] = []
        proxied: dict[str, int] | None = None
        for attempt in range(engine.START_ATTEMPTS):
            try:
                if self.options.mode == "pool":
                    out, mounts, removed, proxied = self._pooled(
                        ctx, ws, hard, argv, env, cwd, limits, deadline, op.stdin_b64, ident)
                else:
                    out, mounts, proxied = self._run_once(ctx, ws, hard, argv, env, cwd,
                                                          limits, deadline, stdin, ident)
                break
            except Exception as exc:  # noqa: BLE001 -- every failure leaves with a registry code
                err = engine.map_error(exc)
                if (attempt + 1 < engine.START_ATTEMPTS and engine.mount_raced(err)
                        and not ctx.cancel.cancelled and time.monotonic() < deadline):
                    # a masked path vanished between the plan and the start: plan again
                    log.info("docker: a mount failed at the container's start, planning "
                             "again (%s)", str((err.audit or {}).get("error", ""))[-200:])
                    continue
                raise err from None
        # third line after seccomp and the 0700 project: no set-id file or device node stays
        stripped = [f"work/{p}" for p in setid.sweep(ws.work)]
        stripped += [f"{top}/{p}" for top, ro in ws.binds if not ro  # a bound call's
                     for p in setid.sweep(Path(top))]
        stripped += [f"artifacts/{p}" for p in setid.sweep(ws.artifacts)]
        manifest, over = collect_artifacts(ws, art_limit)
        removed += over
        meta = self._meta(profile, ctx, hard, ws, out, argv, cwd, env, mounts, removed)
        if proxied is not None:
            meta["network_proxy"] = proxied
        if bound is not None:  # the container's uid:gid (the tree's owner, or uid 1000)
            meta["policy_snapshot"]["container"]["user"] = ident.user
        if out.degraded:
            meta["degraded"] = [out.degraded]
        if stripped:
            meta["setid_stripped"] = stripped[:100]
        write_record(ws, out.stdout.kept(), out.stderr.kept(), manifest, meta)
        audit = {"exec_id": ws.exec_id, "artifacts_dir": str(ws.artifacts)}
        ctx.record_side_effect(SideEffectRec(kind=SideEffect.PROCESS, meta={
            "backend": "docker", "tool": op.tool, "exit_code": out.exit_code,
            "exec_id": ws.exec_id, "artifacts": len(manifest)}))
        if out.write_watch is not None and out.write_watch.over():
            raise PolicyEngineError(ErrorCode.BUDGET_EXCEEDED,
                                    out.write_watch.message("disk_write"),
                                    audit={**audit, "disk_write_bytes": out.write_watch.used})
        if out.exit_code == 128 + signal.SIGXFSZ:
            raise PolicyEngineError(
                ErrorCode.BUDGET_EXCEEDED, "disk quota exceeded: a file written reached the "
                f"{self.options.max_file_bytes}-byte limit (docker option `max_file_bytes`)",
                audit=audit)
        if out.cancelled:
            raise PolicyEngineError(ErrorCode.EXECUTION_FAILED,
                                    f"process cancelled: {ctx.cancel.reason or 'cancelled'}",
                                    audit=audit)
        if out.timed_out:
            raise PolicyEngineError(ErrorCode.TIMEOUT,
                                    f"process exceeded its {timeout_s:g}s wall time and was "
                                    "killed", audit=audit)
        if removed:
            raise PolicyEngineError(
                ErrorCode.CAPABILITY_BLOCKED,
                f"artifacts exceed the {art_limit}-byte limit; {len(removed)} removed",
                audit={**audit, "removed": removed[:100]})
        cpu_ms, cpu_source = _cpu_ms(out, hard)
        used = Usage(calls=1, cpu_ms=cpu_ms, bytes_out=sum(int(e["size"]) for e in manifest))
        return ExecResult(ok=True, out={
            "exit_code": out.exit_code, "exec_id": ws.exec_id,
            "stdout": out.stdout.kept().decode("utf-8", "replace"),
            "stderr": out.stderr.kept().decode("utf-8", "replace"),
            "stdout_truncated": out.stdout.truncated, "stderr_truncated": out.stderr.truncated,
            "stdout_bytes": out.stdout.total, "stderr_bytes": out.stderr.total,
            "artifacts_dir": str(ws.artifacts), "artifacts": manifest,
            "duration_ms": out.duration_ms, "mode": self.options.mode,
            "cpu_ms": cpu_ms, "cpu_source": cpu_source,
            **({"degraded": [out.degraded]} if out.degraded else {}),
        }, used=used)

    def _run_once(self, ctx: ExecContext, ws: ExecWorkspace, hard: Hardening, argv: list[str],
                  env: dict[str, str], cwd: str, limits: tuple[int, int], deadline: float,
                  stdin: bytes | None, ident: identity.BoundIdentity
                  ) -> tuple[Outcome, list[dict[str, Any]], dict[str, int] | None]:
        client, streams = self.client()
        # a root-owned writable bind comes from its id-mapped mount, made for this container
        binds, detach, note = identity.mount(ident, ws.mounts(), self.mode)
        try:
            return self._run_once_bound(ctx, ws, hard, argv, env, cwd, limits, deadline, stdin,
                                        ident.user, binds, note)
        finally:
            if detach is not None:
                detach()

    def _run_once_bound(self, ctx: ExecContext, ws: ExecWorkspace, hard: Hardening,
                        argv: list[str], env: dict[str, str], cwd: str, limits: tuple[int, int],
                        deadline: float, stdin: bytes | None, user: str,
                        binds: list[tuple[str, str, bool]], note: str | None
                        ) -> tuple[Outcome, list[dict[str, Any]], dict[str, int] | None]:
        client, streams = self.client()
        mounts = bind_mounts(self.options.system_binds, binds)
        mounts += masks.mask_mounts(ctx.profile, [m for m in ws.mounts() if "/artifacts" not in
                                                  m[1]], self.options.system_binds,
                                    masks.engine_state(ctx))
        net: RestrictedHandle | None = None
        if network.needs_proxy(ctx):
            net = network.start_proxy(ctx, deadline)
            mounts.append(network.runtime_mount(net))
            env, argv = {**env, **net.env()}, net.wrap_argv(argv)
        proxied: dict[str, int] | None = None
        try:
            out = run_once(client, streams, self.options.image, argv, env, cwd, hard, mounts,
                           limits, deadline, cgroup_parent=cpu.parent_for(ws.exec_id),
                           cancel=ctx.cancel, stdin=stdin,
                           disk_write=_limit(ctx, "disk_write_bytes"), user=user,
                           on_output=ctx.on_output)
            out.degraded = note
        finally:
            if net is not None:
                proxied = network.record_effects(ctx, net)
                net.close()
        shown = [{"source": m.get("Source"), "target": m["Target"], "read_only": m["ReadOnly"]}
                 for m in mounts]
        return out, shown, proxied

    def _pooled(self, ctx: ExecContext, ws: ExecWorkspace, hard: Hardening, argv: list[str],
                env: dict[str, str], cwd: str, limits: tuple[int, int], deadline: float,
                stdin_b64: str | None, ident: identity.BoundIdentity
                ) -> tuple[Outcome, list[dict[str, Any]], list[str], dict[str, int] | None]:
        pool = self.pool(hard.runtime)
        client, streams = self.client()
        left = max(0.0, deadline - time.monotonic())
        if ws.bound is not None:
            # a warm container cannot get a mount later: the root's own, made on its first
            # call, with the masks of this call (re-made when they change)
            binds = [(p, p, ro) for p, ro in ws.binds]
            slot = self._acquire_bound(
                pool, bound_key(ctx.profile.tenant, ctx.profile.subject_id, ws.bound), ident,
                binds, masks.mask_mounts(ctx.profile, binds, self.options.system_binds,
                                         masks.engine_state(ctx)), left)
        else:
            slot = pool.acquire(session_key(ctx.profile), left, tuple(
                masks.mask_mounts(ctx.profile, [], self.options.system_binds,
                                  masks.engine_state(ctx))))
        try:
            slot = pool.update_limits(slot, hard)
            return self._in_slot(ctx, ws, slot, client, streams, argv, env, cwd, limits,
                                 deadline, stdin_b64)
        finally:
            pool.done(slot)  # the session's idle clock starts (pool_idle_s)

    def _in_slot(self, ctx: ExecContext, ws: ExecWorkspace, slot: Slot,
                 client: docker.DockerClient, streams: docker.APIClient, argv: list[str],
                 env: dict[str, str], cwd: str, limits: tuple[int, int], deadline: float,
                 stdin_b64: str | None
                 ) -> tuple[Outcome, list[dict[str, Any]], list[str], dict[str, int] | None]:
        if not slot.dirty_inputs:
            slot.dirty_inputs = transfer.put_inputs(
                client, slot.container_id, ws.inputs,
                masks.hidden_inputs(ctx.profile, str(ws.inputs)))
        net: RestrictedHandle | None = None
        if network.needs_proxy(ctx):
            net = network.start_proxy(ctx, deadline, slot_dir=slot.net_dir, pooled=True)
            env, argv = {**env, **net.env()}, net.wrap_argv(argv)
        proxied: dict[str, int] | None = None
        cgroup = self._cgroup_of(slot.container_id)
        before = cpu.usage_ns(cgroup) if cgroup else None
        try:
            # cancel is handled inside (the launcher or exec_in kills the call's processes
            # before returning); the slot's lock keeps a session's next call out until then
            if not slot.running.acquire(timeout=max(0.0, deadline - time.monotonic())):
                raise PolicyEngineError(ErrorCode.PROVIDER_UNAVAILABLE,
                                        "the session's warm container ran another command of "
                                        "the session until this call's deadline")
            watch = writequota.watch_warm(
                _limit(ctx, "disk_write_bytes"), cgroup,
                lambda: run_quiet(client, slot.container_id, list(KILL_ALL), timeout_s=10,
                                  user=slot.user)
            ) if cgroup else None
            try:
                out, changed = self._exec_warm(slot, client, streams, argv, env, cwd, limits,
                                               deadline, ctx, stdin_b64)
            finally:
                if watch is not None:
                    watch.stop()
                slot.running.release()
            out.write_watch = watch
            out.degraded = slot.note
        finally:
            if net is not None:
                proxied = network.record_effects(ctx, net)
                net.close()
        after = cpu.usage_ns(cgroup) if cgroup else None
        if before is not None and after is not None:
            out.cpu_ns = max(0, after - before)  # one command at a time per warm container
        removed: list[str] = []
        if changed:
            removed = transfer.fetch_artifacts(client, slot.container_id, ws.artifacts,
                                               self.options.max_artifacts_bytes)
            run_quiet(client, slot.container_id,
                      ["/usr/bin/find", transfer.ARTIFACTS_DIR, "-mindepth", "1", "-delete"])
        mounts = [{"source": p, "target": p, "read_only": True}
                  for p in self.options.system_binds]
        mounts.append({"container": slot.container_id[:12], "inputs": "copied in, read-only",
                       "work": ([{"source": p, "target": p, "read_only": ro}
                                 for p, ro in ws.binds] if ws.bound else
                                "container-local for the session"),
                       "artifacts": "copied out to the per-exec directory"})
        if net is not None:
            mounts.append({"source": slot.net_dir, "target": SANDBOX_DIR,
                           "read_only": True})
        return out, mounts, removed, proxied

    @staticmethod
    def _exec_warm(slot: Slot, client: docker.DockerClient, streams: docker.APIClient,
                   argv: list[str], env: dict[str, str], cwd: str, limits: tuple[int, int],
                   deadline: float, ctx: ExecContext, stdin_b64: str | None
                   ) -> tuple[Outcome, bool]:
        """One command in the session's warm container: through its launcher, or an exec."""
        if slot.control is not None:
            # network off: the command gets no AF_UNIX socket (the launcher itself keeps its
            # control connection; the container's profile cannot refuse it to one process)
            off = ctx.profile.network is NetworkMode.OFF
            return slot.control.run(argv, env, cwd, limits, deadline, ctx.cancel, stdin_b64,
                                    _UNIX_FILTER if off else None, on_output=ctx.on_output)
        out = exec_in(client, streams, slot.container_id, argv, env, cwd, limits, deadline,
                      ctx.cancel, user=slot.user, on_kill=slot.on_kill,
                      on_output=ctx.on_output)
        # no process of the call outlives it (issue 32 item 3): a background child would run
        # on into the session's next call, outside any deadline or evidence; the launcher does
        # the same from PID 1 before it reports
        run_quiet(client, slot.container_id, list(KILL_ALL), timeout_s=10, user=slot.user)
        return out, bool(transfer.artifacts_changed(client, slot.container_id))

    def _cgroup_of(self, container_id: str) -> str | None:
        """The cgroup a warm container's CPU time is charged to (``None``: not readable);
        looked up once per container (an inspect costs milliseconds on the warm path)."""
        if container_id in self._cgroups:
            return self._cgroups[container_id]
        try:
            pid = int(self.client()[0].api.inspect_container(container_id)["State"]["Pid"])
        except Exception:  # noqa: BLE001 — no CPU figure is not a reason to fail the call
            return None
        found = cpu.of_process(pid) if pid > 0 else None
        if len(self._cgroups) > 256:  # containers are replaced over time: forget old ones
            self._cgroups.clear()
        self._cgroups[container_id] = found
        return found

    def _meta(self, profile: Profile, ctx: ExecContext, hard: Hardening, ws: ExecWorkspace,
              out: Outcome, argv: list[str], cwd: str, env: dict[str, str],
              mounts: list[dict[str, Any]], removed: list[str]) -> dict[str, Any]:
        return {
            "exec_id": ws.exec_id, "project_id": ws.project_id, "image": self.options.image,
            "mode": self.options.mode, "argv": argv, "cwd": cwd, "env_keys": sorted(env),
            "policy_snapshot": {
                "profile_hash": profile.profile_hash, "policy": profile.policy_name,
                "policy_version": profile.policy_version, "network": profile.network.value,
                "limits": ctx.limits.model_dump(exclude_none=True),
                "container": hard.snapshot(),
            },
            "exit_code": out.exit_code, "timed_out": out.timed_out,
            "stdout_truncated": out.stdout.truncated, "stderr_truncated": out.stderr.truncated,
            "stdout_bytes": out.stdout.total, "stderr_bytes": out.stderr.total,
            "mounts": mounts, "artifacts_removed": removed,
            "started_at": out.started, "ended_at": out.ended, "duration_ms": out.duration_ms,
        }


def _daemon_cpus(client: docker.DockerClient) -> int:
    """``docker info``'s ``NCPU`` (0 when the daemon does not say)."""
    try:
        return max(0, int(client.info().get("NCPU") or 0))
    except (docker.errors.DockerException, requests.exceptions.RequestException, OSError,
            TypeError, ValueError):
        return 0
