"""The `local` executor: argv on the host, with what it still enforces and what it does not.

Seed 004's ``LocalSandboxRunner``: no namespaces of its own, no file-system view, the host's
network. What it keeps: the environment the guard decided (nothing inherited), the timeout
(process group and cgroup killed), rlimits and cgroups (memory, pids, cpu, file size), output
limits, and the mandatory denies, which never degrade: the same native launcher as proc-landlock
applies a Landlock ruleset granting read and execute on the whole host tree *except* every
existing path under a mandatory deny or a forbid of fs.read and the host runtime directories
(carved out), writes only where the profile grants them, and a seccomp filter refusing AF_UNIX
sockets (host control sockets: Landlock does not govern ``connect()``), setsid and set-id
bits. Without Landlock it declares no ``mandatory_denies`` and refuses every call
(``PROVIDER.UNAVAILABLE``, with the reason).

Writes stay the profile's (a read-only root) although seed 004's runner writes anywhere: every
proc sandbox runs as the one ``run_as`` uid and every workspace a call ever wrote was handed to
it, so a runner writing wherever that uid may would write into every other workspace on the
host. An engine running as root runs it as ``run_as`` (default 65533), like the other proc
backends: with the whole tree in view, the host's permission bits keep root-only files
(``/root``, other users' 0700 homes, ``/etc/docker/key.json``) out of reach, and nothing it leaves
behind is owned by root. What the permission bits cannot separate is the sandbox uid from
itself: every workspace a call wrote belongs to ``run_as``, so each directory that uid owns
outside the profile's paths is carved out like a mandatory deny (attack round 4, F01).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Literal

from plugins.executor_proc import uid
from plugins.executor_proc.executor import ProcExecutor, ProcOptions
from plugins.executor_proc.spec import Plan, build_plan
from policy_engine.executor import ExecContext, ExecutorCapabilities
from policy_engine.model import ExecOp, ExecResult, NetworkMode, OpKind, ProcExecOp

NOT_ISOLATED = ("local runner: the process runs on the host with the host's network and the "
                "whole host file tree readable (its uid's permissions; only the mandatory denies "
                "carved out); enforced: mandatory denies (Landlock + seccomp), writes to the "
                "profile's writable paths only, environment filtering, timeout, rlimits/cgroups")
"""Recorded as degraded on every call, whatever the selection already recorded."""


HIDDEN_ROOTS = frozenset({"tmp", "proc", "sys", "dev", "run"})
"""Top-level trees outside the host view: /tmp holds other calls' and users' transient files
(the call has its own TMPDIR), /proc every process's argv, /dev raw devices (the launcher grants
/dev/null, /dev/zero, /dev/urandom), /run the host control sockets."""


def host_roots(run_as: tuple[int, int] | None) -> list[str]:
    """The top-level directories of ``/`` the runner may read: not hidden, not a symlink (its
    target is a root of its own), and searchable by the sandbox uid (a closed one, /root, needs
    no rules: its permission bits already keep it out)."""
    roots = []
    for name in sorted(os.listdir("/")):
        path = os.path.join("/", name)
        if name in HIDDEN_ROOTS or os.path.islink(path) or not os.path.isdir(path):
            continue
        if run_as is None or uid.closed_ancestor(os.path.join(path, "x"), *run_as) is None:
            roots.append(path)
    return roots


class LocalExecutor(ProcExecutor):
    """``local``: the proc-landlock launcher with a host-wide read ruleset (module doc)."""

    local = True
    prespawn_at_start = False  # chosen by configuration only: no idle launchers until used

    def __init__(self, options: ProcOptions | None = None, *,
                 mode: Literal["strict", "compat"] = "compat", hidden: Sequence[str] = (),
                 warm_ahead: bool = True) -> None:
        """``hidden``: trees kept out of the host view like a mandatory deny (the engine's
        state directory: other tenants' docker workspaces, budgets, evidence)."""
        super().__init__("landlock", options, mode=mode, warm_ahead=warm_ahead)
        self.hidden = [os.path.abspath(p) for p in hidden]
        self.name = "local"
        if not self.usable:
            self.unavailable_reason = ("local runner refused: it enforces the mandatory denies "
                                       f"with Landlock and seccomp, and {self.unavailable_reason}")
        self.capabilities = ExecutorCapabilities(
            op_kinds=frozenset({OpKind.PROC_EXEC}), network_modes=frozenset({NetworkMode.ON}),
            bind_mounts=False, readonly_rootfs=True, resource_limits=True, env_filtering=True,
            streaming_output=False, mandatory_denies=self.usable)

    def _plan(self, ctx: ExecContext, op: ProcExecOp, tmpdir: str) -> Plan:
        self._warm()  # as ProcExecutor._plan
        plan = build_plan(ctx.profile, op, env_allow=self.options.env_allow,
                          env_base=self.options.env_base, extra_ro=self.options.extra_ro_binds,
                          tmpdir=tmpdir, host_roots=host_roots(self.run_as),
                          foreign_owner=self.run_as[0] if self.run_as else None)
        # carved out with the masks (plan.landlock_rules is computed later, from these)
        plan.mask_dirs += [p for p in self.hidden if os.path.isdir(p)
                           and p not in plan.mask_dirs]
        return plan

    def execute(self, ctx: ExecContext, op: ExecOp) -> ExecResult:
        result = super().execute(ctx, op)
        if isinstance(result.out, dict):
            result.out["degraded"] = [*result.out.get("degraded", []), NOT_ISOLATED]
        return result
