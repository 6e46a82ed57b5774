"""Hot reload: a long-running orchestrator picks up a changed policy bundle, atomically.

``PolicyReloader.check()`` hashes the bundle's files (the entry files and every import the last
good compilation followed). When the content changed and has stayed the same for one more
check (an editor or a `git checkout` writing several files is not caught half-way), the new
bundle is compiled and checked; only a bundle that compiles is swapped in
(``Orchestrator.swap_policy``: one assignment). New calls see it at once; calls already
running finish under the policy they started with, and every call's evidence records the
version it ran under (``policy_version_hash``). A bundle that does not compile keeps the old
policy running: the error is logged, counted (``sandbox_policy_reload{result="failed"}``) and
shown by ``health()``, and that content is not tried again until it changes.
"""

from __future__ import annotations

import hashlib
import logging
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from prometheus_client import Counter

from policy_engine.compiler import compile_files
from policy_engine.dsl.parser import MAX_POLICY_BYTES
from policy_engine.errors import DIAGNOSTICS, DiagnosticsError
from policy_engine.graph.policyset import PolicySet
from policy_engine.inputs.inputfile import named_like, read_limited
from policy_engine.orchestrator import Orchestrator

log = logging.getLogger(__name__)


class PolicyReloader:
    """Watches the policy bundle of ``orchestrator`` (entry files ``entries``) by polling.

    :param on_swap: called with each new policy right after the orchestrator took it, for
        whatever else decides with the policy (the service's `/v1/decide`, its consent broker
        and per-backend orchestrators).
    """

    def __init__(self, orchestrator: Orchestrator, entries: Sequence[Path], *,
                 on_swap: Sequence[Callable[[PolicySet], None]] = ()) -> None:
        self.orchestrator = orchestrator
        self.entries = tuple(Path(e) for e in entries)
        self.on_swap = tuple(on_swap)
        self._files = self._bundle_files()
        self._loaded = self._fingerprint()
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

    def _fingerprint(self) -> str:
        h = hashlib.sha256()
        for path in self._files:
            h.update(str(path).encode() + b"\0")
            try:
                # bounded, regular files only: a FIFO swapped in must not hang the watcher
                h.update(read_limited(path, MAX_POLICY_BYTES))
            except OSError as exc:  # a file being replaced: its absence is content too
                h.update(f"<{exc.errno}>".encode())
            h.update(b"\0")
        return h.hexdigest()

    def check(self) -> bool:
        """One poll; ``True`` when a new policy was swapped in."""
        with self._lock:
            current = self._fingerprint()
            if current == self._loaded:  # unchanged, or a broken edit taken back
                self._seen, self._failed, self.last_error = None, None, None
                return False
            if current == self._failed:
                self._seen = None
                return False
            if current != self._seen:  # changed since the last poll: let it settle
                self._seen = current
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
            self.orchestrator.swap_policy(policyset)
            for listener in self.on_swap:
                listener(policyset)
            self._files = self._bundle_files()  # imports may have changed
            self._loaded = self._fingerprint()
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
