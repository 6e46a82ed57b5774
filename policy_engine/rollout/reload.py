"""Hot reload: a long-running orchestrator picks up a changed policy bundle, atomically.

``PolicyReloader.check()`` hashes the bundle's files (the entry files and every import the last
good compilation followed); once one changed, the imports of the bundle now on disk are followed
again, so every file of the candidate bundle is watched and checked (issue 32 follow-up, attack32
M4: a new import still being written went live). When the content changed and has stayed the
same for one more check (an editor or a `git checkout` writing several files is not caught
half-way), the new bundle is compiled and checked; its files are hashed again after the compile
(one changed meanwhile: dropped, settle again); only a bundle that compiles is swapped in
(``Orchestrator.swap_policy``: one assignment). New calls see it at once; calls already
running finish under the policy they started with, and every call's evidence records the
version it ran under (``policy_version_hash``). A bundle that does not compile keeps the old
policy running: the error is logged, counted (``sandbox_policy_reload{result="failed"}``) and
shown by ``health()``, and that content is not tried again until it changes.

Only a complete file is loaded (issue 32 item 8): a quiet period cannot tell a finished file
from a writer that paused (a prefix that compiles with its ``forbid`` cut off went live when
the writer paused for two polls), so before compiling, the kernel is asked whether any process
still has a bundle file open for writing — a read lease (``F_SETLEASE``) is refused exactly
then — and a file still open for writing waits, however long its writer pauses. Where the
kernel cannot tell (not Linux, a file system without leases, a file the service neither owns
nor has ``CAP_LEASE`` for), only an atomic replace is taken: a file whose content changed under
the same inode (written in place) is ignored, with an error in ``health()``, until it is
replaced by a rename.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import logging
import os
import signal
import stat
import sys
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from prometheus_client import Counter

from policy_engine.compiler import compile_files
from policy_engine.compiler.imports import bundle_files
from policy_engine.dsl.parser import MAX_POLICY_BYTES
from policy_engine.errors import DIAGNOSTICS, DiagnosticsError
from policy_engine.graph.policyset import PolicySet
from policy_engine.inputs.inputfile import named_like, read_limited
from policy_engine.orchestrator import Orchestrator

log = logging.getLogger(__name__)


def open_for_writing(path: Path) -> bool | None:
    """Whether some process has ``path`` open for writing; ``None`` when the kernel cannot
    say here. A read lease is granted only when nobody has the file open for writing (and it
    is dropped again at once; a writer opening it meanwhile waits microseconds)."""
    setlease = getattr(fcntl, "F_SETLEASE", None)  # Linux only
    if setlease is None:
        return None
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None  # gone or unreadable: the content fingerprint says so already
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        try:
            fcntl.fcntl(fd, setlease, fcntl.F_RDLCK)
        except OSError as exc:
            return True if exc.errno == errno.EAGAIN else None
        fcntl.fcntl(fd, setlease, fcntl.F_UNLCK)
        return False
    finally:
        os.close(fd)


def _leases_safe() -> bool:
    """A writer opening a file while we hold its lease makes the kernel send SIGIO, whose
    default action ends the process: leases are used only once SIGIO is ignored or handled
    (set here when this is the main thread and nobody handles it)."""
    if sys.platform != "linux":
        return False
    if signal.getsignal(signal.SIGIO) != signal.SIG_DFL:
        return True
    if threading.current_thread() is not threading.main_thread():
        return False
    signal.signal(signal.SIGIO, signal.SIG_IGN)
    return True


FileState = tuple[tuple[int, int] | None, str]
"""A bundle file's (device, inode) and the SHA-256 of its content."""


def _identity(path: Path) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino


class PolicyReloader:
    """Watches the policy bundle of ``orchestrator`` (entry files ``entries``) by polling.

    :param on_swap: called with each new policy right after the orchestrator took it, for
        whatever else decides with the policy (the service's `/v1/decide`, its consent broker
        and per-backend orchestrators).
    """

    def __init__(self, orchestrator: Orchestrator, entries: Sequence[Path], *,
                 on_swap: Sequence[Callable[[PolicySet], None]] = (),
                 writer_probe: bool = True) -> None:
        self.orchestrator = orchestrator
        self.entries = tuple(Path(e) for e in entries)
        self.on_swap = tuple(on_swap)
        # False: never ask the kernel about writers, take atomic replaces only (the fallback)
        self.writer_probe = writer_probe and _leases_safe()
        self._files = self._bundle_files()
        self._loaded_files = self._per_file()
        self._loaded = self._fingerprint(self._loaded_files)
        # the content the watched file set was last resolved from (the imports it names)
        self._resolved_at: str | None = self._loaded
        self._seen: str | None = None  # content seen once, waiting for a second sighting
        self._failed: str | None = None  # content that did not compile (not retried)
        self.last_error: str | None = None
        self.last_error_detail: str | None = None
        self.reloads = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.counter = Counter("sandbox_policy_reload", "policy reload attempts", ["result"],
                               registry=orchestrator.metrics.registry)

    def _bundle_files(self) -> tuple[Path, ...]:
        files = {Path(f) for f in self.orchestrator.policyset.files} | set(self.entries)
        return tuple(sorted(files))

    def _candidate(self) -> str:
        """The fingerprint of the bundle now on disk. When any watched file changed since the
        set was last resolved, the entries' imports are followed again first, so a file the
        new content imports is watched (and writer-checked) before anything is compiled."""
        current = self._fingerprint()
        if current == self._resolved_at:
            return current
        try:
            found = bundle_files(list(self.entries), os.path.expanduser("~"))
        except Exception:  # the compile that follows reports it, with its place
            log.exception("following the policy's imports failed")
            found = [str(p) for p in self._files]
        files = tuple(sorted({Path(f) for f in found} | set(self.entries)))
        if files == self._files:
            self._resolved_at = current
            return current
        # resolved from content that may have moved on since: resolved again at the next poll
        self._files, self._resolved_at = files, None
        return self._fingerprint()

    def _fingerprint(self, files: dict[Path, FileState] | None = None) -> str:
        h = hashlib.sha256()
        for path, (ident, digest) in sorted((files or self._per_file()).items()):
            h.update(str(path).encode() + b"\0" + digest.encode())
            if not self.writer_probe:  # a rename of refused in-place content is a change
                h.update(repr(ident).encode())
            h.update(b"\0")
        return h.hexdigest()

    @staticmethod
    def _content(path: Path) -> bytes:
        try:
            # bounded, regular files only: a FIFO swapped in must not hang the watcher
            return read_limited(path, MAX_POLICY_BYTES)
        except OSError as exc:  # a file being replaced: its absence is content too
            return f"<{exc.errno}>".encode()

    def _per_file(self) -> dict[Path, FileState]:
        return {p: (_identity(p), hashlib.sha256(self._content(p)).hexdigest())
                for p in self._files}

    def _incomplete(self) -> str | None:
        """Why the bundle on disk may not be whole yet (``None``: it is): a file some process
        still has open for writing, or — where the kernel cannot tell — one written in place."""
        for path in self._files:
            busy = open_for_writing(path) if self.writer_probe else None
            if busy:
                return f"{path} is still open for writing"
            if busy is None:
                was_id, was_digest = self._loaded_files.get(path, (None, ""))
                now_digest = hashlib.sha256(self._content(path)).hexdigest()
                if was_id is not None and _identity(path) == was_id \
                        and now_digest != was_digest:
                    return (f"{path} was changed in place and whether its writer is done "
                            "cannot be told here: replace it atomically (write a temporary "
                            "file beside it, then rename it over the policy)")
        return None

    def check(self) -> bool:
        """One poll; ``True`` when a new policy was swapped in."""
        with self._lock:
            current = self._candidate()
            if current == self._loaded:  # unchanged, or a broken edit taken back
                self._seen, self._failed, self.last_error = None, None, None
                return False
            if current == self._failed:
                self._seen = None
                return False
            if current != self._seen:  # changed since the last poll: let it settle
                self._seen = current
                return False
            waiting = self._incomplete()
            if waiting is not None:  # seen again at the next poll, and checked again
                if "in place" in waiting:
                    return self._fail(current, waiting, waiting)
                log.info("policy change not loaded yet: %s", waiting)
                return False
            self._seen = None
            odd = [e for e in self.entries if not named_like(e, ".sbpolicy")]
            if odd:  # a policy path replaced by a link to another file (a key, a token)
                why = (f"{odd[0]}: SBP217 not a policy file: it (or the file a link in it "
                       "leads to) is not named `*.sbpolicy`; it was not read")
                return self._fail(current, why, why)
            try:
                policyset = compile_files(list(self.entries))
            except DiagnosticsError as exc:
                first = exc.diagnostics[0] if exc.diagnostics else None
                span = first.span if first else None
                where = f"{span.file}:{span.line}:{span.column}: " if span else ""
                what = f"{first.id} {first.message}" if first else str(exc)
                # unauthenticated readers (a health endpoint) get the place and the ID only: a
                # message quotes the source ("unexpected `ghp_…`")
                title = f"{first.id} {DIAGNOSTICS[first.id].title}" if first and \
                    first.id in DIAGNOSTICS else "the policy does not compile"
                return self._fail(current, where + what, where + title)
            except Exception as exc:  # an unreadable file, a compiler bug: keep the old one
                return self._fail(current, f"{type(exc).__name__}: {exc}",
                                  f"{type(exc).__name__} while compiling the policy (see the log)")
            after = self._per_file()
            unread = {Path(f) for f in policyset.files} - set(self._files)
            if unread or self._fingerprint(after) != current:
                # a file changed while it was compiled (or the compile read one not checked):
                # what was compiled may be a mix; settle and check again
                log.info("policy changed while it was compiled; not loaded yet")
                self._resolved_at = None
                return False
            self.orchestrator.swap_policy(policyset)
            for listener in self.on_swap:
                listener(policyset)
            self._loaded, self._loaded_files = current, after
            self._resolved_at = current
            self._failed = None
            self.last_error = None
            self.reloads += 1
            self.counter.labels(result="ok").inc()
            log.info("policy reloaded: %s %s (%s)", policyset.name, policyset.version,
                     policyset.version_hash[:12])
            return True

    def _fail(self, content: str, why: str, public: str) -> bool:
        self._failed = content
        self.last_error = public  # what health shows: place, diagnostic ID and its title
        self.last_error_detail = why  # the log's full message
        self.counter.labels(result="failed").inc()
        log.error("policy reload failed, the running policy stays in force: %s", why)
        return False

    def health(self) -> dict[str, Any]:
        """What a health endpoint shows: the policy in force and the last reload error."""
        ps = self.orchestrator.policyset
        return {"policy": ps.name, "version": ps.version, "version_hash": ps.version_hash,
                "reloads": self.reloads, "reload_error": self.last_error,
                "status": "degraded" if self.last_error else "ok"}

    def start(self, interval_s: float = 1.0) -> None:
        """Poll in a daemon thread every ``interval_s`` until ``stop()``."""
        def loop() -> None:
            while not self._stop.wait(interval_s):
                try:
                    self.check()
                except Exception:  # never let the watcher die silently
                    log.exception("policy reload check failed")

        self._thread = threading.Thread(target=loop, daemon=True, name="policy-engine-reload")
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)
