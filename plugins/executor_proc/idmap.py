"""Id-mapped binds: the sandbox uid writes a root-owned tree as root, and no owner changes.

A root engine runs its sandboxes as ``run_as`` (65533). A writable bind that root owns used to
be handed to that uid before a call (a ``chown`` of the user's tree; host git then called the
repository "dubious ownership"; issue 26). With an id-mapped mount (``mount_setattr`` with
``MOUNT_ATTR_IDMAP``, Linux ≥ 5.12, on the file systems that support it) the tree is mounted
once more, for the call, with on-disk uid/gid 0 shown as ``run_as``: the sandbox owns it inside,
and what it writes lands on disk as root. Other owners' entries show as the overflow id
(nobody) and only their mode decides.

The mount is made by the engine (root) in the host's mount namespace under
``IDMAP_DIR/<token>/<n>`` (``IDMAP_DIR`` is root's 0700: no other host process reaches it), and
the root launcher binds it where the sandbox sees the writable path (staged for bubblewrap,
bound back in place for the others). Root's files there with a name outside the tree (hard links
to host files, which the mapping would make the sandbox's) are bound read-only over it from the
plain tree first (:func:`_mask_file`; the staging binds are recursive, so they come along), and
so are masked and write-forbidden paths. All is detached when the call ends. The user namespace
that carries the mapping (``0 run_as 1``) is made once per uid and kept open. The mapped mount
is not recursive: a mount point inside the tree shows its underlying directory there.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import fcntl
import os
import secrets
import shutil
import stat
import subprocess
import threading
import time
from collections.abc import Iterable, Iterator, Mapping

IDMAP_DIR = "/run/policy-engine-idmap"
_SYS_OPEN_TREE, _SYS_MOVE_MOUNT, _SYS_MOUNT_SETATTR = 428, 429, 442
_OPEN_TREE_CLONE, _OPEN_TREE_CLOEXEC = 1, 0o2000000
_AT_EMPTY_PATH, _AT_FDCWD = 0x1000, -100
_MOVE_MOUNT_F_EMPTY_PATH, _MOVE_MOUNT_T_EMPTY_PATH = 4, 0x40
_MOUNT_ATTR_IDMAP = 0x00100000
_MOUNT_ATTR_RO_FILE = 0x1 | 0x2 | 0x4  # MOUNT_ATTR_RDONLY | NOSUID | NODEV
_O_PATH = 0o10000000
_MNT_DETACH = 2


class _Attr(ctypes.Structure):
    _fields_ = [("attr_set", ctypes.c_uint64), ("attr_clr", ctypes.c_uint64),
                ("propagation", ctypes.c_uint64), ("userns_fd", ctypes.c_uint64)]


_libc = ctypes.CDLL(None, use_errno=True)
_lock = threading.Lock()
_userns: dict[tuple[int, int], int] = {}


class IdmapError(OSError):
    """An id-mapped mount could not be made (kernel, file system, or no ``unshare``)."""


def _fail(what: str) -> IdmapError:
    err = ctypes.get_errno()
    return IdmapError(err, f"{what}: {os.strerror(err)}")


def _userns_fd(uid: int, gid: int) -> int:
    """An open descriptor of a user namespace mapping 0 to ``uid``/``gid`` (made once)."""
    with _lock:
        fd = _userns.get((uid, gid))
        if fd is not None:
            return fd
        binary = shutil.which("unshare")
        if binary is None:
            raise IdmapError(0, "util-linux `unshare` is not on PATH")
        child = subprocess.Popen([binary, "--user", "sleep", "30"], env={}, close_fds=True,
                                 stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                 stderr=subprocess.DEVNULL)
        try:
            deadline = time.monotonic() + 5
            mine = os.readlink("/proc/self/ns/user")
            while os.readlink(f"/proc/{child.pid}/ns/user") == mine:
                if time.monotonic() > deadline or child.poll() is not None:
                    raise IdmapError(0, "cannot make a user namespace")
                time.sleep(0.005)
            with open(f"/proc/{child.pid}/uid_map", "w") as fh:
                fh.write(f"0 {uid} 1")
            with open(f"/proc/{child.pid}/setgroups", "w") as fh:
                fh.write("deny")
            with open(f"/proc/{child.pid}/gid_map", "w") as fh:
                fh.write(f"0 {gid} 1")
            fd = os.open(f"/proc/{child.pid}/ns/user", os.O_RDONLY | os.O_CLOEXEC)
        finally:
            child.kill()
            child.wait()
        _userns[(uid, gid)] = fd
        return fd


def _mount_idmapped(source: str, target: str, userns: int) -> None:
    fd = _libc.syscall(_SYS_OPEN_TREE, _AT_FDCWD, os.fsencode(source),
                       _OPEN_TREE_CLONE | _OPEN_TREE_CLOEXEC)
    if fd < 0:
        raise _fail(f"open_tree {source}")
    try:
        attr = _Attr(_MOUNT_ATTR_IDMAP, 0, 0, userns)
        if _libc.syscall(_SYS_MOUNT_SETATTR, fd, b"", _AT_EMPTY_PATH, ctypes.byref(attr),
                         ctypes.sizeof(attr)) != 0:
            raise _fail(f"mount_setattr(MOUNT_ATTR_IDMAP) {source}")
        if _libc.syscall(_SYS_MOVE_MOUNT, fd, b"", _AT_FDCWD, os.fsencode(target),
                         _MOVE_MOUNT_F_EMPTY_PATH) != 0:
            raise _fail(f"move_mount {target}")
    finally:
        os.close(fd)


def _open_beneath(root: str, rel: str) -> int:
    """An ``O_PATH`` descriptor of ``root/rel`` opened with no symlink on the way (a name
    swapped for a link since the walk raises ``OSError``, never a mount on the link's target)."""
    fd = os.open(root, _O_PATH | os.O_NOFOLLOW | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        parts = [p for p in rel.split("/") if p]
        for i, name in enumerate(parts):
            last = i == len(parts) - 1
            nxt = os.open(name, _O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC
                          | (0 if last else os.O_DIRECTORY), dir_fd=fd)
            os.close(fd)
            fd = nxt
        return fd
    except BaseException:
        os.close(fd)
        raise


def _mask_file(plain_root: str, mapped_root: str, rel: str) -> None:
    """Bind ``plain_root/rel`` read-only (and nosuid, nodev) over the same file or directory
    seen through the id-mapped ``mapped_root``: a root file with a name outside the tree (a hard
    link to a host file), a masked or write-forbidden one, stays root's there, unwritable, its
    mode unchangeable by the sandbox (Landlock governs no ``chmod``)."""
    try:
        src = _open_beneath(plain_root, rel)
    except FileNotFoundError:
        return  # gone since the walk: nothing to mask
    try:
        dst = _open_beneath(mapped_root, rel)
        try:
            a, b = os.fstat(src), os.fstat(dst)
            if (a.st_dev, a.st_ino) != (b.st_dev, b.st_ino):
                raise IdmapError(0, f"{rel} changed while the call was planned")
            if not stat.S_ISREG(a.st_mode) and not stat.S_ISDIR(a.st_mode):
                return  # a symlink's mode is not the sandbox's to change
            tree = _libc.syscall(_SYS_OPEN_TREE, src, b"",
                                 _OPEN_TREE_CLONE | _OPEN_TREE_CLOEXEC | _AT_EMPTY_PATH)
            if tree < 0:
                raise _fail(f"open_tree {rel}")
            try:
                attr = _Attr(_MOUNT_ATTR_RO_FILE, 0, 0, 0)
                if _libc.syscall(_SYS_MOUNT_SETATTR, tree, b"", _AT_EMPTY_PATH,
                                 ctypes.byref(attr), ctypes.sizeof(attr)) != 0:
                    raise _fail(f"mount_setattr(MOUNT_ATTR_RDONLY) {rel}")
                if _libc.syscall(_SYS_MOVE_MOUNT, tree, b"", dst, b"",
                                 _MOVE_MOUNT_F_EMPTY_PATH | _MOVE_MOUNT_T_EMPTY_PATH) != 0:
                    raise _fail(f"move_mount {rel}")
            finally:
                os.close(tree)
        finally:
            os.close(dst)
    finally:
        os.close(src)


_MS_BIND, _MS_PRIVATE = 0x1000, 1 << 18
_private = False
_pending: set[threading.Thread] = set()


def _private_dir() -> None:
    """``IDMAP_DIR``, root's 0700, made a private mount once: a mapping made under it is not
    copied to every peer of the host's shared ``/run`` (each copy costs, and is one more place
    it shows). The launcher's own namespace, made after the mapping, still copies it."""
    global _private
    with _lock:
        os.makedirs(IDMAP_DIR, mode=0o700, exist_ok=True)
        os.chmod(IDMAP_DIR, 0o700)  # INVARIANT: only root reaches the mappings
        if _private:
            return
        where = os.fsencode(IDMAP_DIR)
        # one mount for every engine process: a second bind onto it, not recursive, would
        # cover the mappings other processes made beneath (their containers got the empty
        # directory). The lock: two engines starting at once must not both bind it
        with _start_lock():
            if not _is_mount_point(IDMAP_DIR):
                _libc.mount(where, where, None, _MS_BIND, None)
            # best effort: a shared one only costs the copies
            _private = _libc.mount(None, where, None, _MS_PRIVATE, None) == 0
            _sweep_orphans()


@contextlib.contextmanager
def _start_lock() -> Iterator[None]:
    """Every engine's start-up work on ``IDMAP_DIR`` (its mount, the sweep, a new owner file),
    one process at a time."""
    lock = os.open(IDMAP_DIR + ".lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield
    finally:
        os.close(lock)  # releases the lock


_owner: str | None = None
_OWNER_SUFFIX = ".owner"


def _owner_token() -> str:
    """This process's owner token: the prefix of every mapping directory it makes, held alive
    by an exclusive ``flock`` on ``IDMAP_DIR/<token>.owner`` that the kernel drops when the
    process dies, however it dies (a pid would be reused, and differs across pid namespaces).
    Called under ``_lock``."""
    global _owner
    if _owner is None:
        token = secrets.token_hex(6)
        with _start_lock():  # a sweep never sees the file before its lock is taken
            fd = os.open(os.path.join(IDMAP_DIR, token + _OWNER_SUFFIX),
                         os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
            fcntl.flock(fd, fcntl.LOCK_EX)  # kept open: held for the process's life
        _owner = token
    return _owner


def _sweep_orphans() -> None:
    """Detach the mappings of engines that died holding them (SIGKILL, OOM, a crash with a
    live docker session): their owner file's lock is free. Each mount point under such an
    owner's directories is detached, deepest first, and only empty directories are removed —
    never a file through a mapping that failed to detach. Directories of an older engine
    (no owner token in their name) are left alone: their owner cannot be told. Called under
    the start lock (two engines starting at once do not sweep each other)."""
    try:
        names = os.listdir(IDMAP_DIR)
    except OSError:
        return
    for name in names:
        if not name.endswith(_OWNER_SUFFIX):
            continue
        token = name[:-len(_OWNER_SUFFIX)]
        if token == _owner:
            continue
        path = os.path.join(IDMAP_DIR, name)
        try:
            fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
        except OSError:
            continue
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                continue  # its engine is alive
            dirs = [os.path.join(IDMAP_DIR, d) for d in names
                    if d.startswith(token + ".") and d != name]  # not the owner file itself
            if all(_detach_tree(d) for d in dirs):
                os.unlink(path)  # kept while a mapping remains: the next start tries again
        finally:
            os.close(fd)


def _detach_tree(top: str) -> bool:
    """Detach every mount at or below ``top`` (deepest first) and remove its now empty
    directories; ``True`` when nothing of it remains."""
    prefix = top + "/"
    points = {p for p in _mount_points() if p == top or p.startswith(prefix)}
    for point in sorted(points, key=len, reverse=True):
        _libc.umount2(os.fsencode(point), _MNT_DETACH)
    for name in sorted(os.listdir(top), reverse=True) if os.path.isdir(top) else ():
        with contextlib.suppress(OSError):
            os.rmdir(os.path.join(top, name))
    with contextlib.suppress(OSError):
        os.rmdir(top)
    return not os.path.lexists(top)


def _is_mount_point(path: str) -> bool:
    """Whether a mount sits at ``path``: ``os.path.ismount`` says no for a bind within one
    file system, so each engine start bound ``IDMAP_DIR`` again."""
    return path in _mount_points()


def _mount_points() -> list[str]:
    """Every mount point of this mount namespace (``/proc/self/mountinfo``'s fifth field)."""
    with open("/proc/self/mountinfo", encoding="utf-8", errors="surrogateescape") as fh:
        return [line.split()[4] for line in fh if line.count(" ") >= 4]


def _after_fork_in_child() -> None:
    """A forked worker (prefork) starts with a fresh lock (another thread may have held the
    parent's) and no detaches of its own to wait for; the user namespaces stay usable."""
    global _lock, _owner
    _lock = threading.Lock()
    _pending.clear()
    _owner = None  # its own token: the parent's lock dies with the parent's last copy


os.register_at_fork(after_in_child=_after_fork_in_child)


@atexit.register
def _drain() -> None:
    """Detach what is still being detached before the engine exits (no mapping left behind)."""
    for thread in list(_pending):
        thread.join(timeout=5)


class IdMapped:
    """The id-mapped mounts of one call: ``source → mount point``; :meth:`close` detaches
    them. :raises IdmapError: from the constructor when one cannot be made (none is left)."""

    def __init__(self, sources: Iterable[str], uid: int, gid: int,
                 readonly: Mapping[str, Iterable[str]] | None = None) -> None:
        self.mounts: dict[str, str] = {}
        _private_dir()
        with _lock:
            owner = _owner_token()
        self._dir = os.path.join(IDMAP_DIR, f"{owner}.{secrets.token_hex(8)}")
        os.mkdir(self._dir, 0o700)
        try:
            userns = _userns_fd(uid, gid)
            for i, source in enumerate(sources):
                target = os.path.join(self._dir, str(i))
                os.mkdir(target, 0o700)
                _mount_idmapped(source, target, userns)
                self.mounts[source] = target
                for path in (readonly or {}).get(source, ()):  # below ``source``, no link
                    _mask_file(source, target, os.path.relpath(path, source))
        except BaseException:
            self.close()
            raise

    def close_later(self) -> None:
        """:meth:`close` in a thread: a detach waits for an RCU grace period (milliseconds,
        more under load) that the call's result need not wait for. Only root reaches the
        mapping meanwhile, and the process waits for it at exit."""
        self.mounts = {}
        thread = threading.Thread(target=self._close_and_forget, name="idmap-detach",
                                  daemon=True)
        with _lock:
            _pending.add(thread)
        thread.start()

    def _close_and_forget(self) -> None:
        try:
            self.close()
        finally:
            with _lock:
                _pending.discard(threading.current_thread())

    def close(self) -> None:
        # rmdir only: a mount point that failed to detach still shows the user's tree, which
        # must never be deleted through it
        for name in sorted(os.listdir(self._dir)) if os.path.isdir(self._dir) else ():
            target = os.path.join(self._dir, name)
            _libc.umount2(os.fsencode(target), _MNT_DETACH)
            with contextlib.suppress(OSError):
                os.rmdir(target)
        self.mounts = {}
        with contextlib.suppress(OSError):
            os.rmdir(self._dir)
