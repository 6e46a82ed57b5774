"""Which host uid a proc sandbox runs as, and what it takes for an unprivileged uid to run one.

An engine running as root would otherwise start bwrap as root, and the tool would be host uid 0
with its capabilities dropped: the *owner* of every root-only file it can see (``/etc/docker/
key.json``, ``/etc/ssl/private``) and of every file it leaves in a writable bind (a set-uid copy
would run as root for anyone on the host). So the launcher, still root, joins the exec's cgroup,
sets the rlimits, stages the bind sources the sandbox uid could not reach, then becomes the
sandbox uid (no supplementary groups) and starts bwrap, which maps it to uid 0 of a fresh user
namespace: inside the tool looks like root without capabilities; on the host it is ``run_as``.

One uid for every call, not one per call: what a call leaves in a writable bind must stay
writable for the next call of the same workspace. Concurrent sandboxes sharing it cannot reach
each other: each has its own pid, ipc, network and mount namespace (no process, signal, socket
or path of one is visible to another).

Writable binds: entries the engine's own uid (root) owns are handed to the sandbox uid before a
call (``adopt``: no symlink followed, no hard-linked file, no masked path touched); entries of
other users keep their owner and only their mode decides.
"""

from __future__ import annotations

import contextlib
import os
import stat
import threading
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

DEFAULT_RUN_AS = (65533, 65533)
"""Unassigned on Debian (65000–65533 are reserved, 65534 is ``nobody``), below every subuid
range (100000+) a rootless container runtime hands out."""

STAGE_DIR = "/run/policy-engine-stage"
"""Where the launcher stages bind sources (``sb_launch.c``: STAGE_DIR), under /run: every sandbox
masks /run."""

@dataclass(slots=True)
class Reach:
    """What the launcher does as root, in a private mount namespace, so the sandbox uid can
    reach what it must (``sb_launch.c``: ``-o``, ``-m``, ``-b``): bind sources staged under
    ``STAGE_DIR`` (bwrap binds them from there), directories closed to that uid covered by an
    empty tmpfs, and staged paths bound back at their own place inside (proc-landlock)."""

    staged: list[tuple[int, str]] = field(default_factory=list)
    covers: list[str] = field(default_factory=list)
    rebinds: list[tuple[int, str]] = field(default_factory=list)
    new_ipc: bool = False  # a fresh IPC namespace (proc-landlock: bwrap makes its own)
    hides: list[str] = field(default_factory=list)  # masked dirs under an empty tmpfs, last

    def stage(self, path: str) -> str:
        """Stage ``path``; returns where bwrap finds it."""
        self.staged.append((len(self.staged), path))
        return f"{STAGE_DIR}/{len(self.staged) - 1}"

    def options(self, run_as: tuple[int, int] | None) -> list[str]:
        """The native launcher's options: all of the above, then the drop to ``run_as``."""
        out = ["-I"] if self.new_ipc else []
        out += [a for i, p in self.staged for a in ("-o", f"{i}:{p}")]
        out += [a for c in self.covers for a in ("-m", c)]
        out += [a for i, p in self.rebinds for a in ("-b", f"{i}:{p}")]
        out += [a for h in self.hides for a in ("-M", h)]
        return out + (["-u", f"{run_as[0]}:{run_as[1]}"] if run_as else [])


def reach_in_place(paths: Iterable[str], uid: int, gid: int) -> Reach:
    """For a sandbox without its own mount tree (proc-landlock): every path the process needs
    (system trees, binds, cwd, its tmp dir) that lies below a directory closed to ``uid`` is
    staged, the topmost closed directory covered, and the path bound back at its own place."""
    # never a path through a symlink: root would mount whatever a sandbox made it point to
    wanted = sorted({os.path.abspath(p) for p in paths
                     if os.path.realpath(p) == os.path.abspath(p)})
    closed = {p: c for p in wanted if (c := closed_ancestor(p, uid, gid)) is not None}
    covers = set(closed.values())
    reach = Reach(new_ipc=True)
    reach.covers = sorted(c for c in covers if not any(d != c and _beneath(c, d) for d in covers))
    # a path inside another one that is bound back comes along with it
    for p in sorted(p for p in closed if not any(q != p and _beneath(p, q) for q in closed)):
        reach.stage(p)
        reach.rebinds.append((len(reach.staged) - 1, p))
    return reach


def _beneath(path: str, root: str) -> bool:
    return root == "/" or path == root or path.startswith(root.rstrip("/") + "/")


_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK | os.O_NOCTTY


def reachable(path: str, uid: int, gid: int) -> bool:
    """Whether ``uid``/``gid`` (no other group) can look ``path`` up: search permission on every
    directory above it, through the path as written and through its resolved form."""
    return all(closed_ancestor(p, uid, gid) is None
               for p in {os.path.abspath(path), os.path.realpath(path)})


def closed_ancestor(path: str, uid: int, gid: int) -> str | None:
    """The topmost directory above ``path`` that ``uid``/``gid`` may not search (``/root`` for
    ``/root/.pyenv/bin``), or ``None``; a missing one counts as closed."""
    parts = os.path.abspath(path).split("/")[1:-1]
    parent = "/"
    for name in ["", *parts]:
        parent = os.path.join(parent, name) if name else parent
        try:
            st = os.stat(parent)
        except OSError:
            return parent
        bit = (stat.S_IXUSR if st.st_uid == uid else stat.S_IXGRP if st.st_gid == gid
               else stat.S_IXOTH)
        if not st.st_mode & bit:
            return parent
    return None


def adopt(roots: Iterable[str], uid: int, gid: int, masked: Iterable[str] = ()) -> int:
    """Hand what the engine's uid owns beneath ``roots`` to ``uid:gid``; returns how many entries
    changed. Directories and regular files only, each through a descriptor opened with
    ``O_NOFOLLOW`` and checked after opening (a name swapped for a symlink or a hard link to a
    foreign file changes nothing); a file with more than one link keeps its owner; the walk
    stays on the root's file system. The caller keeps system trees out of ``roots``.

    A directory whose ``(st_dev, st_ino, st_ctime_ns)`` is what it was when it was last fully
    handled (and older than ``RACY_NS`` then) is not listed again: a new entry changes its ctime.
    So a warm call costs one ``open`` + ``fstat`` per directory, not one ``lstat`` per file.
    """
    me = os.geteuid()
    skip = set(masked)
    changed = 0
    for root in roots:
        try:
            fd = os.open(root, _FLAGS | os.O_DIRECTORY)
        except OSError:
            continue
        dev = os.fstat(fd).st_dev
        # depth first, one open descriptor per level: a wide tree holds few descriptors
        stack: list[_Level] = []
        changed += _enter(fd, root, me, uid, gid, stack)
        while stack:
            level = stack[-1]
            e = next(level.entries, None)
            if e is None:
                stack.pop()
                if level.key is not None:  # every entry handled: remember the directory
                    with _lock:
                        if len(_done) >= MAX_REMEMBERED:  # a bound, not an LRU: rare, cheap
                            _done.clear()
                        _done[level.key] = tuple(level.subdirs)
                os.close(level.fd)
                continue
            name, is_dir = e
            path = os.path.join(level.path, name)
            if path in skip:
                continue
            with contextlib.suppress(OSError):
                if is_dir:
                    sub = os.open(name, _FLAGS | os.O_DIRECTORY, dir_fd=level.fd)
                    if os.fstat(sub).st_dev != dev:  # a mount point: not the workspace
                        os.close(sub)
                        continue
                    level.subdirs.append(name)
                    changed += _enter(sub, path, me, uid, gid, stack)
                else:
                    changed += _adopt_file(level.fd, name, me, uid, gid)
    return changed


@dataclass(slots=True)
class _Level:
    fd: int
    path: str
    entries: Iterator[tuple[str, bool]]  # (name, is a directory); files listed only if root's
    key: tuple[int, int, int, int, int] | None  # cache key once trusted
    subdirs: list[str]


_lock = threading.Lock()
_done: dict[tuple[int, int, int, int, int], tuple[str, ...]] = {}
RACY_NS = 2_000_000_000
MAX_REMEMBERED = 200_000  # directories; a forgotten one is listed again, nothing else


def _enter(fd: int, path: str, me: int, uid: int, gid: int, stack: list[_Level]) -> int:
    """Adopt the directory open as ``fd`` and push what is left to do in it (its listing, or
    only its subdirectories when it did not change since it was last handled)."""
    try:
        st = os.fstat(fd)
        adopted = 0
        if st.st_uid == me:
            os.fchown(fd, uid, gid)
            adopted = 1
            st = os.fstat(fd)  # the chown changed its ctime
        key = (st.st_dev, st.st_ino, st.st_ctime_ns, uid, gid)
        with _lock:
            known = _done.get(key)
        if known is not None:
            stack.append(_Level(fd, path, iter([(n, True) for n in known]), None, []))
            return adopted
        entries: list[tuple[str, bool]] = []
        with os.scandir(fd) as it:
            for e in it:  # the descriptor scandir dup()s is closed when the listing ends
                if e.is_symlink():
                    continue
                est = e.stat(follow_symlinks=False)
                if stat.S_ISDIR(est.st_mode):
                    entries.append((e.name, True))
                elif stat.S_ISREG(est.st_mode) and est.st_uid == me:
                    entries.append((e.name, False))
    except OSError:
        os.close(fd)
        return 0
    trusted = time.time_ns() - st.st_ctime_ns > RACY_NS
    stack.append(_Level(fd, path, iter(entries), key if trusted else None, []))
    return adopted


def _adopt_file(dfd: int, name: str, me: int, uid: int, gid: int) -> int:
    fd = os.open(name, _FLAGS, dir_fd=dfd)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_nlink != 1 or st.st_uid != me:
            return 0
        os.fchown(fd, uid, gid)
        return 1
    finally:
        os.close(fd)
