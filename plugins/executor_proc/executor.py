"""The `proc` executors: argv-only processes under bubblewrap, or under Landlock + seccomp alone."""

from __future__ import annotations

import base64
import binascii
import contextlib
import copy
import functools
import json
import logging
import os
import resource
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from plugins.executor_proc import (
    bwrap,
    cgroups,
    interpreter,
    landlock,
    native,
    owner,
    pidfd_exit,
    prespawn,
    sanitize,
    seccomp,
    spec,
    status_pipe,
    uid,
    unshare,
    writewatch,
)
from plugins.executor_proc.bwrap import NetworkHook
from plugins.executor_proc.cwdfacts import cwd_fact_note, cwd_fact_refusal
from plugins.executor_proc.limits import cpu_seconds, describe, preexec
from plugins.executor_proc.output import Outcome, pump
from plugins.executor_proc.spec import Limits, Plan, artifacts_note, build_plan, resolve_limits
from policy_engine import ErrorCode, PolicyEngineError
from policy_engine.capture import HeadTail
from policy_engine.errors import BackendRefusal
from policy_engine.executor import (
    Decider,
    ExecContext,
    ExecutorCapabilities,
    check_string_lists,
    refusal_of,
)
from policy_engine.guard.binds import beneath, bound_paths, one_view, state_masks
from policy_engine.model import (
    Digest,
    ExecOp,
    ExecResult,
    NetworkMode,
    OpKind,
    ProcExecOp,
    Profile,
    SideEffect,
    SideEffectRec,
    Usage,
)
from policy_engine.model.text import printable_path
from policy_engine.model.unchecked import assembled
from policy_engine.netproxy import RestrictedHandle, RestrictedNetwork
from policy_engine.sandbox import enginedirs

HERE = os.path.dirname(os.path.abspath(__file__))
Backend = Literal["bwrap", "landlock", "unshare"]

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class ProcOptions:
    """Validated ``proc`` plugin options.

    :param env_allow: extra environment keys a call may set (values come from the op).
    :param env_base: fixed values for the base keys (``LANG``, ``TZ``, ``PATH``).
    :param extra_ro_binds: host trees to expose read-only (e.g. a toolchain under /opt).
    :param layer2: inside bwrap, also apply Landlock + seccomp through the launcher.
    :param python: interpreter that runs the launcher (its prefix is bound read-only).
    :param cgroups: make a per-exec cgroup when possible (else rlimits only).
    :param launcher: ``native`` (the C launcher, built once with gcc and cached) or ``python``
        (the reference launcher: same rules, ~60 ms slower per call). Without gcc, ``native``
        refuses calls in strict mode and runs the Python launcher, recorded as degraded, in
        compat mode.
    :param launcher_cache: where the native launcher is cached (default: ``native.py``).
    :param max_file_bytes: disk quota of a call: no file it writes grows past this many bytes
        (RLIMIT_FSIZE; a process killed for it ends the call with ``QUOTA.BUDGET_EXCEEDED``, as
        does one the memory cgroup's OOM killer ended).
    :param prespawn: native launchers spawned ahead of time, each already in its own fresh
        cgroup (``prespawn.py``); 0 spawns one per call.
    :param run_as: ``[uid, gid]`` the sandbox runs as on the host when the engine is root
        (``uid.py``; default 65533:65533); never 0. An engine that is not root runs its
        sandboxes as its own uid.
    :param bwrap: the bubblewrap binary (absolute path; default ``bwrap`` on PATH).
    :param unshare: util-linux ``unshare`` for proc-unshare (absolute; default: on PATH).
    """

    env_allow: tuple[str, ...] = ()
    env_base: dict[str, str] = field(default_factory=dict)
    extra_ro_binds: tuple[str, ...] = ()
    layer2: bool = True
    python: str = sys.executable
    cgroups: bool = True
    launcher: Literal["native", "python"] = "native"
    launcher_cache: str | None = None
    prespawn: int = 2
    max_file_bytes: int = 1 << 30
    run_as: tuple[int, int] = uid.DEFAULT_RUN_AS
    bwrap: str | None = None
    unshare: str | None = None

    @staticmethod
    def parse(raw: Any) -> ProcOptions:
        opts = dict(raw or {})
        if "scan_limit" in opts:
            raise ValueError("proc: `scan_limit` was removed: mask planning has no entry cap "
                             "any more (docs/operations.md, mandatory denies); delete the key")
        known = {"env_allow", "env_base", "extra_ro_binds", "layer2", "python", "cgroups",
                 "launcher", "launcher_cache", "prespawn", "max_file_bytes", "run_as",
                 "bwrap", "unshare"}
        if set(opts) - known:
            raise ValueError(f"proc: unknown options {sorted(set(opts) - known)}")
        check_string_lists(opts, ("env_allow", "extra_ro_binds"), "proc")
        if any(not p.startswith("/") for p in opts["extra_ro_binds"]):
            raise ValueError("proc: `extra_ro_binds` must be absolute paths")
        under_tmp = [p for p in opts["extra_ro_binds"] if beneath(os.path.normpath(p), "/tmp")]
        if under_tmp:
            # a bwrap sandbox gets /tmp empty and its own (over the system binds), Landlock
            # shows the host's: one answer everywhere is to refuse it
            raise ValueError(f"proc: `extra_ro_binds` entry `{under_tmp[0]}` lies in /tmp, "
                             "which each sandbox gets empty and its own; bind a tree outside "
                             "/tmp")
        for key in ("layer2", "cgroups"):
            if not isinstance(opts.get(key, True), bool):
                raise ValueError(f"proc: `{key}` must be a boolean")
        if not os.path.isabs(str(opts.get("python", sys.executable))):
            raise ValueError("proc: `python` must be an absolute path")
        if opts.get("launcher", "native") not in ("native", "python"):
            raise ValueError("proc: `launcher` must be `native` or `python`")
        for key in ("bwrap", "unshare"):
            binary = opts.get(key)
            if binary is not None and (not isinstance(binary, str) or not os.path.isabs(binary)):
                raise ValueError(f"proc: `{key}` must be an absolute path")
        cache = opts.get("launcher_cache")
        if cache is not None and (not isinstance(cache, str) or not os.path.isabs(cache)):
            raise ValueError("proc: `launcher_cache` must be an absolute path")
        pool = opts.get("prespawn", 2)
        if not isinstance(pool, int) or isinstance(pool, bool) or not 0 <= pool <= 64:
            raise ValueError("proc: `prespawn` must be an integer from 0 to 64")
        fsize = opts.get("max_file_bytes", 1 << 30)
        if not isinstance(fsize, int) or isinstance(fsize, bool) or fsize < 1:
            raise ValueError("proc: `max_file_bytes` must be a positive integer")
        run_as = opts.get("run_as", uid.DEFAULT_RUN_AS)
        if (not isinstance(run_as, list | tuple) or len(run_as) != 2
                or not all(isinstance(x, int) and not isinstance(x, bool) and 0 < x < 2**32 - 1
                           for x in run_as)):
            raise ValueError("proc: `run_as` must be [uid, gid], two integers from 1 to "
                             "4294967294 (a dedicated unprivileged uid; never 0)")
        opts["run_as"] = (run_as[0], run_as[1])
        return ProcOptions(**opts)


# sb_launch.c's MAX_RULES: a Landlock rule per carved directory entry
MAX_LANDLOCK_RULES = 4096
MAX_HIDDEN_DIRS = 512  # sb_launch.c's MAX_OPENS: masked directories covered by a tmpfs
MAX_BINDS = 480  # staged by the launcher too (MAX_OPENS), with room for its own few


@dataclass(frozen=True, slots=True)
class _Probe:
    """Whether a backend runs here, why not, and the binary it runs."""

    ok: bool
    reason: str
    bwrap_path: str | None
    unshare_path: str | None


_EFFECT_GIVEN = frozenset({"kind", "meta"})
_CPU_GIVEN = frozenset({"cpu_ms"})
_RESULT_GIVEN = frozenset({"ok", "out", "used"})


@dataclass(slots=True)
class _Parts:
    """A proc result's parts that do not depend on how the tool ended (``_known_parts``)."""

    side_effect: dict[str, Any]
    limits: dict[str, str]
    masked: list[str]
    hidden: int


class ProcExecutor:
    """Runs a ProcExecOp (argv, never a shell). ``backend`` picks bubblewrap (namespaces, binds,
    masks; Landlock + seccomp inside as a second layer) or Landlock + seccomp alone.

    ``enforces_deadline``: the wait kills the process group at ``ctx.deadline`` or on
    ``ctx.cancel`` and raises ``LLM.TIMEOUT`` itself, so the orchestrator may call it inline.

    Network ``restricted`` (bwrap only): a per-call ``policy_engine.netproxy`` proxy decided by
    ``ctx.guard`` (``guard`` here only when the context has none), reached through its bridge,
    which runs first in the sandbox's empty network namespace. A ``network_hook`` replaces it.
    The Landlock-only backend has no namespace, and Landlock's TCP rules name ports, not
    addresses, so it refuses ``restricted`` (``CAPABILITY.BLOCKED``).

    ``warm_ahead`` (``EngineConfig.warm_ahead``): start the system trees' mask walk when made
    (a server: its first call plans in milliseconds); ``False``: the first plan starts it and
    waits only for the stored walks' check (a one-call CLI command that runs no process never
    walks at all).
    """

    enforces_deadline = True
    charges_at_start = True  # ctx.started() right before the spawn
    prespawn_at_start = True  # hold launchers from the start (the backends that are defaults)

    # the last preview's host-wide mask globs (`sandbox profile`; preview_masks.py)
    masked_at_run: tuple[str, ...] = ()

    def __init__(self, backend: Backend, options: ProcOptions | None = None, *,
                 network_hook: NetworkHook | None = None, guard: Decider | None = None,
                 mode: Literal["strict", "compat"] = "strict", warm_ahead: bool = True) -> None:
        self.backend = backend
        self.mode = mode
        self.name = f"proc-{backend}"
        self.options = options or ProcOptions()
        self.network_hook = network_hook
        self.guard = guard
        self.landlock_abi = landlock.abi_version()
        # root drops to the sandbox uid before bwrap starts (uid.py); anyone else is already
        # unprivileged and runs it as itself
        self.run_as = self.options.run_as if os.geteuid() == 0 else None
        self._reach_verdicts: dict[tuple[str, tuple[int, int]], bool] = {}  # ``_reachable``
        self._warm_ahead = warm_ahead
        self._probe_lock = threading.Lock()
        self._probe: _Probe | None = None
        self._refusal: str | None = None  # a subclass's wording of ``unavailable_reason``
        if warm_ahead:
            self._probed()  # a server knows at its start whether each backend runs here
        self.capabilities = ExecutorCapabilities(
            op_kinds=frozenset({OpKind.PROC_EXEC}),
            network_modes=frozenset({NetworkMode.OFF, NetworkMode.ON}
                                    | ({NetworkMode.RESTRICTED} if backend == "bwrap" else set())),
            # proc-unshare: namespaces, but the host's file tree (Landlock bounds it, no view)
            bind_mounts=backend == "bwrap", readonly_rootfs=True, resource_limits=True,
            env_filtering=True, streaming_output=False, mandatory_denies=True,
        )
        if warm_ahead and self.usable:
            spec.prewarm()  # the system trees' mask walk, off the call path
        self._pool = cgroups.CgroupPool(max(1, self.options.prespawn)) \
            if self.options.cgroups else None
        self._native: native.NativeLauncher | None = None
        self._held: prespawn.LauncherPool | None = None
        if self.options.cgroups:
            cgroups.sweep_stale()
        # not warming ahead: the first call probes, builds and holds (``_launcher``)
        if warm_ahead and self.usable and self.options.launcher == "native":
            if self.prespawn_at_start and backend != "unshare":
                with contextlib.suppress(PolicyEngineError):  # refused per call, with reason
                    self._launcher()  # build (first run here) before any deadline runs
            else:  # chosen by configuration only: build now, hold launchers from the 1st call
                cache = self.options.launcher_cache
                self._native = native.launcher(Path(cache) if cache else None)

    def _probed(self) -> _Probe:
        """Whether this backend runs here, asked once: bwrap and unshare run a trial sandbox
        (kept per process for the same binary: ``bwrap.probe``); Landlock and seccomp are
        kernel facts. Made at construction when warming ahead, else by the first use."""
        with self._probe_lock:
            if self._probe is None:
                self._probe = self._run_probe()
            return self._probe

    def _run_probe(self) -> _Probe:
        if self.backend == "bwrap":
            p = bwrap.probe(run_as=self.run_as, configured=self.options.bwrap)
            return _Probe(p.ok, p.reason, p.path, None)
        ok = self.landlock_abi > 0 and seccomp.supported()
        reason = "ok" if ok else ("landlock is not enabled in this kernel"
                                  if self.landlock_abi <= 0
                                  else "no seccomp syscall table for this architecture")
        if self.backend == "unshare" and ok:
            u = unshare.probe(self.options.unshare, self.run_as)
            return _Probe(u.ok, u.reason, None, u.path)
        return _Probe(ok, reason, None, None)

    @property
    def usable(self) -> bool:
        return self._probed().ok

    @property
    def unavailable_reason(self) -> str:
        return self._refusal if self._refusal is not None else self._probed().reason

    @unavailable_reason.setter
    def unavailable_reason(self, reason: str) -> None:
        self._refusal = reason

    @property
    def bwrap_path(self) -> str | None:
        return self._probed().bwrap_path

    @property
    def unshare_path(self) -> str | None:
        return self._probed().unshare_path

    def available(self) -> bool | str:
        """The executor SPI's probe: ``True``, or the reason this backend cannot run here."""
        return True if self.usable else self.unavailable_reason

    def close(self) -> None:
        """Stop the held launchers, remove the pooled cgroups (each exec got a fresh one)."""
        if self._held is not None:
            self._held.close()
        if self._pool is not None:
            self._pool.close()

    def _refuse_engine_trees(self, plan: Plan) -> None:
        """A writable bind that is, holds or lies inside the launcher cache, the engine's
        config or a login hook directory is refused, whatever the policy permits: the sandbox
        uid could replace the launcher (root's files there are its own through the id-mapped
        bind, ``owner.py``), and the engine would run the replacement as its own uid (outsider
        attack round 3, F7)."""
        if not plan.writable:
            return
        cache = self.options.launcher_cache
        extra = [(cache, "the engine's native launcher cache")] if cache else []
        trees = enginedirs.protected_trees(os.environ, extra, realpath=spec.realpath)
        for w in plan.writable:
            why = enginedirs.tree_refusal(spec.realpath(w), trees, f"the writable path `{w}`")
            if why is not None:
                raise BackendRefusal(ErrorCode.CAPABILITY_BLOCKED, f"{self.name}: {why}")

    def _launcher(self) -> tuple[str | None, str | None]:
        """(native launcher path or None, degradation reason or None); raises in strict mode
        when the native launcher is wanted but cannot be built.
        """
        if self.options.launcher == "python":
            return None, None
        if self._native is None:
            cache = self.options.launcher_cache
            self._native = native.launcher(Path(cache) if cache else None)
        if self._native.path is not None:
            # every call, not only at the probe: a launcher (or its directory) someone else
            # could write since is never run again (outsider attack round 3, F7)
            why = native.verify(self._native.path)
            if why is not None:
                raise PolicyEngineError(ErrorCode.PROVIDER_UNAVAILABLE, f"{self.name}: {why}")
            if self._held is None and self.options.prespawn > 0:
                self._held = prespawn.LauncherPool(self._native.path, self._pool,
                                                   self.options.prespawn)
            return self._native.path, None
        why = f"native launcher unavailable: {self._native.reason}"
        if self.mode == "strict":
            raise PolicyEngineError(ErrorCode.PROVIDER_UNAVAILABLE, f"{self.name}: {why} "
                                    "(set proc option `launcher: python` or compat mode to run "
                                    "the slower Python launcher)")
        return None, f"{why}; the Python launcher applied the same rules"

    def refusal(self, profile: Profile, op: ExecOp) -> PolicyEngineError | None:
        """What ``execute`` refuses from the profile alone (the executor SPI's ``refusal``:
        the backend selection asks it, so the dry run answers it)."""
        if profile.network == NetworkMode.RESTRICTED and self.backend != "bwrap":
            return BackendRefusal(
                ErrorCode.CAPABILITY_BLOCKED, f"{self.name} cannot restrict the network to the "
                "policy proxy (its launcher has no bridge to it; Landlock TCP rules name ports, "
                "not hosts); use proc-bwrap")
        if self.backend == "bwrap" and self.run_as is not None:
            readable, writable = bound_paths(profile)
            if len(readable) + len(writable) > MAX_BINDS:  # each staged by the launcher
                return BackendRefusal(
                    ErrorCode.CAPABILITY_BLOCKED, f"{self.name} would bind "
                    f"{len(readable) + len(writable)} paths (at most {MAX_BINDS}): narrow the "
                    "fs rules")
        if self.run_as is not None and self.mode == "strict":  # dry run = run (owner.py)
            writable = bound_paths(profile)[1]
            why = self._idmap_unavailable()
            roots = [w for w in writable if self._mappable(w)]
            if why is not None and roots and owner.tree_owner(writable) is None:
                note = owner.RootTrees(roots, failed=why).unwritable(self.run_as)
                return BackendRefusal(ErrorCode.CAPABILITY_BLOCKED,
                                      f"{self.name}: {note}{owner.STRICT_ADVICE}")
        return cwd_fact_refusal(profile, op, self.name)  # in this executor's view

    def fact_notes(self, profile: Profile, op: ExecOp) -> list[str]:
        """What the dry run's trace says of the facts this executor judged (its view)."""
        note = cwd_fact_note(profile, op, self.name)
        # one fact step per judged cwd (the engine's variable is said with it)
        return [f"{note}; {artifacts_note(op)}"] if note is not None else []

    def _admit(self, ctx: ExecContext, op: ExecOp) -> ProcExecOp:
        """The op as this executor takes it: a proc.exec, the executor usable, and nothing its
        own re-check refuses (raised otherwise)."""
        if not isinstance(op, ProcExecOp):
            raise PolicyEngineError(ErrorCode.EXECUTION_FAILED, f"proc cannot run `{op.kind}`")
        if not self.usable:
            raise PolicyEngineError(ErrorCode.PROVIDER_UNAVAILABLE,
                                    f"{self.name}: {self.unavailable_reason}")
        refused = refusal_of(self, ctx.profile, op)
        if refused is not None:
            raise refused
        return op

    def execute(self, ctx: ExecContext, op: ExecOp) -> ExecResult:
        with one_view():  # the re-check, the identity and the plan see the same binds
            return self._execute(ctx, op)

    def _execute(self, ctx: ExecContext, op: ExecOp) -> ExecResult:
        op = self._admit(ctx, op)
        stdin = _decode_stdin(op)
        private_tmp = None if self.backend == "bwrap" else tempfile.mkdtemp(prefix="pe-proc-")
        net: RestrictedHandle | None = None
        runner: ProcExecutor | None = None
        try:
            left = _START_ATTEMPTS - 1
            while True:
                # the identity first: the local runner's plan carves out what that uid owns
                runner = self._as_tree_owner(bound_paths(ctx.profile)[1])
                plan = runner._plan(ctx, op, private_tmp or "/tmp")
                self._refuse_engine_trees(plan)
                runner = runner._with_idmapped(plan)  # a root-owned tree: mapped, not handed over
                plan.limits = resolve_limits(ctx.profile, op, ctx.limits)  # the rule's included
                if plan.network == "restricted" and self.network_hook is None:
                    net = RestrictedNetwork(ctx.profile, ctx.guard or self.guard,
                                            deadline=ctx.deadline, consume=ctx.consume,
                                            limits=ctx.limits).start()
                    plan.env.update(net.env())  # INVARIANT: after the op's allow-listed values
                try:
                    return runner._run(ctx, op, plan, stdin, private_tmp,
                                       ctx.profile.network.value, net)
                except PolicyEngineError as err:
                    if (not left or net is not None
                            or not _mask_vanished(plan, err) or ctx.cancel.cancelled
                            or time.monotonic() >= ctx.deadline):
                        raise
                    # a masked path vanished between the plan and bwrap's mounts (bwrap cannot
                    # make its mount point in a read-only bind): nothing ran, plan again
                    log.info("%s: a masked path vanished before the sandbox started; planning "
                             "again", self.name)
                    left -= 1
                    if runner.root_trees is not None:
                        runner.root_trees.close()
                    runner = None
        finally:
            if runner is not None and runner.root_trees is not None:
                runner.root_trees.close()
            if net is not None:
                _record_proxy(ctx, net)
            if private_tmp is not None:
                _rmtree(private_tmp)

    writes_as_owner = False
    """Set on the per-call copy that runs as the owner of the writable tree (``owner.py``)."""
    root_trees: owner.RootTrees | None = None
    """The per-call copy's id-mapped binds of root-owned writable paths (``owner.py``)."""

    def _with_idmapped(self, plan: Plan) -> ProcExecutor:
        """A per-call copy whose root-owned writable binds are id-mapped to ``run_as``, their
        hard-linked root files bound read-only (``owner.map_root_trees``); where no id-mapped
        bind can be made the copy records why (strict refuses in ``_run``)."""
        if self.run_as is None or self.writes_as_owner:
            return self
        # a bind holding or inside a system tree (`fs.write "/**"`), a shared root (`/opt`,
        # `/home`: installed software, other users' files) keeps root's entries root's
        roots = [w for w in plan.writable if self._mappable(w)
                 and not any(beneath(w, t) or beneath(t, w) for t in plan.system)]
        if not roots:
            return self
        unavailable = self._idmap_unavailable()
        if unavailable is None and self._launcher()[0] is None:
            unavailable = "the Python launcher cannot bind id-mapped mounts"
        try:
            mapped = owner.map_root_trees(roots, plan.resolved, self.run_as,
                                          plan.mask_files + plan.mask_dirs + plan.readonly,
                                          unavailable)
        except (owner.TooManyLinks, ValueError) as exc:
            raise BackendRefusal(ErrorCode.CAPABILITY_BLOCKED, f"{self.name}: {exc}") from None
        twin = copy.copy(self)
        twin.root_trees = mapped
        if self.backend == "bwrap":  # bwrap binds the mapped tree where the path was
            plan.resolved.update(mapped.targets)
        return twin

    def _idmap_unavailable(self) -> str | None:
        """Why this executor cannot carry an id-mapped bind, from its configuration alone."""
        if self.options.launcher == "python":
            return "the Python launcher cannot bind id-mapped mounts"
        if self.backend == "bwrap" and not self.options.layer2:
            # what the sandbox creates there is root's on disk: only the launcher's seccomp
            # filter refuses set-uid/set-gid modes (a set-uid root file would be a host root)
            return "without layer 2 no seccomp filter refuses set-id modes"
        return None

    @staticmethod
    def _mappable(path: str) -> bool:
        """A writable path root owns that is no shared root (`/opt`, `/home`: installed
        software, other users' files keep root's entries root's)."""
        return owner.owned_by_root(path) and enginedirs.shared_root_refusal(
            os.path.realpath(path)) is None

    def _as_tree_owner(self, writable: list[str]) -> ProcExecutor:
        """This executor, or a per-call copy running as the one non-root owner of every
        writable bind (``owner.py``): its files stay that user's, nothing is handed over."""
        if self.run_as is None:
            return self
        ident = owner.tree_owner(writable)
        if ident is None or ident == self.run_as:
            return self
        twin = copy.copy(self)
        twin.run_as, twin.writes_as_owner = ident, True
        return twin

    def _warm(self) -> None:
        """Start the system trees' walk if nobody has (``warm_ahead=False``: without the
        watches later calls would reuse); the plan then waits only for the stored walks'
        check (``spec.build_plan``). Else a no-op."""
        spec.prewarm(watch=self._warm_ahead)

    def _plan(self, ctx: ExecContext, op: ProcExecOp, tmpdir: str) -> Plan:
        """The call's sandbox plan (a subclass may widen it: the local runner)."""
        self._warm()
        return hide_engine_state(ctx, build_plan(
            ctx.profile, op, env_allow=self.options.env_allow, env_base=self.options.env_base,
            extra_ro=self.options.extra_ro_binds, tmpdir=tmpdir))

    def _launcher_spec(self, plan: Plan, private_tmp: str | None,
                       net: RestrictedHandle | None) -> dict[str, Any]:
        off = plan.network != "on"
        strict = self.backend != "bwrap"  # no masks by mounts: carve, refuse AF_UNIX, setsid
        unix_off = off and net is None
        if self.backend == "bwrap":
            extra = [("/tmp", "rw"), ("/dev", "dev"), ("/proc", "ro")]
            if net is not None:  # the bridge reads its script, then starts the tool's launcher
                extra += [(net.sandbox_dir, "ro"), (bwrap.NATIVE_PATH, "rox"),
                          (bwrap.LAUNCHER_DIR, "ro")]
        else:
            # no /proc here: the host's would show every process's environment to root
            extra = [(private_tmp or "/nonexistent", "rw"), ("/dev/null", "dev"),
                     ("/dev/zero", "dev"), ("/dev/urandom", "ro"), ("/dev/random", "ro")]
            if self.backend == "unshare":  # its own pid namespace's /proc: only its processes
                extra.append(("/proc", "ro"))
        return {
            "drop_caps": strict and os.geteuid() == 0,
            "landlock": {"rules": plan.landlock_rules(extra, carve_masks=strict),
                         "deny_tcp": off, "scope": True, "required": strict,
                         # the bridge binds and dials the proxy port, nothing else
                         **({"bind": [net.port], "connect": [net.port]} if net else {})},
            # AF_INET stays usable in restricted mode: the namespace has only loopback. With
            # network off no AF_UNIX socket under bwrap either: its own network namespace hides
            # abstract sockets, not a host listener's socket file in a bound tree (second pass,
            # N2); that refusal is a mandatory one, so strict mode requires the filter
            # no bind with network off (abstract names live in the host's namespace under
            # proc-landlock and local: attack32 L6); the local runner's plan keeps the host's
            # network, so the profile's own mode says it
            "seccomp": {"deny_inet": off and net is None, "deny_setsid": strict,
                        "deny_unix": strict or unix_off, "deny_bind": plan.no_bind and net is None,
                        # through an id-mapped bind what it creates is root's: set-id modes
                        # must be refused (owner.py)
                        "required": strict or unix_off and self.mode == "strict"
                        or bool(self.root_trees and self.root_trees.targets)},
            "keep_status": net is not None,
            # proc-unshare: the launcher is pid 1 of the namespace; it stays, the tool is pid 2
            "init": self.backend == "unshare",
            # behind bwrap or the init the engine sees 128 + N only: the tool's parent says
            # whether a signal ended it (proc-landlock's tool is the engine's own child)
            "report_end": self.backend == "unshare" or self.backend == "bwrap" and net is None,
        }

    def _tool_spec(self, net: RestrictedHandle) -> dict[str, Any]:
        """The layer added between the bridge and the tool: no TCP bind at all, connect to the
        bridge's port only (stacked on the bridge's Landlock domain and seccomp filter), and no
        AF_UNIX socket: the bridge reaches the proxy through one, the tool must reach neither
        the proxy's socket past the bridge nor a host listener in a bound tree (N2).
        """
        return {"drop_caps": False, "landlock": {"rules": [], "deny_tcp": True, "scope": True,
                                                 "required": False, "fs": False,
                                                 "connect": [net.port]}, "report_end": True,
                "seccomp": {"deny_inet": False, "deny_setsid": False, "deny_unix": True,
                            "required": self.mode == "strict"}}

    def _inner_args(self, spec: dict[str, Any], status_fd: int) -> list[str]:
        """The native launcher's options for ``spec`` (the Python launcher's JSON, as flags)."""
        args = ["-s", str(status_fd)] + (["-C"] if spec["drop_caps"] else [])
        args += ["-k"] if spec.get("keep_status") else []
        args += ["-i"] if spec.get("init") else []
        if spec.get("end_fd") is not None:  # the tool's pidfd on this socket, no fork (-w else)
            args += ["-W", str(spec["end_fd"])]
        elif spec.get("report_end"):
            args += ["-w"]
        ll, sc = spec["landlock"], spec.get("seccomp")
        args.append("-L" if ll["required"] else "-l")
        args += (["-t"] if ll["deny_tcp"] else []) + (["-S"] if ll["scope"] else [])
        args += [] if ll.get("fs", True) else ["-N"]
        args += [a for p in ll.get("connect", ()) for a in ("-P", str(p))]
        args += [a for p in ll.get("bind", ()) for a in ("-B", str(p))]
        for path, access in ll["rules"]:
            args += ["-p", f"{landlock.ACCESS[access]}:{path}"]
        if sc is not None:
            args += ["-F" if sc["required"] else "-f",
                     _filter_hex(sc["deny_inet"], sc["deny_setsid"], sc["deny_unix"],
                                 sc.get("deny_bind", False))]
        return args

    def _command(self, plan: Plan, spec: dict[str, Any] | None, status_fd: int,
                 exe: str | None, host: list[str], net: RestrictedHandle | None,
                 reach: uid.Reach | None = None) -> list[str]:
        """The argv to spawn. With the native launcher ``exe``, ``host`` (cgroup fds, rlimits)
        is applied by it on the host; under bwrap a second copy runs inside for layer 2.

        Restricted network: launcher (layer 2, bind/connect the proxy port only, status kept
        open) → bridge (listens, hands the status pipe on) → launcher (no TCP bind, connect the
        proxy port only) → tool. Without layer 2: bridge → tool.
        """
        py = [self.options.python, "-I", "-S", "-B"]

        def layer(s: dict[str, Any], argv: list[str]) -> list[str]:
            if exe is None:
                return [*py, f"{bwrap.LAUNCHER_DIR}/launcher.py", json.dumps(s),
                        str(status_fd), "--", *argv]
            return [bwrap.NATIVE_PATH, *self._inner_args(s, status_fd), "--", *argv]

        reach = reach if reach is not None else uid.Reach()
        if self.backend == "unshare":
            assert spec is not None
            assert self.unshare_path is not None
            # the host launcher (cgroup, rlimits, reach) stays root for `unshare`, which drops
            ns = unshare.namespace_args(self.unshare_path, network_on=plan.network == "on",
                                        run_as=self.run_as, cwd=plan.cwd)
            env = unshare.environment(plan.env)  # `unshare` itself (root) gets none
            if exe is None:  # Python launcher: preexec_fn did cgroup and rlimits, not the drop
                return [*ns, "--", *env, *py, os.path.join(HERE, "launcher.py"),
                        json.dumps(spec), str(status_fd), "--", *plan.argv]
            return [exe, *host, *reach.options(None), "--", *ns, "--", *env, exe,
                    *self._inner_args(spec, status_fd), "--", *plan.argv]
        if self.backend == "landlock":
            assert spec is not None
            if exe is None:  # Python launcher; cgroups, rlimits, the drop come from preexec_fn
                return [*py, os.path.join(HERE, "launcher.py"), json.dumps(spec),
                        str(status_fd), "--", *plan.argv]
            return [exe, *host, *reach.options(self.run_as), *self._inner_args(spec, status_fd),
                    "--", *plan.argv]
        assert self.bwrap_path is not None
        tool = plan.argv
        if net is not None:
            tool = net.wrap_argv(layer(self._tool_spec(net), tool), pass_fds=(status_fd,)) \
                if spec is not None else net.wrap_argv(tool)
        inner = layer(spec, tool) if spec is not None else tool
        hook = net.network_hook() if net is not None else self.network_hook
        argv = bwrap.build_argv(
            self.bwrap_path, plan, inner=inner, network_hook=hook,
            launcher_src=HERE if spec is not None and exe is None else None,
            native_launcher=exe if spec is not None and exe is not None else None,
            run_as=self.run_as, source=self._stager(reach, plan))
        return argv if exe is None else [exe, *host, *reach.options(self.run_as), "--", *argv]

    def preview_command(self, ctx: ExecContext, op: ExecOp) -> list[str]:
        """The argv ``execute`` would spawn for ``op``, for ``policy-engine sandbox profile``:
        nothing runs, nothing is adopted or staged; the status fd is a placeholder (3) and the
        per-call cgroup and rlimit options of the native launcher are left out."""
        if not isinstance(op, ProcExecOp):
            raise PolicyEngineError(ErrorCode.EXECUTION_FAILED, f"proc cannot run `{op.kind}`")
        if not self.usable:
            raise PolicyEngineError(ErrorCode.PROVIDER_UNAVAILABLE,
                                    f"{self.name}: {self.unavailable_reason}")
        private_tmp = None if self.backend == "bwrap" else "/tmp/pe-proc-PREVIEW"
        self._warm()  # as ``_plan``
        plan = hide_engine_state(ctx, build_plan(
            ctx.profile, op, env_allow=self.options.env_allow, env_base=self.options.env_base,
            extra_ro=self.options.extra_ro_binds, tmpdir=private_tmp or "/tmp", preview=True))
        self._refuse_engine_trees(plan)
        self.masked_at_run = tuple(plan.masked_at_run)
        plan.limits = resolve_limits(ctx.profile, op, ctx.limits)
        exe, _ = self._launcher()
        spec = (self._launcher_spec(plan, private_tmp, None)
                if self.backend == "landlock" or self.options.layer2 else None)
        return self._command(plan, spec, 3, exe, [], None, uid.Reach())

    def _reach(self, plan: Plan, private_tmp: str | None, exe: str | None) -> uid.Reach:
        """proc-landlock run by root: what its uid must reach below closed directories."""
        if self.backend == "bwrap" or self.run_as is None:
            return uid.Reach()
        needed = [*plan.system, *plan.readable, *plan.writable, plan.cwd]
        needed += [private_tmp] if private_tmp else []
        if exe is None:  # the Python launcher and its interpreter run as the sandbox uid
            needed += [HERE, os.path.realpath(sys.base_prefix)]
        elif self.backend == "unshare":  # the launcher inside runs as the sandbox uid
            needed.append(exe)
        reach = uid.reach_in_place(needed, *self.run_as)
        # Landlock's list right on a carved parent reaches every directory beneath it: without
        # a cover, the names inside a masked directory (~/.ssh/id_*) could be listed
        reach.hides = [d for d in plan.mask_dirs
                       if not any(o != d and beneath(d, o) for o in plan.mask_dirs)]
        if len(reach.hides) > MAX_HIDDEN_DIRS:  # sb_launch.c's MAX_OPENS
            raise BackendRefusal(
                ErrorCode.CAPABILITY_BLOCKED, f"{self.name} would cover {len(reach.hides)} "
                f"masked directories (at most {MAX_HIDDEN_DIRS}): narrow the fs rules or use "
                "proc-bwrap")
        return reach

    def _stager(self, reach: uid.Reach, plan: Plan) -> Callable[[str], str]:
        """Where bwrap finds a bind source: the path itself, or its staged copy, recorded in
        ``staged``: when the sandbox uid cannot look it up (/root/..., a 0700 parent), and
        always for the profile's own binds. The root launcher stages those through a
        descriptor opened with no symlink on the path (their resolved form at plan time), so a
        directory swapped for a link between the plan and the mount fails the call instead of
        binding the link's target (outsider round 6, F01: glob binds lie inside workspaces
        their writers may change)."""
        run_as = self.run_as
        if run_as is None:
            return str
        known: dict[str, str] = {}
        own = plan.resolved

        def source(path: str) -> str:
            if path not in known:
                if path in own:
                    known[path] = reach.stage(own[path])
                elif self._reachable(path, run_as):
                    known[path] = path
                else:
                    # an engine path (launcher cache, interpreter): resolved, as the launcher
                    # opens it with no symlink on the path (a symlinked HOME: round 7, F02)
                    known[path] = reach.stage(spec.realpath(path))  # one probe, no link
            return known[path]

        return source

    def _reachable(self, path: str, run_as: tuple[int, int]) -> bool:
        """``uid.reachable`` for an engine path (a system tree, the launcher), remembered: a
        verdict gone stale can only make bwrap refuse a bind it cannot reach (the call fails,
        and the verdicts are asked again), never bind another file (the profile's own binds
        are always staged)."""
        key = (path, run_as)
        verdict = self._reach_verdicts.get(key)
        if verdict is None:
            verdict = self._reach_verdicts[key] = uid.reachable(path, *run_as,
                                                                realpath=spec.realpath)
        return verdict

    def _run(self, ctx: ExecContext, op: ProcExecOp, plan: Plan, stdin: bytes | None,
             private_tmp: str | None, asked_network: str,
             net: RestrictedHandle | None) -> ExecResult:
        assert plan.limits is not None
        lim = plan.limits
        if stdin is not None and len(stdin) > lim.max_stdin:
            raise PolicyEngineError(ErrorCode.CAPABILITY_BLOCKED,
                                    f"stdin of {len(stdin)} bytes exceeds max_bytes_in")
        if self.backend != "bwrap":
            rules = len(plan.landlock_rules())
            if rules > MAX_LANDLOCK_RULES:  # the launcher's table; argv must stay small too
                raise BackendRefusal(
                    ErrorCode.CAPABILITY_BLOCKED,
                    f"{self.name} would need {rules} Landlock rules to keep "
                    f"{len(plan.mask_files) + len(plan.mask_dirs)} masked paths out of its "
                    f"binds (at most {MAX_LANDLOCK_RULES}): narrow the fs rules (a broad `/**` "
                    "exposes every secret beneath it) or use proc-bwrap, which masks by mounts")
        exe, degraded = self._launcher()
        mapped = self.root_trees
        if mapped is not None and mapped.failed is not None and self.run_as is not None:
            if self.mode == "strict":  # never a chown; in strict mode, no unwritable tree either
                raise BackendRefusal(ErrorCode.CAPABILITY_BLOCKED, f"{self.name}: "
                                     f"{mapped.unwritable(self.run_as)}{owner.STRICT_ADVICE}")
            why = mapped.unwritable(self.run_as)
            degraded = f"{degraded}; {why}" if degraded else why
        reach = self._reach(plan, private_tmp, exe)
        ctx.started()  # every refusal above was free: nothing has been spawned yet
        if mapped is not None and self.backend != "bwrap":
            for w, mounted in mapped.targets.items():  # bound back in place, mapped
                reach.rebinds.append((int(reach.stage(mounted).rsplit("/", 1)[1]), w))
        if self.run_as is not None and private_tmp is not None:
            os.chown(private_tmp, *self.run_as)  # the engine's own temp dir, not the user's
        layered = self.backend != "bwrap" or self.options.layer2
        spec = self._launcher_spec(plan, private_tmp, net) if layered else None
        cg_fds: list[int] = []
        end: socket.socket | None = None
        start = time.monotonic()
        deadline = min(ctx.deadline, start + lim.timeout_s)
        if exe is not None and self._held is not None:
            try:
                held = self._held.take(lim.pids, lim.memory_bytes, lim.cpu_cores)
            except OSError as exc:
                raise PolicyEngineError(ErrorCode.EXECUTION_FAILED,
                                        f"cannot start the sandbox: {exc.strerror}") from None
            proc, cg, status_r = held.proc, held.cg, held.status_r
            # what the tool must not get to forge a report is closed on the host, before bwrap
            unused = [] if spec is not None else [held.status_fd]
            if (held.end is not None and spec is not None and spec.get("report_end")
                    and self.backend == "bwrap"):  # proc-unshare's launcher is pid 1: -w
                end = held.end  # -W: the tool exec'd in place, its pidfd sent on this socket
                spec = {**spec, "end_fd": held.end_fd}
            elif held.end is not None:
                held.end.close()
                unused.append(held.end_fd)
            host = host_rlimits(lim, cg, self.options.max_file_bytes) + [
                a for fd in unused for a in ("-x", str(fd))]
            argv = self._command(plan, spec, held.status_fd, exe, host, net, reach)
            try:
                held.send(plan.cwd if self.backend != "bwrap" else "/",
                          plan.env if self.backend == "landlock" else {}, argv[1:])
            except OSError:
                held.discard(self._pool)
                raise PolicyEngineError(ErrorCode.EXECUTION_FAILED,
                                        "cannot start the sandbox: the launcher exited") from None
            if proc.stdin is not None and stdin is None:
                proc.stdin.close()  # EOF at once, as /dev/null would give
                proc.stdin = None
        else:
            proc, cg, status_r = self._spawn(plan, spec, stdin, exe, lim, cg_fds, net, reach)
        assert proc.stdout is not None
        assert proc.stderr is not None

        def kill() -> None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
            if cg:
                cg.kill_all()

        def kill_now() -> None:  # the signals alone: the write watch's first move
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
            if cg:
                cg.kill_once()

        watch = writewatch.start(lim.disk_write, proc.pid, cg, kill, kill_now=kill_now,
                                 preexisting=exe is not None and self._held is not None)
        out, err = HeadTail(lim.max_stdout), HeadTail(lim.max_stderr)
        # pump owns (and closes) the stdin descriptor it is given: hand it a duplicate and close
        # the file object now, so the number is never closed twice (a second close could hit
        # a descriptor reused meanwhile, e.g. a held launcher's control pipe)
        stdin_fd: int | None = None
        if proc.stdin is not None:
            stdin_fd = os.dup(proc.stdin.fileno())
            proc.stdin.close()
            proc.stdin = None
        try:
            try:
                # while the sandbox starts, not after the tool ends; inside the try: should it
                # ever raise, the watch, the pipes and the group are given back as for a
                # failed wait (outsider round 39)
                parts = self._known_parts(op, plan, cg)
                outcome = pump(proc.pid, proc.stdout.fileno(), proc.stderr.fileno(), status_r,
                               stdin_fd, stdin or b"", out, err, deadline, ctx.cancel, kill, kill,
                               on_output=ctx.on_output)
            finally:
                watch.stop()
                proc.returncode = -1  # reaped by pump's wait4; keep Popen from waiting again
                for fh in (proc.stdout, proc.stderr):
                    fh.close()
                os.close(status_r)
                ended = pidfd_exit.receive(end) if end is not None else None
                memory_peak = cg.memory_peak() if cg else None
                oom_kills = cg.oom_kills() if cg else 0  # read before the group is released
                cg_cpu = cg.cpu_ms() if cg else None
            if cg_cpu is not None:
                outcome.rusage_cpu_ms = max(outcome.rusage_cpu_ms, cg_cpu)
            if ended is not None:  # what the launcher's -w would have appended
                outcome.status_json += json.dumps({"tool_end": pidfd_exit.tool_end(ended)}).encode()
            if spec is None:  # no seccomp layer refused setuid bits or device nodes: undo them
                sanitize.sanitize(plan.writable)
            if watch.over(outcome.rusage_written):
                raise PolicyEngineError(ErrorCode.BUDGET_EXCEEDED, watch.message("disk_write"),
                                        audit={"backend": self.name,
                                               "disk_write_bytes": watch.used,
                                               "limit": watch.limit})
            return self._result(ctx, op, plan, outcome, out, err, start, parts, memory_peak,
                                asked_network, degraded, chained=net is not None and layered,
                                oom_kills=oom_kills)
        finally:
            if end is not None:
                end.close()
            # the used group's removal and the next held launcher are background work: woken
            # once the answer is built, not while it is (a woken thread preempts this one and
            # takes the GIL; a spawn joining its cgroup stalls every fork on the host)
            if cg and self._pool is not None:
                self._pool.release(cg)
            if self._held is not None:
                self._held.refill()

    def start_interpreter(self, ctx: ExecContext, op: ExecOp,
                          lifetime_s: float) -> interpreter.InterpreterProcess:
        """A live Python interpreter under the plan ``op`` gets (a stateful session's,
        ``interpreter.py``); refused by every backend but bwrap."""
        return interpreter.start(self, ctx, self._admit(ctx, op), lifetime_s)

    def _spawn(self, plan: Plan, spec: dict[str, Any] | None, stdin: bytes | None,
               exe: str | None, lim: Limits, cg_fds: list[int], net: RestrictedHandle | None,
               reach: uid.Reach, *, stdin_fd: int | None = None,
               ) -> tuple[subprocess.Popen[bytes], cgroups.ExecCgroup | None, int]:
        """Spawn per call: the Python launcher (preexec_fn), or native with ``prespawn: 0``.
        ``stdin_fd``: the tool's stdin as it is (a live interpreter's protocol socket)."""
        cg = self._pool.acquire(lim.pids, lim.memory_bytes, lim.cpu_cores) \
            if self._pool is not None else None
        status_r, status_w = os.pipe()
        exe_fd: int | None = None
        try:
            if exe is not None:  # no preexec_fn: Popen can vfork, the launcher does the rest
                cg_fds += [os.open(f, os.O_WRONLY | os.O_CLOEXEC) for f in
                           (cg.procs_files if cg else [])]
                # the checked descriptor is executed, never the name; the launcher closes it
                # (`-x`) before anything else
                exe_fd = native.open_verified(exe)
            host = [a for fd in cg_fds for a in ("-c", str(fd))] + host_rlimits(
                lim, cg, self.options.max_file_bytes)
            if exe_fd is not None:
                host = ["-x", str(exe_fd), *host]
            argv = self._command(plan, spec, status_w, exe, host if exe is not None else [], net,
                                 reach)
            proc = subprocess.Popen(
                argv, stdin=stdin_fd if stdin_fd is not None else
                subprocess.PIPE if stdin else subprocess.DEVNULL,
                stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                env=plan.env if self.backend == "landlock" else {},  # unshare: in argv
                cwd=plan.cwd if self.backend != "bwrap" else "/", start_new_session=True,
                preexec_fn=preexec(lim, cg, self.options.max_file_bytes, reach,
                                   None if self.backend == "unshare" else self.run_as)
                if exe is None else None,  # proc-unshare: `unshare` itself drops to run_as
                pass_fds=((status_w,) if spec is not None else ()) + tuple(cg_fds)
                + ((exe_fd,) if exe_fd is not None else ()),
                executable=f"/proc/self/fd/{exe_fd}" if exe_fd is not None else None,
                close_fds=True)  # no launcher inside: the tool gets no status pipe to forge
        except native.LauncherRefused as exc:
            os.close(status_r)
            if cg and self._pool is not None:
                self._pool.release(cg)
            raise PolicyEngineError(ErrorCode.PROVIDER_UNAVAILABLE,
                                    f"{self.name}: {exc.strerror}") from None
        except OSError as exc:
            os.close(status_r)
            if cg and self._pool is not None:
                self._pool.release(cg)
            raise PolicyEngineError(ErrorCode.EXECUTION_FAILED,
                                    f"cannot start the sandbox: {exc.strerror}") from None
        except subprocess.SubprocessError:  # the Python launcher's set-up (preexec_fn) failed
            os.close(status_r)
            if cg and self._pool is not None:
                self._pool.release(cg)
            raise PolicyEngineError(
                ErrorCode.EXECUTION_FAILED, "the sandbox could not be set up: its launcher "
                "refused before the tool (a bind source with a symlink on its path or gone, a "
                "mount refused)") from None
        finally:
            os.close(status_w)
            for fd in cg_fds + ([exe_fd] if exe_fd is not None else []):
                os.close(fd)
        return proc, cg, status_r

    def _isolation(self, status: dict[str, Any] | None, network: str) -> dict[str, Any]:
        """What isolated the tool, as evidence reports it.

        Under bwrap the launcher leaves capabilities alone ("kept" in its report) because
        bwrap's `--cap-drop ALL` already dropped every one; say so rather than "kept".
        """
        report: dict[str, Any] = {"bwrap": self.backend == "bwrap",
                                  **(status or {"landlock": "off", "seccomp": "off"})}
        if self.backend == "unshare":
            report["namespaces"] = [*unshare.NAMESPACES, *(["net"] if network != "on" else [])]
        if self.backend == "bwrap" and report.get("caps") in (None, "kept"):
            report["caps"] = "dropped (bwrap --cap-drop ALL)"
        return report

    @staticmethod
    def _known_parts(op: ProcExecOp, plan: Plan, cg: cgroups.ExecCgroup | None) -> _Parts:
        """What the result and its evidence say whatever the outcome: computed while the tool
        runs (the engine thread waits then), not on the path from its exit to the answer."""
        assert plan.limits is not None
        hidden = set(plan.hidden_dirs)
        return _Parts(
            side_effect={"op": "proc.exec", "tool": op.tool, "argc": len(plan.argv),
                         "argv_digest": Digest.of("\0".join(plan.argv).encode()).model_dump()},
            limits=describe(plan.limits, cg),
            # other calls' workspaces by count: their paths name tenants, projects and execs
            masked=[printable_path(p) for p in plan.mask_files
                    + [d for d in plan.mask_dirs if d not in hidden]],
            hidden=len(hidden))

    def _result(self, ctx: ExecContext, op: ProcExecOp, plan: Plan, oc: Outcome, out: HeadTail,
                err: HeadTail, start: float, parts: _Parts,
                memory_peak: int | None, asked_network: str,
                degraded: str | None = None, chained: bool = False,
                oom_kills: int = 0) -> ExecResult:
        assert plan.limits is not None
        assert oc.status is not None
        duration_ms = int((time.monotonic() - start) * 1000)
        status = status_pipe.parse(oc.status_json, 2 if chained else 1)
        if status and "error" not in status:
            status.setdefault("launcher", "python")
            if not str(status.get("seccomp", "")).startswith("enforced"):
                sanitize.sanitize(plan.writable)  # layer 2 ran without its seccomp filter
        # one convention for every first-party executor (docs/plugins.md, "Exit codes"): a
        # tool killed by signal N reports 128 + N, as bwrap (pid 1) and shells already do
        code = os.waitstatus_to_exitcode(oc.status)
        code = 128 - code if code < 0 else code
        out_digest, err_digest = out.digest_fields(), err.digest_fields()  # once each
        audit = {"backend": self.name, "duration_ms": duration_ms, "cpu_ms": oc.rusage_cpu_ms,
                 "stdout": out_digest, "stderr": err_digest}
        if oc.timed_out or oc.cancelled:
            raise PolicyEngineError(ErrorCode.TIMEOUT, "process exceeded its wall-clock timeout"
                                    if oc.timed_out else "process cancelled", audit=audit)
        if "error" in status:
            raise PolicyEngineError(ErrorCode.PROVIDER_UNAVAILABLE,
                                    f"{self.name}: isolation could not be applied: "
                                    f"{status['error']}", audit=audit)
        if code == 128 + signal.SIGXFSZ:
            raise PolicyEngineError(
                ErrorCode.BUDGET_EXCEEDED, "disk quota exceeded: a file written reached the "
                f"{self.options.max_file_bytes}-byte limit (proc option `max_file_bytes`)",
                audit=audit)
        killed_by = status_pipe.end_signal(status.pop("tool_end", None), oc.status,
                                self.backend == "landlock")
        # an exit code 137 is the tool's own (a shell passing on its child's 128 + 9); a SIGKILL
        # with an OOM kill counted is taken for the OOM killer's: the counter names no victim
        # (docs/operations.md, "Memory"); unknown, 137 stands for a SIGKILL as before
        sigkilled = code == 128 + signal.SIGKILL if killed_by is None else \
            killed_by == signal.SIGKILL
        if sigkilled and oom_kills > 0:
            raise PolicyEngineError(
                ErrorCode.BUDGET_EXCEEDED, "memory limit exceeded: the out-of-memory killer of "
                f"the call's memory cgroup ended the tool at the {plan.limits.memory_bytes}-byte "
                "limit (`memory`)", audit={**audit, "oom_kills": oom_kills,
                                           "memory_peak_bytes": memory_peak})
        stderr = err.kept(mark=False)
        if self.backend == "unshare" and not status:  # its launcher reports before any tool
            raise PolicyEngineError(ErrorCode.EXECUTION_FAILED, "proc-unshare could not set up "
                                    "the sandbox: " + stderr.decode(errors="replace")[:300],
                                    audit=audit)
        if (self.backend == "bwrap" and not status and code == 126
                and stderr.startswith(b"policy-engine launcher: ")):
            # the host launcher stopped before bwrap (a bind source changed since the plan:
            # round 6, F01); nothing of the tool ran
            raise PolicyEngineError(ErrorCode.EXECUTION_FAILED, "the sandbox could not be set "
                                    "up: " + stderr.decode(errors="replace")[24:300],
                                    audit=audit)
        if self.backend == "bwrap" and not status and code != 0 and stderr.startswith(b"bwrap:"):
            self._reach_verdicts.clear()  # a bind source closed since it was found reachable?
            raise PolicyEngineError(ErrorCode.EXECUTION_FAILED, "bwrap could not set up the "
                                    "sandbox: " + stderr.decode(errors="replace")[:300],
                                    audit=audit)
        ctx.consume("cpu_ms", oc.rusage_cpu_ms)
        # the models assembled, not validated: every value is built here or in ``_known_parts``,
        # of its field's type (``model.unchecked``, as the fs executor's read)
        ctx.record_side_effect(assembled(SideEffectRec, {"kind": SideEffect.PROCESS, "meta": {
            **parts.side_effect, "exit_code": code, "backend": self.name}}, _EFFECT_GIVEN))
        used = assembled(Usage, {"calls": 0, "bytes_out": 0, "bytes_in": 0,
                                 "cpu_ms": oc.rusage_cpu_ms, "gpu_ms": 0, "file_count": 0},
                         _CPU_GIVEN)
        return assembled(ExecResult, {"ok": True, "code": None, "message": None, "out": {
            "exit_code": code, "duration_ms": duration_ms, "cpu_ms": oc.rusage_cpu_ms,
            "stdout": out.kept(mark=False).decode(errors="replace"),
            "stderr": stderr.decode(errors="replace"),
            "stdout_truncated": out.truncated, "stderr_truncated": err.truncated,
            "stdout_bytes": out.total, "stderr_bytes": err.total,
            "stdout_digest": dict(out_digest), "stderr_digest": dict(err_digest),
            "backend": self.name, "network": plan.network, "network_requested": asked_network,
            "isolation": self._isolation(status, plan.network),
            "limits": parts.limits, "memory_peak_bytes": memory_peak,
            # a child the OOM killer ended while the tool itself went on (its status says how)
            **({"oom_kills": oom_kills} if oom_kills else {}),
            # exit_code 128 + N is also what a tool exiting on its own may return: this says
            # a signal ended it (absent: it exited, or bwrap without layer 2 could not tell)
            **({"signal": killed_by} if killed_by else {}),
            "masked": parts.masked,
            **({"hidden_workspaces": parts.hidden} if parts.hidden else {}),
            **({"degraded": [degraded]} if degraded else {}),
        }, "used": used}, _RESULT_GIVEN)


def host_rlimits(lim: Limits, cg: cgroups.ExecCgroup | None,
                 max_file_bytes: int | None = None) -> list[str]:
    """The native launcher's ``-r`` options: what ``limits.preexec`` sets, as flags."""
    ctrls = cg.controllers if cg else []
    cpu = cpu_seconds(lim)
    out = [(resource.RLIMIT_CORE, 0, 0), (resource.RLIMIT_CPU, cpu, cpu + 1)]
    if max_file_bytes is not None:
        out.append((resource.RLIMIT_FSIZE, max_file_bytes, max_file_bytes))
    if "memory" not in ctrls:
        out.append((resource.RLIMIT_AS, lim.memory_bytes, lim.memory_bytes))
    if "pids" not in ctrls:
        out.append((resource.RLIMIT_NPROC, lim.pids, lim.pids))
    return [a for r, soft, hard in out for a in ("-r", f"{r}:{soft}:{hard}")]


@functools.lru_cache(maxsize=8)
def _filter_hex(deny_inet: bool, deny_setsid: bool, deny_unix: bool, deny_bind: bool) -> str:
    return seccomp.build_filter(deny_inet=deny_inet, deny_setsid=deny_setsid,
                                deny_unix=deny_unix, deny_bind=deny_bind).hex()


def hide_engine_state(ctx: ExecContext, plan: Plan) -> Plan:
    """``plan`` with the engine's state directory masked out of its binds (``state_masks``),
    as the call's guard knows it (``Guard(state_dir=...)``): a bind of the project holding
    ``./var`` shows neither its evidence, its keys nor its tokens, and cannot write there."""
    files, dirs = state_masks(getattr(ctx.guard, "engine_state", None),
                              [*plan.readable, *plan.writable], keep=(plan.cwd,))
    plan.mask_files += [f for f in files if f not in plan.mask_files]
    plan.mask_dirs += [d for d in dirs if d not in plan.mask_dirs]
    return plan


def _decode_stdin(op: ProcExecOp) -> bytes | None:
    if op.stdin_b64 is None:
        return None
    try:
        return base64.b64decode(op.stdin_b64, validate=True)
    except (binascii.Error, ValueError):
        raise PolicyEngineError(ErrorCode.SCHEMA_VALIDATION_FAILED,
                                "`stdin_b64` is not valid base64") from None


def _record_proxy(ctx: ExecContext, net: RestrictedHandle) -> None:
    """The proxy's requests and refusals become the call's side effects; then it stops."""
    try:
        for rec in net.side_effects(settle=2.0):
            ctx.record_side_effect(rec)
    finally:
        net.close()


def _rmtree(path: str) -> None:
    shutil.rmtree(path, ignore_errors=True)


_START_ATTEMPTS = 3  # a sandbox's start, planned again when a masked path vanished meanwhile


def _mask_vanished(plan: Plan, err: PolicyEngineError) -> bool:
    """Whether bwrap failed to set the sandbox up (nothing of the tool ran) while a path the
    plan masks no longer exists: its mount point could not be made (``Can't mkdir parents``,
    ``Can't create file`` in a read-only bind)."""
    return (err.code is ErrorCode.EXECUTION_FAILED
            and err.reason.startswith("bwrap could not set up the sandbox")
            and any(not os.path.lexists(p) for p in (*plan.mask_files, *plan.mask_dirs)))
