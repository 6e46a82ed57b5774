"""inotify over the directories a mask plan listed: an unchanged tree is known without a walk.

Every directory gets its watch *before* it is listed, so a change made after its listing always
queues an event. ``changed()`` drains the queue: any event (or a queue overflow, or a failed
watch) bumps the generation, and a plan whose walk ran at an older generation is walked again
(the ctime-keyed listings still spare unchanged directories their ``getdents``). inotify is
inode-based, so writes made through a sandbox's bind mounts are seen alike. Linux only, ctypes;
without inotify (or past ``max_user_watches``) every plan walks.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import threading

IN_MODIFY_NAMES = 0x100 | 0x200 | 0x40 | 0x80  # CREATE, DELETE, MOVED_FROM, MOVED_TO
IN_SELF = 0x400 | 0x800  # DELETE_SELF, MOVE_SELF
IN_ONLYDIR, IN_DONT_FOLLOW = 0x01000000, 0x02000000
IN_NONBLOCK, IN_CLOEXEC = 0o4000, 0o2000000
MASK = IN_MODIFY_NAMES | IN_SELF | IN_ONLYDIR | IN_DONT_FOLLOW


class Watcher:
    """One inotify instance; ``generation`` counts the batches of changes seen."""

    def __init__(self) -> None:
        self.generation = 0
        self.usable = False
        self._lock = threading.Lock()
        self._watched: set[str] = set()
        self._fd = -1
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            self._add = libc.inotify_add_watch
            self._add.argtypes = (ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32)
            fd = libc.inotify_init1(IN_NONBLOCK | IN_CLOEXEC)
        except (OSError, AttributeError):
            return
        if fd >= 0:
            self._fd, self.usable = fd, True

    def watch(self, path: str) -> None:
        """Watch ``path`` (a directory about to be listed); a failure disables the shortcut."""
        if not self.usable or path in self._watched:
            return
        if self._add(self._fd, os.fsencode(path), MASK) < 0:
            if ctypes.get_errno() in (errno.ENOSPC, errno.ENOMEM):
                self.usable = False  # past max_user_watches: every plan walks from now on
            self.generation += 1  # gone or unwatchable: never trust an old walk of it
            return
        with self._lock:
            self._watched.add(path)

    def changed(self) -> int:
        """Drain pending events; returns the generation after them."""
        if not self.usable:
            self.generation += 1
            return self.generation
        got = False
        with self._lock:
            while True:
                try:
                    data = os.read(self._fd, 65536)
                except BlockingIOError:
                    break
                except OSError:
                    self.usable = False
                    got = True
                    break
                if not data:
                    break
                got = True
            if got:
                self.generation += 1
                # a moved or deleted directory loses its watch or its path: re-watch on listing
                self._watched.clear()
        return self.generation

    def __del__(self) -> None:
        self.close()

    def close(self) -> None:
        if self._fd >= 0:
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd, self.usable = -1, False
