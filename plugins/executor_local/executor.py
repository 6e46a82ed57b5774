"""The `local` executor: argv on the host, with what it still enforces and what it does not.

Seed 004's ``LocalSandboxRunner``: no namespaces, no file-system view, no read-only root, the
host's network. What it keeps: the environment the guard decided (nothing inherited), the
timeout (process group and cgroup killed), rlimits and cgroups (memory, pids, cpu, file size),
output limits, and the mandatory denies, which never degrade: the same native launcher as
proc-landlock applies a Landlock ruleset granting the whole host tree *except* every existing
path under a mandatory deny or a forbid of fs.read and the host runtime directories (carved
out), and a seccomp filter refusing AF_UNIX sockets (host control sockets: Landlock does not
govern ``connect()``), setsid and set-id bits. Without Landlock it declares no
``mandatory_denies`` and refuses every call (``PROVIDER.UNAVAILABLE``, with the reason).

An engine running as root runs it as the proc option ``run_as`` (default 65533), like the
other proc backends: the whole host tree is visible, so the host's permission bits are what
keeps root-only files (``/root``, other users' 0700 homes, ``/etc/docker/key.json``) out of
reach, and nothing it leaves behind is owned by root.
"""

from __future__ import annotations

from typing import Literal

from plugins.executor_proc.executor import ProcExecutor, ProcOptions
from plugins.executor_proc.spec import Plan, build_plan
from policy_engine.executor import ExecContext, ExecutorCapabilities
from policy_engine.model import ExecOp, ExecResult, NetworkMode, OpKind, ProcExecOp

NOT_ISOLATED = ("local runner: the process runs on the host with the host's network, the whole "
                "host file tree (its uid's permissions; only the mandatory denies carved out) "
                "and no read-only root; enforced: mandatory denies (Landlock + seccomp), "
                "environment filtering, timeout, rlimits/cgroups")
"""Recorded as degraded on every call, whatever the selection already recorded."""


class LocalExecutor(ProcExecutor):
    """``local``: the proc-landlock launcher with a host-wide ruleset (see the module doc)."""

    local = True
    prespawn_at_start = False  # chosen by configuration only: no idle launchers until used

    def __init__(self, options: ProcOptions | None = None, *,
                 mode: Literal["strict", "compat"] = "compat") -> None:
        super().__init__("landlock", options, mode=mode)
        self.name = "local"
        if not self.usable:
            self.unavailable_reason = ("local runner refused: it enforces the mandatory denies "
                                       f"with Landlock and seccomp, and {self.unavailable_reason}")
        self.capabilities = ExecutorCapabilities(
            op_kinds=frozenset({OpKind.PROC_EXEC}), network_modes=frozenset({NetworkMode.ON}),
            bind_mounts=False, readonly_rootfs=False, resource_limits=True, env_filtering=True,
            streaming_output=False, mandatory_denies=self.usable)

    def _plan(self, ctx: ExecContext, op: ProcExecOp, tmpdir: str) -> Plan:
        return build_plan(ctx.profile, op, env_allow=self.options.env_allow,
                          env_base=self.options.env_base, extra_ro=self.options.extra_ro_binds,
                          tmpdir=tmpdir, whole_host=True)

    def execute(self, ctx: ExecContext, op: ExecOp) -> ExecResult:
        result = super().execute(ctx, op)
        if isinstance(result.out, dict):
            result.out["degraded"] = [*result.out.get("degraded", []), NOT_ISOLATED]
        return result
