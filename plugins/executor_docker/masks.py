"""Mandatory denies inside a container's host mounts: its workspace binds and the system trees.

A run-once container bind-mounts ``inputs`` and ``work``: every existing path under a mandatory
deny there is hidden, a file under ``/dev/null`` and a directory under an empty read-only tmpfs
(planned by ``policy_engine.sandbox.masks``, the proc executors' planner). A warm container gets
its inputs copied in, where nothing can be mounted over them: those paths are left out of the
copy instead.

The host trees every container binds read-only (``system_binds``, default ``/usr``) get the
masks a proc sandbox plans for them, from its warm walk (``spec.system_masks``): a secret
planted under the host's ``/usr`` is hidden as bubblewrap hides it (attack 35, docker).

The engine's state directory (evidence, keys, tokens) is hidden wherever a user's bind (a bound
call's tree) or a host tree shows it, with the masks a proc sandbox gets
(``guard.binds.state_masks``; attack 36, docker: a bound call on a project holding ``./var``
read the evidence key). The container's own workspace (``/workspace``: the engine's project
directories, by default inside the state directory) is not a user's bind.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from plugins.executor_docker.bound import CONTAINER_ROOT
from plugins.executor_proc.spec import bounded_plan, system_masks
from policy_engine.errors import BackendRefusal, ErrorCode
from policy_engine.executor import ExecContext
from policy_engine.guard.binds import state_masks
from policy_engine.guard.engine_state import EngineState
from policy_engine.guard.paths import is_beneath, quote
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


def engine_state(ctx: ExecContext) -> EngineState | None:
    """The engine's state directory as the call's guard knows it (``Guard(state_dir=...)``,
    the orchestrator's: the proc executor masks the same one)."""
    return getattr(ctx.guard, "engine_state", None)


def mask_mounts(profile: Profile, binds: list[tuple[str, str, bool]],
                system: Sequence[str] = (), state: EngineState | None = None) -> list[Mount]:
    """Mounts hiding every mandatory-denied path inside the ``(source, target, ro)`` binds,
    and inside the host trees ``system`` (bound read-only at their own path: the masks a proc
    sandbox plans for them, ``spec.system_masks``); and the engine's ``state`` directory where
    a user's bind or a host tree shows it (``state_mounts``)."""
    plan = _plan(profile, [s for s, _, _ in binds])
    out = _mounts(plan.files, plan.dirs, binds)
    if system:
        files, dirs = system_masks(profile, system)
        out += _mounts(files, dirs, [(p, p, True) for p in system])
    return out + state_mounts(state, binds, system)


def state_mounts(state: EngineState | None, binds: Sequence[tuple[str, str, bool]],
                 system: Sequence[str] = ()) -> list[Mount]:
    """The engine's state directory hidden in the binds of a user's tree (those outside the
    container's ``/workspace``) and the host trees ``system``, as bubblewrap hides it."""
    if state is None:
        return []
    shown = [b for b in binds if not is_beneath(CONTAINER_ROOT, b[1])]
    shown += [(p, p, True) for p in system]
    files, dirs = state_masks(state, [s for s, _, _ in shown])
    return _mounts(files, dirs, shown)


def _mounts(files: Sequence[str], dirs: Sequence[str],
            binds: list[tuple[str, str, bool]]) -> list[Mount]:
    """A file under ``/dev/null``, a directory under an empty read-only tmpfs, each at the
    path the bind holding it gives it inside the container."""
    out: list[Mount] = []
    for paths, is_dir in ((files, False), (dirs, True)):
        for host in paths:
            source, target = next((s, t) for s, t, _ in binds
                                  if host == s or host.startswith(s.rstrip("/") + "/"))
            inside = _carried(target + host[len(source):])
            mount = docker.types.Mount
            out.append(mount(target=inside, source=None, type="tmpfs", read_only=True)
                       if is_dir else
                       mount(target=inside, source="/dev/null", type="bind", read_only=True))
    return out


def _carried(path: str) -> str:
    """``path``, if the docker engine's API (JSON, UTF-8) can carry it; a name of other bytes
    (a Latin-1 ``caf\\xe9``, kept as a surrogate escape) reached runc as U+FFFD, which then made
    that directory in the user's tree and masked it, leaving the real one readable (attack
    37, F2): the call is refused instead, fail closed."""
    try:
        path.encode("utf-8")
    except UnicodeEncodeError:
        raise BackendRefusal(
            ErrorCode.CAPABILITY_BLOCKED,
            f"docker cannot mask {quote(path)}: a name in it is not UTF-8, which the docker "
            "engine's API cannot carry; rename it, or run the call on proc-bwrap") from None
    return path


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
