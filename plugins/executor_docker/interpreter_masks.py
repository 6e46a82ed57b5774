"""What a docker session's live interpreter keeps for its life: the container it runs in,
made with its first call's binds, masks and identity. Compared before each stateful call with
what the call's plain twin would be given now (attack 35, F1; docs/sessions.md "Masks")."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from plugins.executor_docker import identity, masks, runtimes
from plugins.executor_docker.bound import binds_of
from policy_engine.executor import ExecContext

if TYPE_CHECKING:
    from plugins.executor_docker.executor import DockerExecutor
    from plugins.executor_docker.pool import Slot


def wanted(executor: DockerExecutor, ctx: ExecContext
           ) -> tuple[identity.BoundIdentity, list[tuple[str, str, bool]], list[Any]]:
    """The session's bound container as its plain calls plan it (``_pooled``): the call's
    identity (identity.py: the owner's uid, or root through the id-mapped binds), binds and
    the masks over them and over the system trees."""
    profile = ctx.profile
    binds = binds_of(profile)
    ident = identity.plan(binds, masks.masked(profile, [p for p, ro in binds if not ro]),
                          executor.options, executor.mode, gvisor(executor, ctx))
    mounts = [(p, p, ro) for p, ro in binds]
    return ident, mounts, masks.mask_mounts(profile, mounts, executor.options.system_binds,
                                            masks.engine_state(ctx))


def gvisor(executor: DockerExecutor, ctx: ExecContext) -> bool:
    """Whether the call's runtime is gVisor (its identity cannot use an id-mapped bind)."""
    runtime = runtimes.for_profile(ctx.profile, executor.runtimes)
    return runtime is not None and runtime == executor.runtimes.gvisor


def difference(executor: DockerExecutor, ctx: ExecContext, slot: Slot) -> str | None:
    """How the container a plain call would get now differs from ``slot`` (counts only: the
    mounts name secrets), or ``None``.

    :raises PolicyEngineError: the plan is refused now (the plain call would be too).
    """
    ident, mounts, masked = wanted(executor, ctx)
    extra = tuple(executor.bound_extra(mounts, masked))
    if (slot.extra, slot.user, slot.ident) == (extra, ident.user, ident.key):
        return None
    old = slot.extra or ()
    more = sum(1 for m in extra if m not in old)
    gone = sum(1 for m in old if m not in extra)
    return ", ".join(part for part in (
        f"{more} mount(s) now" if more else "", f"{gone} mount(s) gone" if gone else "",
        "another identity" if (slot.user, slot.ident) != (ident.user, ident.key) else "")
        if part) or "another container"
