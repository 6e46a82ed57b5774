"""The ``console`` confirmation service: a consent request waits in a queue for a person.

A call needing consent inserts its question into ``approvals.sqlite`` (beside the evidence, so
every worker of ``serve --workers`` and every console page sees the same queue) and waits up to
``timeout_s`` for an approver's answer. The answer is written by one conditional ``UPDATE``
that only a still-pending, not-yet-expired question accepts, so an answer that arrives after
the call stopped waiting is refused and the question stays ``timed_out``; a yes after the
deadline never becomes a consent.
"""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from policy_engine.confirm.services import MAX_VALID_MS, ConsentAnswer, ConsentRequest

_SCHEMA = """
CREATE TABLE IF NOT EXISTS approvals (
  request_id   TEXT PRIMARY KEY,
  tenant       TEXT NOT NULL,
  subject_id   TEXT NOT NULL,
  tool_name    TEXT NOT NULL,
  capability   TEXT NOT NULL,
  reason       TEXT NOT NULL,
  request      TEXT NOT NULL,
  asked_at     INTEGER NOT NULL,
  deadline     INTEGER NOT NULL,
  status       TEXT NOT NULL CHECK (status IN ('pending', 'approved', 'refused', 'timed_out')),
  approver     TEXT,
  answer_note  TEXT,
  answered_at  INTEGER,
  valid_for_ms INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS approvals_status ON approvals (status, asked_at);
CREATE INDEX IF NOT EXISTS approvals_tenant ON approvals (tenant, asked_at);
"""
MAX_NOTE = 500
"""Characters of an approver's reason kept (the rest is cut)."""


@dataclass(frozen=True, slots=True)
class Approval:
    """One question of the queue, as the console shows it."""

    request_id: str
    tenant: str
    subject_id: str
    tool_name: str
    capability: str
    reason: str
    request: dict[str, Any]
    asked_at: int
    deadline: int
    status: str
    approver: str | None
    answer_note: str | None
    answered_at: int | None
    valid_for_ms: int


class LateAnswer(Exception):
    """The question is no longer pending (answered, or its call stopped waiting)."""


class SelfApproval(Exception):
    """The person answering is the subject whose call asks: consent needs someone else."""


ANSWER_MARGIN_MS = 1000
"""An answer is taken until this long before the call stops waiting, so one the queue took is
never late for the call (the broker refuses a yes after the timeout; docs/console.md)."""


class ApprovalQueue:
    """The queue in ``path``; one connection per call (SQLite serializes the writers)."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._wake = threading.Condition()  # same-process waiters wake at once on an answer
        with self._db() as db:
            db.executescript(_SCHEMA)

    @contextmanager
    def _db(self) -> Iterator[sqlite3.Connection]:
        db = sqlite3.connect(self.path, timeout=10, isolation_level=None)
        try:
            db.execute("PRAGMA journal_mode = WAL")
            yield db
        finally:
            db.close()

    def ask(self, request: ConsentRequest, timeout_s: float) -> str:
        """Queue ``request``; returns its id (the consent request's own)."""
        now = _now()
        with self._db() as db:
            db.execute(
                "INSERT INTO approvals (request_id, tenant, subject_id, tool_name, capability, "
                "reason, request, asked_at, deadline, status) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, 'pending')",
                (request.request_id, request.tenant, request.subject_id, request.tool_name,
                 request.capability, request.reason,
                 json.dumps(request.to_json(), sort_keys=True, ensure_ascii=False,
                            default=str),
                 now, now + _taking_ms(timeout_s)))
        return request.request_id

    def answer(self, request_id: str, *, approved: bool, approver: str, note: str,
               valid_for_ms: int, tenant: str | None,
               approver_subject: str | None = None) -> Approval:
        """Record a person's answer; :class:`LateAnswer` unless the question still waits,
        :class:`SelfApproval` when ``approver_subject`` (in ``tenant``) is the asking subject.

        :param tenant: the approver's tenant (``None``: an admin, any tenant); a question of
            another tenant is as absent as an unknown one.
        """
        now = _now()
        valid = max(0, min(int(valid_for_ms), MAX_VALID_MS)) if approved else 0
        asked = self.get(request_id, tenant)
        if asked is not None and approver_subject is not None and \
                asked.subject_id == approver_subject:
            raise SelfApproval(request_id)
        with self._db() as db:
            cur = db.execute(
                "UPDATE approvals SET status = ?, approver = ?, answer_note = ?, "
                "answered_at = ?, valid_for_ms = ? WHERE request_id = ? AND status = 'pending' "
                "AND deadline > ? AND (? IS NULL OR tenant = ?)",
                ("approved" if approved else "refused", approver, note[:MAX_NOTE], now, valid,
                 request_id, now, tenant, tenant))
            if cur.rowcount != 1:
                # mark an expired question timed out now, so the page shows why
                db.execute("UPDATE approvals SET status = 'timed_out' WHERE request_id = ? "
                           "AND status = 'pending' AND deadline <= ?", (request_id, now))
                raise LateAnswer(request_id)
        with self._wake:
            self._wake.notify_all()
        found = self.get(request_id, tenant)
        assert found is not None  # INVARIANT: the row was just updated
        return found

    def wait(self, request_id: str, deadline_ms: int) -> Approval:
        """Block until the question is answered or its deadline passes (then ``timed_out``)."""
        while True:
            row = self.get(request_id, None)
            if row is not None and row.status != "pending":
                return row
            left = deadline_ms - _now()
            if left <= 0:
                with self._db() as db:
                    db.execute("UPDATE approvals SET status = 'timed_out' WHERE "
                               "request_id = ? AND status = 'pending'", (request_id,))
                row = self.get(request_id, None)
                assert row is not None  # INVARIANT: asked, never deleted
                return row
            # an answer from this process wakes the waiter; one from another worker is seen
            # at the next poll (≤ 0.25 s)
            with self._wake:
                self._wake.wait(min(0.25, left / 1000))

    def get(self, request_id: str, tenant: str | None) -> Approval | None:
        with self._db() as db:
            row = db.execute(f"SELECT {_LIVE_COLUMNS} FROM approvals WHERE request_id = ? AND "
                             "(? IS NULL OR tenant = ?)",
                             (_now(), request_id, tenant, tenant)).fetchone()
        return None if row is None else _approval(row)

    def list(self, *, tenant: str | None, status: str | None = None,
             limit: int = 100) -> list[Approval]:
        """The newest questions first (of ``tenant`` unless ``None``); a pending question
        past its deadline reads as ``timed_out`` (readers never write: the live pages poll)."""
        with self._db() as db:
            rows = db.execute(
                f"SELECT {_LIVE_COLUMNS} FROM approvals WHERE (? IS NULL OR tenant = ?) "
                f"AND (? IS NULL OR {_LIVE_STATUS} = ?) ORDER BY asked_at DESC, request_id "
                "LIMIT ?", (_now(), tenant, tenant, status, _now(), status, limit)).fetchall()
        return [_approval(r) for r in rows]

    def pending_count(self, tenant: str | None) -> int:
        with self._db() as db:
            row = db.execute("SELECT count(*) FROM approvals WHERE status = 'pending' AND "
                             "deadline > ? AND (? IS NULL OR tenant = ?)",
                             (_now(), tenant, tenant)).fetchone()
        return int(row[0])


_LIVE_STATUS = "(CASE WHEN status = 'pending' AND deadline <= ? THEN 'timed_out' ELSE status END)"
_LIVE_COLUMNS = ("request_id, tenant, subject_id, tool_name, capability, reason, request, "
                 f"asked_at, deadline, {_LIVE_STATUS}, approver, answer_note, answered_at, "
                 "valid_for_ms")
"""The columns of :class:`Approval`; the first parameter of a query using it is now (ms)."""


def _approval(row: tuple[Any, ...]) -> Approval:
    values = list(row)
    values[6] = json.loads(values[6])
    return Approval(*values)


class ConsoleConfirmation:
    """Asks a person through the console's approval page; no answer in time is a no."""

    mode = "console"

    def __init__(self, queue: ApprovalQueue, timeout_s: float = 120.0) -> None:
        self.queue = queue
        self.timeout_s = timeout_s

    def confirm(self, request: ConsentRequest) -> ConsentAnswer:
        asked_at = _now()
        try:
            self.queue.ask(request, self.timeout_s)
            row = self.queue.wait(request.request_id, asked_at + _taking_ms(self.timeout_s))
        except sqlite3.Error as exc:  # a broken queue is a no, never a crash or a yes
            return ConsentAnswer(False, "console", _now(), 0, self.mode,
                                 f"the approval queue failed ({type(exc).__name__})")
        if row.status == "approved":
            return ConsentAnswer(True, row.approver or "?", row.answered_at or _now(),
                                 row.valid_for_ms, self.mode, row.answer_note or "")
        if row.status == "refused":
            # "refused by …": the gateway reports a person's no as `refused` (broker.answer_kind)
            return ConsentAnswer(False, row.approver or "?", row.answered_at or _now(),
                                 0, self.mode, f"refused by {row.approver} in the console: "
                                 f"{row.answer_note or ''}")
        return ConsentAnswer(False, "console", _now(), 0, self.mode,
                             f"timed_out: nobody answered within {self.timeout_s:g} s",
                             timed_out=True)


def _taking_ms(timeout_s: float) -> int:
    """How long the queue takes answers: the timeout less the margin (at least half of it)."""
    total = int(timeout_s * 1000)
    return max(total // 2, total - ANSWER_MARGIN_MS)


def approval_queue(state_dir: Path) -> ApprovalQueue:
    """The queue of ``--confirm console`` under ``state_dir``: every process using that state
    directory (the workers of ``serve``, an MCP server, ``run``) asks the same people, who
    answer in ``serve --console``."""
    return ApprovalQueue(state_dir / "console" / "approvals.sqlite")


def _now() -> int:
    return int(time.time() * 1000)
