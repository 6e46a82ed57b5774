"""Who writes a bound call's files in its container, and through which bind: never a ``chown``.

A bound call (``bound.py``) binds host directories at their own paths. Their owners never
change (issue 26: a docker call on a root-owned repository used to hand it to uid 1000, after
which host git called it "dubious ownership"):

- every writable bind belongs to one non-root user (``owner.tree_owner``): the container's
  process runs as that ``uid:gid``, so what it writes is that user's;
- a writable bind root owns (a session's workspace, a checkout an engine run as root works
  on) is bound from an id-mapped mount of it (``plugins/executor_proc/idmap.py``) that shows
  on-disk 0 as the container's uid 1000: the container writes it, what it writes is root's on
  disk. Root's files there with a name outside the tree (hard links) and masked paths are bound
  read-only from the plain tree inside the mapped mount; Docker's binds are recursive, so they
  come along. The mapping lives as long as the container: one call for a run-once container,
  the session for a bound session's warm container (detached when it is removed);
- no id-mapped mount can be made (the engine is not root, a remote docker engine, gVisor, a
  kernel or file system without them): strict mode refuses the call, compat mode runs it with
  the tree bound as it is (uid 1000 cannot write root's entries) and records why (``degraded``).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass

from plugins.executor_docker.engine import SANDBOX_USER, DockerOptions
from plugins.executor_docker.workspace import SANDBOX_UID
from plugins.executor_proc import owner, uid
from policy_engine.errors import BackendRefusal, ErrorCode, PolicyEngineError
from policy_engine.sandbox.enginedirs import shared_root_refusal

RUN_AS = (SANDBOX_UID, SANDBOX_UID)
"""The container's uid: what root shows as through an id-mapped bind."""


def idmap_unavailable(options: DockerOptions, gvisor: bool) -> str | None:
    """Why this executor cannot bind an id-mapped mount, from its configuration alone (and
    the call's runtime: ``gvisor``)."""
    if gvisor:  # its gofer, root of another namespace, gets EOVERFLOW from the mapped mount
        return "gVisor's file proxy cannot use an id-mapped mount"
    if not options.base_url.startswith("unix://"):
        return "the docker engine is not on this host (its binds cannot see the engine's mounts)"
    if os.geteuid() != 0:
        return "the engine does not run as root (an id-mapped mount needs it)"
    return None


def mappable(path: str) -> bool:
    """A writable path root owns that is no shared root (``/opt``, ``/home``: installed
    software, other users' files keep root's entries root's)."""
    return owner.owned_by_root(path) and shared_root_refusal(os.path.realpath(path)) is None


def _roots(binds: tuple[tuple[str, bool], ...]) -> list[str]:
    return [p for p, ro in binds if not ro and mappable(p)]


def user_of(binds: tuple[tuple[str, bool], ...]) -> str:
    """The container's ``uid:gid`` for a bound call: the one non-root owner of every writable
    bind, else the sandbox user (1000)."""
    ident = owner.tree_owner([p for p, ro in binds if not ro])
    return f"{ident[0]}:{ident[1]}" if ident is not None else SANDBOX_USER


def strict_refusal(binds: tuple[tuple[str, bool], ...], options: DockerOptions,
                   mode: str, gvisor: bool) -> PolicyEngineError | None:
    """What a strict run refuses from the configuration and the binds' owners alone (the
    executor's ``refusal``: the dry run says the same)."""
    if mode != "strict" or user_of(binds) != SANDBOX_USER:
        return None
    why, roots = idmap_unavailable(options, gvisor), _roots(binds)
    if why is None or not roots:
        return None
    note = owner.RootTrees(roots, failed=why).unwritable(RUN_AS)
    return BackendRefusal(ErrorCode.CAPABILITY_BLOCKED, f"docker: {note}{STRICT_ADVICE}")


STRICT_ADVICE = ("; run in compat mode to run it so, run the engine as root with a local docker "
                 "engine, or keep the tree owned by an unprivileged user")


@dataclass(slots=True)
class BoundIdentity:
    """A bound call's container user and the sources of its writable binds."""

    user: str
    linked: tuple[str, ...] = ()  # root's hard-linked files beneath the mapped roots
    roots: tuple[str, ...] = ()  # writable binds root owns, bound through an id-mapped mount
    masked: tuple[str, ...] = ()
    degraded: str | None = None  # compat: why root's entries stay unwritable

    @property
    def key(self) -> tuple[object, ...]:
        """What a bound session's warm container is made for (re-made when it changes)."""
        return (self.user, self.roots, self.linked)


def plan(binds: tuple[tuple[str, bool], ...], masked: list[str], options: DockerOptions,
         mode: str, gvisor: bool = False) -> BoundIdentity:
    """The identity of a bound call (no mount made yet: :func:`mount` makes it).

    :raises PolicyEngineError: strict mode without an id-mapped bind, or too many hard-linked
        root files (``CAPABILITY_BLOCKED``).
    """
    user = user_of(binds)
    roots = _roots(binds) if user == SANDBOX_USER else []
    if not roots:
        return BoundIdentity(user)
    why = idmap_unavailable(options, gvisor)
    if why is not None:
        return _unmapped(BoundIdentity(user, roots=tuple(roots)), why, mode)
    linked = uid.linked_files(roots, masked)
    if len(linked) > uid.MAX_LINKED:
        raise BackendRefusal(ErrorCode.CAPABILITY_BLOCKED,
                             f"docker: {owner.TooManyLinks(linked)}")
    return BoundIdentity(user, tuple(linked), tuple(roots), tuple(masked))


def _unmapped(ident: BoundIdentity, why: str, mode: str) -> BoundIdentity:
    note = owner.RootTrees(list(ident.roots), failed=why).unwritable(RUN_AS)
    if mode == "strict":  # never a chown; in strict mode, no unwritable tree either
        raise BackendRefusal(ErrorCode.CAPABILITY_BLOCKED, f"docker: {note}{STRICT_ADVICE}")
    return BoundIdentity(ident.user, degraded=note)


Detach = Callable[[], None]


def mount(ident: BoundIdentity, binds: list[tuple[str, str, bool]], mode: str
          ) -> tuple[list[tuple[str, str, bool]], Detach | None, str | None]:
    """``binds`` with each root-owned writable source replaced by its id-mapped mount, what
    detaches them (``None``: nothing mounted), and the compat note when none could be made.

    :raises PolicyEngineError: strict mode when the kernel or file system refuses the mapping,
        too many masked paths (``CAPABILITY_BLOCKED``).
    """
    if not ident.roots:
        return binds, None, ident.degraded
    try:
        trees = owner.map_root_trees(list(ident.roots), {}, RUN_AS, ident.masked, None)
    except (owner.TooManyLinks, ValueError) as exc:
        raise BackendRefusal(ErrorCode.CAPABILITY_BLOCKED, f"docker: {exc}") from None
    if trees.failed is not None:
        return binds, None, _unmapped(ident, trees.failed, mode).degraded
    out = [(trees.targets.get(s, s), t, ro) for s, t, ro in binds]
    return out, trees.close, None
