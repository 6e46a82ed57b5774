"""Restricted network for containers: the host-side policy proxy, reached through a bridge.

The container keeps ``--network=none`` (loopback only). The per-call proxy
(``policy_engine.netproxy``) listens on a Unix socket in a host runtime directory that is mounted
read-only into the container; the bridge, started first inside the container, listens on
``127.0.0.1:PORT`` there and forwards to that socket, then runs the command with the proxy
variables set. Every request is decided by the call's guard (``ExecContext.guard``) and pinned on
the host; what the proxy did and refused becomes the call's network side effects.

A run-once container gets the runtime directory itself mounted. A warm container's mounts are
fixed when it is created, so each pool slot is created with its own (empty) host directory
mounted at ``SANDBOX_DIR``; a call's runtime directory is made inside it.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterable
from typing import TYPE_CHECKING

from policy_engine.errors import BackendRefusal, ErrorCode
from policy_engine.executor import ExecContext
from policy_engine.lazy import lazy_module
from policy_engine.model import NetworkMode, SideEffectRec
from policy_engine.netproxy import SANDBOX_DIR, RestrictedHandle, RestrictedNetwork
from policy_engine.netproxy.restricted import DEFAULT_PORT

if TYPE_CHECKING:
    import docker.types
    from docker.types import Mount
else:  # the SDK on first use: a start that runs no container does not import it
    docker = lazy_module("docker")

SANDBOX_PYTHON = "/usr/bin/python3"
"""The bridge's interpreter inside the container (from the host's ``/usr``, bound read-only)."""

SETTLE_S = 5.0


def needs_proxy(ctx: ExecContext) -> bool:
    return ctx.profile.network is NetworkMode.RESTRICTED


def python_bound(system_binds: Iterable[str]) -> bool:
    """Whether ``SANDBOX_PYTHON`` exists in the container (a system bind provides it)."""
    return any(SANDBOX_PYTHON.startswith(b.rstrip("/") + "/") for b in system_binds)


def check_bridge_binds(system_binds: Iterable[str]) -> None:
    """The bridge runs ``SANDBOX_PYTHON``: refuse restricted mode when no bind provides it."""
    if not python_bound(system_binds):
        raise BackendRefusal(
            ErrorCode.CAPABILITY_BLOCKED,
            f"restricted network needs `{SANDBOX_PYTHON}` in the container: bind `/usr` "
            "(docker option `system_binds`)")


def start_proxy(ctx: ExecContext, deadline: float, *, slot_dir: str | None = None,
                pooled: bool = False) -> RestrictedHandle:
    """Start the call's proxy, deciding with the orchestrator's guard (``ctx.guard``).

    :param slot_dir: a warm container's host directory already mounted at ``SANDBOX_DIR``.
    :param pooled: pick a random bridge port, so two calls of one session sharing a warm
        container do not collide.
    """
    port = 20000 + secrets.randbelow(30000) if pooled else DEFAULT_PORT
    return RestrictedNetwork(
        ctx.profile, ctx.guard, deadline=deadline, port=port, python=SANDBOX_PYTHON,
        sandbox_dir=SANDBOX_DIR, runtime_parent=slot_dir, parent_mounted=slot_dir is not None,
        consume=ctx.consume,
        limits=ctx.limits,
    ).start()


def runtime_mount(net: RestrictedHandle) -> Mount:
    """The run-once mount of the proxy's runtime directory (read-only)."""
    return docker.types.Mount(target=net.sandbox_dir, source=str(net.runtime_dir),
                              type="bind", read_only=True)


def record_effects(ctx: ExecContext, net: RestrictedHandle) -> dict[str, int]:
    """Attach what the proxy did (refusals included) to the call's evidence; return counts."""
    effects: list[SideEffectRec] = net.side_effects(SETTLE_S)
    for rec in effects:
        ctx.record_side_effect(rec)
    refused = sum(1 for e in effects if "refused" in e.meta)
    return {"requests": len(effects), "refused": refused}
