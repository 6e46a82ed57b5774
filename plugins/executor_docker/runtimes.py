"""OCI runtimes: which ones dockerd has registered, which is gVisor, and which a call runs on.

Options name runtimes (``runtime``, ``gvisor_runtime``); they are checked against
``docker info`` when the executor is built, so a typo or a daemon without ``runsc`` stops the
engine at start-up naming the registered ones instead of failing some later call. A runtime is
gVisor when its binary is ``runsc`` (``path``) or its containerd shim type names it.
"""

from __future__ import annotations

import posixpath
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from plugins.executor_docker.engine import DockerOptions
from policy_engine.errors import BackendRefusal, ErrorCode
from policy_engine.lazy import lazy_module
from policy_engine.model import Isolation, Profile

if TYPE_CHECKING:
    import docker
    import docker.errors
    import requests.exceptions
else:  # the SDK on first use: a start that runs no container does not import it
    docker = lazy_module("docker")
    requests = lazy_module("requests")


@dataclass(frozen=True, slots=True)
class RuntimePlan:
    """The runtimes the executor uses: the default one and the gVisor one (if any)."""

    default: str | None = None
    gvisor: str | None = None


def registered(client: docker.DockerClient) -> dict[str, dict[str, Any]]:
    """``docker info``'s ``Runtimes``: name → ``{"path": ..., "runtimeArgs": [...]}``."""
    found = client.info().get("Runtimes") or {}
    return {str(k): dict(v or {}) for k, v in found.items()}


def is_gvisor(entry: Mapping[str, Any]) -> bool:
    path = str(entry.get("path") or "")
    kind = str(entry.get("runtimeType") or "")
    return posixpath.basename(path) == "runsc" or "runsc" in kind


def plan(options: DockerOptions, runtimes: Mapping[str, Mapping[str, Any]]) -> RuntimePlan:
    """Check the configured runtimes against dockerd's.

    :raises ValueError: a configured runtime is not registered (the message lists those that
        are), or ``gvisor_runtime`` names one that is not gVisor.
    """
    names = ", ".join(f"`{n}`" for n in sorted(runtimes)) or "none"
    for key in ("runtime", "gvisor_runtime"):
        name = getattr(options, key)
        if name is not None and name not in runtimes:
            raise ValueError(
                f"docker: `{key}: {name}` is not a runtime registered with dockerd "
                f"(registered: {names}); register it in /etc/docker/daemon.json `runtimes` "
                "(scripts/lib/runsc.sh does it for runsc) or fix the name")
    gvisor = options.gvisor_runtime
    if gvisor is not None and not is_gvisor(runtimes[gvisor]):
        raise ValueError(f"docker: `gvisor_runtime: {gvisor}` is not gVisor (its path is "
                         f"`{runtimes[gvisor].get('path')}`, not runsc)")
    if gvisor is None and options.runtime is not None and is_gvisor(runtimes[options.runtime]):
        gvisor = options.runtime
    return RuntimePlan(default=options.runtime, gvisor=gvisor)


def probe(client: docker.DockerClient, options: DockerOptions) -> RuntimePlan:
    """``plan`` against the daemon ``client`` talks to; ``ValueError`` if it cannot be asked."""
    try:
        runtimes = registered(client)
    except (docker.errors.DockerException, requests.exceptions.RequestException,
            OSError) as exc:
        raise ValueError(f"docker: cannot check the configured runtimes: the engine at "
                         f"`{options.base_url}` did not answer ({exc})"[:500]) from None
    return plan(options, runtimes)


def for_profile(profile: Profile, runtimes: RuntimePlan) -> str | None:
    """The runtime a call runs on; the second line after backend selection: a profile that
    requires gVisor never runs on anything else."""
    if profile.isolation is Isolation.GVISOR:
        if runtimes.gvisor is None:
            raise BackendRefusal(
                ErrorCode.CAPABILITY_BLOCKED,
                f"the profile `{profile.name}` requires isolation `gvisor` and this docker "
                "executor has no gVisor runtime (set `options.docker.runtime` or "
                "`gvisor_runtime` to `runsc`)")
        return runtimes.gvisor
    return runtimes.default
