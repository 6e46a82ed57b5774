"""Spool-and-retry wrapper: a failing sink never blocks a call and never loses a record silently."""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

from pydantic import TypeAdapter

from policy_engine.evidence.sink import EvidenceSink
from policy_engine.model import EvidenceBegin, EvidenceEnd

log = logging.getLogger(__name__)

Record = EvidenceBegin | EvidenceEnd
_RECORD: TypeAdapter[Record] = TypeAdapter(Record)
# How long a spool seen empty is trusted without a look (a ``stat`` per record was ≈ 5 % of an
# op's CPU, issue 27): this process's own spooling marks its spool non-empty at once, so only a
# record another process spooled (and did not replay itself, having died) waits this long
RELOOK_S = 1.0
# spool path -> monotonic time until which it is known empty; shared by every sink of the
# process writing that spool (the engine's orchestrator and the pinned ones). A look that
# raced with a record being spooled (its generation moved) marks nothing.
_EMPTY_UNTIL: dict[Path, float] = {}
_GENERATION: dict[Path, int] = {}
_EMPTY_LOCK = threading.Lock()


class SpoolingSink:
    """Wraps a sink: a record the sink refuses is counted, logged and appended to
    ``<spool_dir>/<sink>.jsonl``; the spool is replayed (in order) before the next record and on
    close, so records reach the sink in the order they were produced.

    Never raises into the call: when the spool cannot take a record either (a read-only or full
    state directory), the record is logged as lost with both causes and counted, and the call
    goes on.

    :param on_failure: called with the sink name for every failed delivery (the metric).
    """

    def __init__(self, inner: EvidenceSink, spool_dir: Path,
                 on_failure: Callable[[str], None] | None = None) -> None:
        self.inner = inner
        self.name = inner.name
        self.spool_path = spool_dir / f"{inner.name}.jsonl"
        self.failures = 0
        self._on_failure = on_failure
        self.lost = 0  # records neither the sink nor the spool could take
        self._lock = threading.Lock()

    # -- the sink protocol --------------------------------------------------------------------

    def begin(self, ev: EvidenceBegin) -> None:
        self._deliver(ev)

    def end(self, ev: EvidenceEnd) -> None:
        self._deliver(ev)

    def pair(self, begin: EvidenceBegin, end: EvidenceEnd) -> None:
        """Both records of one call at once: one append where the sink has ``pair`` (the
        JSONL log), else ``begin`` then ``end``; refused, both are spooled, in order."""
        write = getattr(self.inner, "pair", None)
        if not callable(write):
            self._deliver(begin)
            self._deliver(end)
            return
        with self._lock:
            if self._replayed():
                try:
                    write(begin, end)
                    return
                except Exception as exc:  # noqa: BLE001 — counted, logged, spooled below
                    self._count_failure(exc, begin)
            for ev in (begin, end):
                self._keep(ev)

    def close(self) -> None:
        with self._lock:
            try:
                self._replay()
            except OSError as exc:
                log.error("evidence spool `%s` cannot be replayed (%s); its records stay there "
                          "for the next start", self.spool_path, _cause(exc))
        try:
            self.inner.close()
        except Exception as exc:  # a sink's close must not hide the others' close
            log.error("evidence sink `%s` failed to close: %s: %s", self.name,
                      type(exc).__name__, exc)

    # -- internals ------------------------------------------------------------------------------

    def pending(self) -> int:
        """Records waiting in the spool."""
        try:
            with self.spool_path.open("rb") as fh:
                return sum(1 for line in fh if line.strip())
        except FileNotFoundError:
            return 0

    def _deliver(self, ev: Record) -> None:
        with self._lock:
            # INVARIANT: a record is written directly only when the spool is empty, else order
            # would break; so replay first and spool the new record too if replay stops early.
            if self._replayed() and self._send(ev):
                return
            self._keep(ev)

    def _replayed(self) -> bool:
        """:meth:`_replay`, an unreadable spool logged and answered ``False`` (the record
        goes to the spool, behind what is there). Caller holds the lock."""
        try:
            return self._replay()
        except OSError as exc:
            log.error("evidence spool `%s` cannot be replayed (%s)", self.spool_path,
                      _cause(exc))
            return False

    def _keep(self, ev: Record) -> None:
        """Spool ``ev``; when even that fails, count and log it as lost."""
        try:
            self._spool(ev)
        except OSError as exc:
            self.lost += 1
            if self._on_failure is not None:
                self._on_failure(self.name)
            log.error("evidence record %s (%s) for sink `%s` is LOST: the sink refused it "
                      "and the spool `%s` cannot take it: %s", ev.envelope_id,
                      "begin" if isinstance(ev, EvidenceBegin) else "end", self.name,
                      self.spool_path, _cause(exc))

    def _send(self, ev: Record) -> bool:
        try:
            if isinstance(ev, EvidenceBegin):
                self.inner.begin(ev)
            else:
                self.inner.end(ev)
        except Exception as exc:  # noqa: BLE001 — counted, logged, spooled by the caller
            self._count_failure(exc, ev)
            return False
        return True

    def _count_failure(self, exc: Exception, ev: Record) -> None:
        self.failures += 1
        if self._on_failure is not None:
            self._on_failure(self.name)
        log.warning("evidence sink `%s` failed (%s: %s); record %s spooled for retry",
                    self.name, type(exc).__name__, exc, ev.envelope_id)
        # (when the spool cannot take it either, an error saying it is lost follows)

    def _spool(self, ev: Record) -> None:
        with _EMPTY_LOCK:  # before the write: never a window where it is thought empty
            _EMPTY_UNTIL.pop(self.spool_path, None)
            _GENERATION[self.spool_path] = _GENERATION.get(self.spool_path, 0) + 1
        line = ev.json_bytes() + b"\n"
        self.spool_path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.spool_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)  # other engine processes may share the state dir
            end = os.lseek(fd, 0, os.SEEK_END)
            try:
                if os.write(fd, line) < len(line):
                    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(self.spool_path))
            except OSError:
                os.ftruncate(fd, end)  # a torn spool line would be dropped as unreadable
                raise
            os.fsync(fd)
        finally:
            os.close(fd)

    def _replay(self) -> bool:
        """Deliver spooled records in order; keep the rest. ``True`` when the spool is empty."""
        if _EMPTY_UNTIL.get(self.spool_path, 0.0) > time.monotonic():
            return True
        generation = _GENERATION.get(self.spool_path, 0)
        if not self.spool_path.exists():
            self._seen_empty(generation)
            return True
        fd = os.open(self.spool_path, os.O_RDWR)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            with os.fdopen(os.dup(fd), "rb") as fh:
                lines = [ln for ln in fh.read().splitlines() if ln.strip()]
            sent = 0
            for raw in lines:
                try:
                    ev = _RECORD.validate_json(raw)
                except ValueError:
                    log.error("dropping unreadable spooled record in %s", self.spool_path)
                    sent += 1
                    continue
                if not self._send(ev):
                    break
                sent += 1
            if sent:
                rest = b"".join(ln + b"\n" for ln in lines[sent:])
                # overwrite in place, then shorten: needs no free space on a full disk
                view, at = memoryview(rest), 0
                while view:
                    n = os.pwrite(fd, view, at)
                    view, at = view[n:], at + n
                os.ftruncate(fd, len(rest))
                os.fsync(fd)
            if sent == len(lines):
                self._seen_empty(generation)
            return sent == len(lines)
        finally:
            os.close(fd)


    def _seen_empty(self, generation: int) -> None:
        with _EMPTY_LOCK:
            if _GENERATION.get(self.spool_path, 0) == generation:
                _EMPTY_UNTIL[self.spool_path] = time.monotonic() + RELOOK_S


def _cause(exc: OSError) -> str:
    """``strerror: path`` without the ``[Errno N]`` noise."""
    where = f" `{exc.filename}`" if exc.filename else ""
    return f"{exc.strerror or exc}{where}"
