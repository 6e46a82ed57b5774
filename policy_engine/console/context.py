"""What the console reads from the running service: tokens, evidence, the policy, approvals."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from policy_engine.config import EngineConfig
from policy_engine.confirm.queue import ApprovalQueue, approval_queue
from policy_engine.console.auth import Sessions
from policy_engine.console.index import (
    EvidenceIndex,
    JsonlSource,
    PostgresSource,
    Source,
    SqliteSource,
)
from policy_engine.graph.policyset import PolicySet
from policy_engine.tokens import TokenStore


@dataclass
class ConsoleContext:
    """The console's view of one service: each getter reads the live object (hot reload)."""

    state_dir: Path
    tokens: Callable[[], TokenStore]
    policyset: Callable[[], PolicySet]
    policy_files: tuple[Path, ...]
    sources: tuple[Source, ...]
    secure_cookies: bool = False
    _index: EvidenceIndex | None = None
    _sessions: Sessions | None = None
    _queue: ApprovalQueue | None = None

    @property
    def index(self) -> EvidenceIndex:
        if self._index is None:
            self._index = EvidenceIndex(self.state_dir / "console" / "index.sqlite",
                                        self.sources)
            self._index.start_background()
        return self._index

    @property
    def sessions(self) -> Sessions:
        if self._sessions is None:
            self._sessions = Sessions(self.state_dir / "console" / "sessions.sqlite",
                                      self.tokens())
        return self._sessions

    @property
    def queue(self) -> ApprovalQueue:
        if self._queue is None:
            self._queue = approval_queue(self.state_dir)
        return self._queue


def evidence_sources(engine: EngineConfig) -> tuple[Source, ...]:
    """The evidence logs the engine writes, as the console reads them."""
    out: list[Source] = []
    if engine.wants_sink("jsonl"):
        options = engine.plugin_options("evidence_jsonl")
        out.append(JsonlSource(Path(str(options.get(
            "path", engine.state_dir / "evidence" / "evidence.jsonl")))))
    if engine.wants_sink("sqlite"):
        options = engine.plugin_options("evidence_sqlite")
        out.append(SqliteSource(Path(str(options.get(
            "path", engine.state_dir / "evidence" / "evidence.sqlite")))))
    if engine.wants_sink("postgres"):
        dsn = engine.plugin_options("evidence_postgres").get("dsn")
        if isinstance(dsn, str) and dsn:
            out.append(PostgresSource(dsn))
    return tuple(out)
