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

Writable binds the engine's own uid (root) owns are bound through an id-mapped mount that shows
root as the sandbox uid (``idmap.py``): nothing changes owner, and what the tool writes there is
root's; root's files with a name outside the tree (:func:`linked_files`) stay read-only.
Entries of other users keep their owner and only their mode decides.
"""

from __future__ import annotations

import contextlib
import os
import stat
import threading
import time
from collections.abc import Callable, Iterable, Iterator
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


def reachable(path: str, uid: int, gid: int,
              realpath: Callable[[str], str] = os.path.realpath) -> bool:
    """Whether ``uid``/``gid`` (no other group) can look ``path`` up: search permission on every
    directory above it, through the path as written and through its resolved form
    (``realpath``: ``os.path.realpath`` or one answering alike, as ``spec.realpath``)."""
    return all(closed_ancestor(p, uid, gid) is None
               for p in {os.path.abspath(path), realpath(path)})


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


MAX_LINKED = 64
"""Hard-linked root files masked read-only beneath the id-mapped binds of one call; past it the
call is refused (each one is a bind the launcher stages)."""


def linked_files(roots: Iterable[str], masked: Iterable[str] = ()) -> list[str]:
    """Regular files the engine's uid owns beneath ``roots`` with a name outside their root: more
    links than the walk found names for inside it (a hard link in the workspace to a host file).
    An id-mapped bind shows every root inode of the tree as the sandbox's own, so these are
    bound read-only from the plain tree (``idmap.py``). Symlinks are never followed; the walk
    stays on the root's file system; masked paths are skipped (they are covered anyway).

    A directory whose ``(st_dev, st_ino, st_ctime_ns)`` is what it was when it was last listed
    (and older than ``RACY_NS`` then) is not listed again: a new entry changes its ctime. Only
    its remembered subdirectories are entered and its remembered linked files looked at afresh
    (their link count may have changed), so a warm call costs one ``open`` + ``fstat`` per
    directory, not one ``lstat`` per file. Known gap (as ``policy_engine.sandbox.hardlinks``): a
    file listed with one link that later gains a name elsewhere, its directory unchanged, is not
    seen until its directory changes; only host root can make such a link.
    """
    me = os.geteuid()
    skip = set(masked)
    out: list[str] = []
    for root in roots:
        try:
            fd = os.open(root, _FLAGS | os.O_DIRECTORY)
        except OSError:
            continue
        dev = os.fstat(fd).st_dev
        found: dict[tuple[int, int], tuple[int, list[str]]] = {}  # inode: (links, names here)
        # depth first, one open descriptor per level: a wide tree holds few descriptors
        stack: list[_Level] = []
        _enter(fd, root, me, stack)
        while stack:
            level = stack[-1]
            e = next(level.entries, None)
            if e is None:
                stack.pop()
                if level.key is not None:  # every entry seen: remember the directory
                    with _lock:
                        if len(_done) >= MAX_REMEMBERED:  # a bound, not an LRU: rare, cheap
                            _done.clear()
                        _done[level.key] = (tuple(level.subdirs), tuple(level.linked))
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
                    _enter(sub, path, me, stack)
                    continue
                st = os.lstat(name, dir_fd=level.fd)
                if stat.S_ISREG(st.st_mode) and st.st_uid == me and st.st_nlink > 1:
                    level.linked.append(name)
                    links, names = found.setdefault((st.st_dev, st.st_ino), (st.st_nlink, []))
                    names.append(path)
        # every name of an inode inside this root: the links stay in the tree, nothing to mask
        out += [p for links, names in found.values() if len(names) < links for p in names]
    return sorted(out)


@dataclass(slots=True)
class _Level:
    fd: int
    path: str
    entries: Iterator[tuple[str, bool]]  # (name, is a directory); files: root's, linked
    key: tuple[int, int, int] | None  # cache key once trusted
    subdirs: list[str]
    linked: list[str]


_lock = threading.Lock()
_done: dict[tuple[int, int, int], tuple[tuple[str, ...], tuple[str, ...]]] = {}
RACY_NS = 2_000_000_000
MAX_REMEMBERED = 200_000  # directories; a forgotten one is listed again, nothing else


def _enter(fd: int, path: str, me: int, stack: list[_Level]) -> None:
    """Push what is left to do in the directory open as ``fd``: its listing, or only its
    remembered subdirectories and linked files when it did not change since it was listed."""
    try:
        st = os.fstat(fd)
        key = (st.st_dev, st.st_ino, st.st_ctime_ns)
        with _lock:
            known = _done.get(key)
        if known is not None:
            subdirs, linked = known
            entries = [(n, True) for n in subdirs] + [(n, False) for n in linked]
            stack.append(_Level(fd, path, iter(entries), None, [], []))
            return
        listed: list[tuple[str, bool]] = []
        with os.scandir(fd) as it:
            for e in it:  # the descriptor scandir dup()s is closed when the listing ends
                if e.is_symlink():
                    continue
                est = e.stat(follow_symlinks=False)
                if stat.S_ISDIR(est.st_mode):
                    listed.append((e.name, True))
                elif stat.S_ISREG(est.st_mode) and est.st_uid == me and est.st_nlink > 1:
                    listed.append((e.name, False))
    except OSError:
        os.close(fd)
        return
    trusted = time.time_ns() - st.st_ctime_ns > RACY_NS
    stack.append(_Level(fd, path, iter(listed), key if trusted else None, [], []))
