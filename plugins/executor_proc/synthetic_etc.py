"""The synthetic /etc/passwd and /etc/group bwrap binds over the host's: one shared, verified
copy per machine and user in the temporary directory, not a new directory per process."""

from __future__ import annotations

import atexit
import hashlib
import json
import os
import shutil
import stat
import tempfile
import threading

SYNTHETIC_ETC = {
    "/etc/passwd": "root:x:0:0:root:/root:/usr/sbin/nologin\n"
                   "nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n",
    "/etc/group": "root:x:0:\nnogroup:x:65534:\n",
}
"""What a sandbox sees instead of the host's account lists (seed 003: /etc/passwd is secret)."""

_lock = threading.Lock()
_hosts: dict[str, str] = {}


def shared_name() -> str:
    """``pe-etc-<uid>-<digest of the contents>``: a new engine version with other contents
    gets another directory; the same contents are shared by every process of the user."""
    digest = hashlib.sha256(json.dumps(SYNTHETIC_ETC, sort_keys=True).encode()).hexdigest()
    return f"pe-etc-{os.geteuid()}-{digest[:16]}"


def synthetic_etc() -> dict[str, str]:
    """Host copies of ``SYNTHETIC_ETC`` (sandbox path → host file, read-only, ours)."""
    with _lock:
        if not _hosts:
            _hosts.update(_place())
        return dict(_hosts)


def _place() -> dict[str, str]:
    shared = os.path.join(tempfile.gettempdir(), shared_name())
    if not _trusted(shared):
        fresh = _write()
        try:
            # atomic: a racing process of ours either wins (we drop ours) or loses to us; a
            # directory someone else holds under the name is theirs (sticky /tmp) and stays
            os.rename(fresh, shared)
        except OSError:
            shutil.rmtree(fresh, ignore_errors=True)
        if not _trusted(shared):
            # planted by someone else, or unwritable: a private copy, removed at exit
            fresh = _write()
            atexit.register(shutil.rmtree, fresh, True)
            return _files(fresh)
    return _files(shared)


def _files(where: str) -> dict[str, str]:
    return {path: os.path.join(where, os.path.basename(path)) for path in SYNTHETIC_ETC}


def _write() -> str:
    where = tempfile.mkdtemp(prefix="pe-etc-new-")
    os.chmod(where, 0o755)
    for path, host in _files(where).items():
        with open(host, "w", encoding="ascii") as fh:
            fh.write(SYNTHETIC_ETC[path])
        os.chmod(host, 0o444)
    return where


def _trusted(where: str) -> bool:
    """A real directory of ours that nobody else can write, holding exactly our contents."""
    try:
        st = os.lstat(where)
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o022:
            return False
        for path, host in _files(where).items():
            fd = os.open(host, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
            try:
                fst = os.fstat(fd)
                if (not stat.S_ISREG(fst.st_mode) or fst.st_uid != os.geteuid()
                        or fst.st_mode & 0o222):
                    return False
                if os.read(fd, 65536) != SYNTHETIC_ETC[path].encode("ascii"):
                    return False
            finally:
                os.close(fd)
    except OSError:
        return False
    return True
