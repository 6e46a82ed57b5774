"""Which identity writes a call's files, and how, without ever a ``chown`` of the user's tree.

An engine running as root runs its proc sandboxes as an unprivileged uid. When every writable
bind of a call belongs to one non-root user (a developer's checkout run through ``sudo``, a CI
workspace), the sandbox runs as that user: bwrap maps the uid to 0 of its user namespace, so
the tool looks like root inside and every file it writes is the owner's on the host; nothing of
the tree changes owner (issue 26: a first run used to hand the whole repository to uid 65533,
after which host git refused it as "dubious ownership"). The set-uid/set-gid protections are
the same as for ``run_as`` (seccomp refuses those modes; ``nosuid`` binds).

A writable bind root owns (an engine run as root on a root-owned checkout: CI, containers) is
bound through an id-mapped mount (:func:`map_root_trees`, ``idmap.py``) that shows root as
``run_as``: the unprivileged sandbox writes it, what it writes is root's on disk, no owner
changes. Root's files there with a name outside the tree (a hard link to a host file) would be
writable through it: each is bound read-only from the plain tree over its name in the mapped one
(``uid.linked_files``, ``idmap._mask_file``): root's there, its mode unchangeable; at most
``uid.MAX_LINKED``, past which the call is refused. Where no id-mapped mount can be made (old
kernel or file system, the Python launcher, bwrap without its seccomp layer) strict mode refuses
the call and compat mode runs it with root's entries unwritable, saying so: never a ``chown``.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable
from dataclasses import dataclass, field

from plugins.executor_proc import idmap, uid
from policy_engine.guard.binds import beneath


def tree_owner(writable: Iterable[str]) -> tuple[int, int] | None:
    """``(uid, gid)`` of the one non-root owner of every writable bind, else ``None`` (no
    writable bind, a root-owned one, several owners, or one that cannot be read)."""
    owners: set[tuple[int, int]] = set()
    for path in writable:
        try:
            st = os.lstat(path)
        except OSError:
            return None
        if not stat.S_ISDIR(st.st_mode) and not stat.S_ISREG(st.st_mode):
            return None
        owners.add((st.st_uid, st.st_gid))
    if len(owners) != 1:
        return None
    (uid_, gid), = owners
    return (uid_, gid) if uid_ != 0 and gid != 0 else None


@dataclass(slots=True)
class RootTrees:
    """The id-mapped binds of one call's root-owned writable paths, or why there are none."""

    roots: list[str]  # the writable paths (as the sandbox sees them) root owns
    mounted: idmap.IdMapped | None = None
    targets: dict[str, str] = field(default_factory=dict)  # writable path: mapped mount point
    linked: list[str] = field(default_factory=list)  # bound read-only from the plain tree
    failed: str | None = None  # why no id-mapped bind: strict refuses, compat runs unwritable

    def close(self) -> None:
        """Detach the mappings (in the background: the call's result does not wait)."""
        if self.mounted is not None:
            self.mounted.close_later()
            self.mounted = None

    def unwritable(self, run_as: tuple[int, int]) -> str:
        """What a compat call records when it runs without the id-mapped binds."""
        return (f"no id-mapped bind ({self.failed}): the writable paths root owns "
                f"({', '.join(self.roots[:3])}{', ...' if len(self.roots) > 3 else ''}) are "
                f"bound as they are, so uid {run_as[0]} cannot write root's entries there; "
                "nothing changed owner (docs/operations.md, \"Who writes your files\")")


STRICT_ADVICE = ("; run in compat mode to run it so, use the native launcher with layer 2, or "
                 "keep the tree owned by an unprivileged user")


class TooManyLinks(Exception):
    """More hard-linked root files than ``uid.MAX_LINKED`` beneath the root-owned binds."""

    def __init__(self, paths: list[str]) -> None:
        super().__init__(f"{len(paths)} root-owned files beneath the writable paths have a name "
                         f"outside them (hard links, e.g. {paths[0]}); at most {uid.MAX_LINKED} "
                         "are bound read-only through an id-mapped bind: remove the extra links "
                         "(`find PATH -type f -links +1`), or keep the workspace owned by an "
                         "unprivileged user, which the sandbox then writes as")
        self.paths = paths


MAX_PLAIN = 256
"""Masked and write-forbidden paths bound from the plain tree beneath the id-mapped binds of one
call (each a mount); past it the call is refused."""


def map_root_trees(roots: list[str], resolved: dict[str, str], run_as: tuple[int, int],
                   masked: Iterable[str], unavailable: str | None) -> RootTrees:
    """Id-mapped binds of ``roots`` (writable paths root owns, system trees and shared roots
    already left out by the caller), their hard-linked root files found first. The ``masked``
    paths beneath them (secrets, write-forbidden paths) are bound from the plain tree too: the
    mapping would make them the sandbox's, whose mode it could then change (Landlock governs
    no ``chmod``). ``unavailable`` says why this launcher cannot carry one (then none is tried).

    :raises TooManyLinks: past ``uid.MAX_LINKED`` linked files (nothing mounted).
    :raises ValueError: past ``MAX_PLAIN`` masked paths beneath the roots (nothing mounted).
    """
    out = RootTrees(roots)
    if not roots:
        return out
    if unavailable is not None:
        out.failed = unavailable
        return out
    skip = list(masked)
    sources = {w: resolved.get(w, w) for w in roots}
    linked = {src: uid.linked_files([src], skip) for src in sources.values()}
    # named as the sandbox sees them
    out.linked = [w + p[len(src):] for w, src in sources.items() for p in linked[src]]
    if len(out.linked) > uid.MAX_LINKED:
        raise TooManyLinks(out.linked)
    plain = {src: [*linked[src], *(src + p[len(w):] for p in skip if p != w and beneath(p, w))]
             for w, src in sources.items()}
    if sum(len(v) for v in plain.values()) - len(out.linked) > MAX_PLAIN:
        raise ValueError(f"more than {MAX_PLAIN} masked or write-forbidden paths beneath the "
                         "writable paths root owns would each need a bind of their own: narrow "
                         "the fs rules, or keep the workspace owned by an unprivileged user")
    try:
        out.mounted = idmap.IdMapped(list(sources.values()), *run_as, readonly=plain)
    except OSError as exc:
        out.failed, out.linked = str(exc), []
        return out
    out.targets = {w: out.mounted.mounts[resolved.get(w, w)] for w in roots}
    return out


def owned_by_root(path: str) -> bool:
    try:
        return os.lstat(path).st_uid == 0
    except OSError:
        return False
