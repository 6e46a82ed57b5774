"""Mandatory denies inside a container's workspace mounts (the image's own root holds no host file).

A run-once container bind-mounts ``inputs`` and ``work``: every existing path under a mandatory
deny there is hidden, a file under ``/dev/null`` and a directory under an empty read-only tmpfs
(planned by ``policy_engine.sandbox.masks``, the proc executors' planner). A warm container gets
its inputs copied in, where nothing can be mounted over them: those paths are left out of the
copy instead.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from plugins.executor_proc.spec import bounded_plan
from policy_engine.lazy import lazy_module
from policy_engine.model import FsCapability, Profile
from policy_engine.patterns.paths import expand_home
from policy_engine.sandbox.masks import MaskPlan

if TYPE_CHECKING:
    import docker.types
    from docker.types import Mount
else:  # the SDK on first use: a start that runs no container does not import it
    docker = lazy_module("docker")


def _plan(profile: Profile, sources: list[str]) -> MaskPlan:
    home = profile.mappings.home
    patterns = [expand_home(p, home) for d in profile.denies
                if d.mandatory and isinstance(d.capability, FsCapability)
                for p in d.capability.paths]
    return bounded_plan(sources, [], patterns, home)  # a budget past which it is refused


def mask_mounts(profile: Profile, binds: list[tuple[str, str, bool]]) -> list[Mount]:
    """Mounts hiding every mandatory-denied path inside the ``(source, target, ro)`` binds."""
    plan = _plan(profile, [s for s, _, _ in binds])
    out: list[Mount] = []
    for paths, is_dir in ((plan.files, False), (plan.dirs, True)):
        for host in paths:
            source, target = next((s, t) for s, t, _ in binds
                                  if host == s or host.startswith(s.rstrip("/") + "/"))
            inside = target + host[len(source):]
            mount = docker.types.Mount
            out.append(mount(target=inside, source=None, type="tmpfs", read_only=True)
                       if is_dir else
                       mount(target=inside, source="/dev/null", type="bind", read_only=True))
    return out


def hidden_inputs(profile: Profile, inputs: str) -> frozenset[str]:
    """Warm pool: inputs are copied in, where nothing can be mounted over them, so the paths
    under a mandatory deny are left out of the copy instead."""
    plan = _plan(profile, [inputs])
    return frozenset(plan.files + plan.dirs)


def masked(profile: Profile, sources: list[str]) -> list[str]:
    """The host paths under a mandatory deny beneath ``sources`` (bound from the plain tree
    inside an id-mapped bind: ``identity.py``)."""
    plan = _plan(profile, sources)
    return [*plan.files, *plan.dirs]
