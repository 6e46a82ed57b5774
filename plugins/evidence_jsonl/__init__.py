"""JSONL evidence sink (``jsonl``, the default): one record per line, fsynced before returning."""

from __future__ import annotations

import os
import threading
from pathlib import Path

from policy_engine.config import EngineConfig
from policy_engine.evidence import EvidenceSink
from policy_engine.hookspecs import hookimpl
from policy_engine.model import EvidenceBegin, EvidenceEnd


class JsonlSink:
    """Appends each record as one JSON line.

    Durability: the file is opened ``O_APPEND`` and each record goes out in a single ``write``
    followed by ``fsync``, so when ``begin``/``end`` returns the record is on disk; a crash can
    at worst leave the one record being written torn at the very end of the file, never lose or
    damage a completed one. ``O_APPEND`` also keeps concurrent processes' lines whole.

    :param fsync: turn off only for throwaway logs (benchmarks); the default is durable.
    """

    name = "jsonl"

    def __init__(self, path: Path, *, fsync: bool = True) -> None:
        self.path = path
        self._fsync = fsync
        self._lock = threading.Lock()
        path.parent.mkdir(parents=True, exist_ok=True)
        self._fd: int | None = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)

    def begin(self, ev: EvidenceBegin) -> None:
        self._write(ev.model_dump_json().encode() + b"\n")

    def end(self, ev: EvidenceEnd) -> None:
        self._write(ev.model_dump_json().encode() + b"\n")

    def _write(self, line: bytes) -> None:
        with self._lock:
            if self._fd is None:
                raise RuntimeError(f"evidence log `{self.path}` is closed")
            view = memoryview(line)
            while view:  # a regular-file write is whole in practice; loop for the rare short one
                written = os.write(self._fd, view)
                view = view[written:]
            if self._fsync:
                os.fsync(self._fd)

    def close(self) -> None:
        with self._lock:
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None


def _validated(config: EngineConfig) -> tuple[Path, bool]:
    """Validate ``options.evidence_jsonl`` (``path``, ``fsync``) before constructing the sink."""
    options = config.plugin_options("evidence_jsonl")
    unknown = sorted(set(options) - {"path", "fsync"})
    if unknown:
        raise ValueError(f"evidence_jsonl: unknown option `{unknown[0]}`")
    fsync = options.get("fsync", True)
    if not isinstance(fsync, bool):
        raise ValueError("evidence_jsonl: `fsync` must be a boolean")
    path = Path(str(options.get("path", config.state_dir / "evidence" / "evidence.jsonl")))
    return path, fsync


@hookimpl
def policy_engine_evidence_sinks(config: EngineConfig) -> list[EvidenceSink]:
    if not config.wants_sink(JsonlSink.name):
        return []  # construct (and open files) only for sinks the config asks for
    path, fsync = _validated(config)
    return [JsonlSink(path, fsync=fsync)]
