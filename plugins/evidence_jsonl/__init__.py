"""JSONL evidence sink (``jsonl``, the default): one record per line, one ``write`` per record."""

from __future__ import annotations

import errno
import fcntl
import json
import logging
import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal, NamedTuple

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from plugins.evidence_jsonl.chaining import ChainTail
from plugins.evidence_jsonl.repair import TornRecord, remove_torn, trim_torn_tail
from plugins.evidence_jsonl.reserve import FULL, SpaceReserve
from policy_engine.config import EngineConfig
from policy_engine.evidence import EvidenceSink
from policy_engine.evidence.chain import signing_options
from policy_engine.hookspecs import hookimpl
from policy_engine.model import EvidenceBegin, EvidenceEnd

log = logging.getLogger(__name__)

FsyncPolicy = Literal["always", "interval", "never"]
FSYNC_POLICIES: tuple[FsyncPolicy, ...] = ("always", "interval", "never")


class JsonlSink:
    """Appends each record as one JSON line.

    Each record goes out in a single ``write`` to an ``O_APPEND`` descriptor, so when ``begin``
    or ``end`` returns the record is in the kernel's page cache: it survives the engine being
    killed (SIGKILL, OOM, a crash) because the kernel, not the process, holds it, and a crash can
    at worst leave the one record being written torn at the very end, never lose or damage a
    completed one. ``O_APPEND`` also keeps concurrent processes' lines whole, and each record
    is hash-chained to the one before it under the log's exclusive ``flock``
    (:mod:`policy_engine.evidence.chain`; signed checkpoints with ``signing_key``).

    A short write (a full disk) is taken back out of the file before ``begin``/``end`` raises
    (see :mod:`plugins.evidence_jsonl.repair`), so the record the spool later retries starts on
    a fresh line; if even that fails, nothing more is appended until it succeeds. An
    unterminated last line left by a crash is trimmed when the log is opened.

    ``fsync`` only adds protection against losing the machine (power loss, kernel panic), and
    costs ~1–3 ms per record on ordinary disks. The trade-off is configurable:

    - ``always``: fsync before every ``begin``/``end`` returns — nothing acknowledged is lost even
      on power loss; two fsyncs per call on the hot path.
    - ``interval`` (default): a background thread fsyncs at most every ``interval_s`` (0.2 s)
      when records were written, and ``close`` fsyncs — a power loss can drop at most the last
      ~0.2 s of records; a process crash loses nothing.
    - ``never``: the OS writes back when it likes (throwaway logs, benchmarks).

    :param fsync: one of ``always``, ``interval``, ``never``; ``True``/``False`` are accepted as
        ``always``/``never`` for older configurations.
    """

    name = "jsonl"

    def __init__(self, path: Path, *, fsync: FsyncPolicy | bool = "interval",
                 interval_s: float = 0.2, signing_key: Ed25519PrivateKey | None = None,
                 checkpoint_every: int = 1000) -> None:
        self.path = path
        self._tail = ChainTail(signing_key, checkpoint_every)
        self.fsync: FsyncPolicy = ("always" if fsync else "never") if isinstance(
            fsync, bool) else fsync
        if self.fsync not in FSYNC_POLICIES:
            raise ValueError(f"evidence_jsonl: `fsync` must be one of {', '.join(FSYNC_POLICIES)}")
        self.interval_s = interval_s
        self._lock = threading.Lock()
        self._dirty = threading.Event()
        self._stop = threading.Event()
        self.fsyncs = 0  # how many fsyncs ran (for tests and the operations guide)
        self._torn: TornRecord | None = None  # a short write not yet taken back out
        self._reserve = SpaceReserve(path)
        self._reserved = False  # whether the reserve is held (retaken at the next record)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            self._fd: int | None = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o600)
        except OSError as exc:
            raise OSError(f"cannot open evidence log `{path}`: {exc.strerror or exc}") from exc
        try:
            trim_torn_tail(self._fd, path)
        except OSError as exc:
            os.close(self._fd)
            raise OSError(f"cannot repair evidence log `{path}`: {exc.strerror or exc}") from exc
        self._reserved = self._reserve.hold()
        self._flusher: threading.Thread | None = None
        if self.fsync == "interval":
            self._flusher = threading.Thread(target=self._flush_loop, daemon=True,
                                             name=f"policy-engine-jsonl-fsync-{path.name}")
            self._flusher.start()

    @property
    def waits_for_disk(self) -> bool:
        """Whether an append waits for the disk (``fsync: always``); otherwise it returns once
        the bytes are in the page cache (the orchestrator's ``runs_on_caller`` asks)."""
        return self.fsync == "always"

    def begin(self, ev: EvidenceBegin) -> None:
        self._write(ev.json_bytes())

    def end(self, ev: EvidenceEnd) -> None:
        self._write(ev.json_bytes())

    def pair(self, begin: EvidenceBegin, end: EvidenceEnd) -> None:
        """Both records of a call that ran nothing outside this process before its end
        (``Orchestrator``, "one append"): chained one after the other in one ``write``, so
        the log holds both or, after a crash mid-write, neither (a torn tail is trimmed)."""
        self._write(begin.json_bytes(), end.json_bytes())

    def _write(self, *record: bytes) -> None:
        with self._lock:
            if self._fd is None:
                raise RuntimeError(f"evidence log `{self.path}` is closed")
            if self._torn is not None:  # never append behind a fragment still in the file
                remove_torn(self._fd, self._torn, self.path)
                self._torn = None
            if not self._reserved:
                self._reserved = self._reserve.hold()
            try:
                self._append(self._fd, record)
            except OSError as exc:
                if exc.errno not in FULL or not self._reserve.give_back():
                    raise
                # the record is out of the file again (or pending removal): retry once with
                # the reserve's space, so a begun call's end is not lost to a full disk
                self._reserved = False
                if self._torn is not None:
                    remove_torn(self._fd, self._torn, self.path)
                    self._torn = None
                self._append(self._fd, record)
            if self.fsync == "always":
                os.fsync(self._fd)
                self.fsyncs += 1
        if self.fsync == "interval" and not self._dirty.is_set():  # ``set`` locks, notifies
            self._dirty.set()

    def _append(self, fd: int, record: tuple[bytes, ...]) -> None:
        """Chain the records to the log's last record and append them (and a signed
        checkpoint when one is due) in one ``write``, all under an exclusive lock: another
        process cannot append between reading the last record and writing the next, so the
        chain never forks. No records appends only a checkpoint (at close), if the last
        record has none.

        A short write is not continued (the lock is released before the repair) but taken
        back out.
        """
        fcntl.flock(fd, fcntl.LOCK_EX)
        try:
            line = self._tail.render(fd, record)
            if not line:
                return
            written = os.write(fd, line)
            if written < len(line):
                # INVARIANT: on an O_APPEND descriptor the offset is now the end of our bytes
                end = os.lseek(fd, 0, os.SEEK_CUR)
                self._torn = TornRecord(end - written, line[:written], line)
                self._tail.forget()
            else:
                self._tail.wrote(fd)
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
        if self._torn is not None:
            try:
                remove_torn(fd, self._torn, self.path)
                self._torn = None
            except OSError as exc:  # kept pending: removed before anything else is appended
                log.error("evidence log `%s`: a torn record could not be removed yet: %s",
                          self.path, exc.strerror or exc)
            raise OSError(errno.ENOSPC, f"short write to evidence log `{self.path}` "
                          f"({written} of {len(line)} bytes; the disk is probably full)")

    def _flush_loop(self) -> None:
        while not self._stop.is_set():
            self._dirty.wait()
            if self._stop.is_set():
                return
            self._dirty.clear()
            try:
                self.flush()
            except OSError as exc:  # the records are written; only their durability is late
                log.error("evidence log `%s`: fsync failed: %s", self.path, exc.strerror or exc)
            self._stop.wait(self.interval_s)  # at most one fsync per interval

    def flush(self) -> None:
        """fsync now (whatever the policy); a no-op once closed."""
        with self._lock:
            if self._fd is None:
                return
            # a descriptor of its own: close() may close the log's meanwhile (its number is
            # then never another file's here), and records are appended while the disk syncs
            # (an fsync takes milliseconds; under the lock every call's append waited for it)
            fd = os.dup(self._fd)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        with self._lock:
            self.fsyncs += 1

    def close(self) -> None:
        self._stop.set()
        self._dirty.set()
        if self._flusher is not None and self._flusher is not threading.current_thread():
            self._flusher.join(5)
        with self._lock:
            if self._fd is not None:
                try:
                    if self._tail.signing and self._torn is None:
                        try:  # sign what this process leaves behind
                            self._append(self._fd, ())
                        except OSError as exc:
                            log.error("evidence log `%s`: closing checkpoint not written: %s",
                                      self.path, exc.strerror or exc)
                    if self.fsync != "never":
                        os.fsync(self._fd)
                        self.fsyncs += 1
                finally:
                    os.close(self._fd)
                    self._fd = None


    def read_records(self) -> Iterator[dict[str, Any]]:
        """The records stored so far, in order (the conformance kit reads them back); a line
        that does not parse is skipped here and reported by `policy-engine stats`.
        """
        try:  # each record is one os.write: nothing is buffered in this process
            lines = self.path.read_bytes().splitlines()
        except FileNotFoundError:
            return
        for line in lines:
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if isinstance(record, dict):
                yield record

    def stored_text(self) -> Iterator[str]:
        """Every stored line, raw: what the kit greps for planted secrets."""
        try:
            yield from self.path.read_text(encoding="utf-8", errors="replace").splitlines()
        except FileNotFoundError:
            return


class _Options(NamedTuple):
    path: Path
    fsync: FsyncPolicy
    interval_s: float
    signing_key: Ed25519PrivateKey | None
    checkpoint_every: int


def _validated(config: EngineConfig) -> _Options:
    """Validate ``options.evidence_jsonl`` (``path``, ``fsync``, ``fsync_interval_ms``,
    ``signing_key``, ``checkpoint_every``)."""
    options = config.plugin_options("evidence_jsonl")
    unknown = sorted(set(options) - {"path", "fsync", "fsync_interval_ms", "signing_key",
                                     "checkpoint_every"})
    if unknown:
        raise ValueError(f"evidence_jsonl: unknown option `{unknown[0]}`")
    raw = options.get("fsync", "interval")
    if isinstance(raw, bool):  # the earlier boolean form
        raw = "always" if raw else "never"
    if raw not in FSYNC_POLICIES:
        raise ValueError("evidence_jsonl: `fsync` must be `always`, `interval` or `never`")
    interval = options.get("fsync_interval_ms", 200)
    if not isinstance(interval, int) or isinstance(interval, bool) or not 1 <= interval <= 60_000:
        raise ValueError("evidence_jsonl: `fsync_interval_ms` must be an integer from 1 to 60000")
    path = Path(str(options.get("path", config.state_dir / "evidence" / "evidence.jsonl")))
    key, every = signing_options(config, "evidence_jsonl", path.parent)
    return _Options(path, raw, interval / 1000, key, every)


@hookimpl
def policy_engine_evidence_sinks(config: EngineConfig) -> list[EvidenceSink]:
    if not config.wants_sink(JsonlSink.name):
        return []  # construct (and open files) only for sinks the config asks for
    o = _validated(config)
    return [JsonlSink(o.path, fsync=o.fsync, interval_s=o.interval_s,
                      signing_key=o.signing_key, checkpoint_every=o.checkpoint_every)]
