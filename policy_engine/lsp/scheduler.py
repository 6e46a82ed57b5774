"""When the language server analyses a buffer: debounced, incremental while typing, in full
when the typing stops.

Each change waits ``debounce`` seconds for the next one (a burst of keystrokes is analysed
once). Then a buffer whose full analysis is cheap (under ``full_budget`` seconds last time)
gets it at once, as before; a large one gets the incremental view (incremental.py: changed
statements re-parsed, the rest carried over) published at once, and the full analysis — check
and lint of the whole policy, imports included — runs on a worker thread once the buffer has
been idle for ``idle`` seconds. A full analysis that finishes after the buffer changed again is
kept as the base of the next incremental view and not published; another is scheduled.
"""

from __future__ import annotations

import asyncio
import logging
import multiprocessing
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Executor, ProcessPoolExecutor, ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial

from policy_engine.documents import is_document
from policy_engine.errors import Diagnostic
from policy_engine.lsp import incremental

log = logging.getLogger(__name__)

Analyse = Callable[[str, str], list[Diagnostic]]
# (uri, text, version, diagnostics): renders and sends one publishDiagnostics
Publish = Callable[[str, str, int | None, Sequence[Diagnostic]], None]
# uri → (text, version, path) of the open buffer, or None once it is closed
Read = Callable[[str], "tuple[str, int | None, str] | None"]

SMALL_ROWS = 300  # before a first full analysis says how long one takes


@dataclass(slots=True)
class _Doc:
    timer: asyncio.TimerHandle | None = None
    idle_timer: asyncio.TimerHandle | None = None
    snapshot: incremental.Snapshot | None = None
    full_s: float | None = None  # how long the last full analysis took
    running: bool = False
    again: bool = False
    lock: threading.Lock = field(default_factory=threading.Lock)


class Scheduler:
    """Decides when to analyse which buffer; the server gives it how to read and publish."""

    def __init__(self, analyse: Analyse, *, debounce: float = 0.025, idle: float = 0.35,
                 full_budget: float = 0.1) -> None:
        self.analyse = analyse
        self.debounce, self.idle, self.full_budget = debounce, idle, full_budget
        self._docs: dict[str, _Doc] = {}
        # the full analysis runs in a process of its own: a thread would hold the GIL for most
        # of a second per run and slow the incremental view it is meant to stay out of
        self._pool: Executor | None = None

    def _doc(self, uri: str) -> _Doc:
        return self._docs.setdefault(uri, _Doc())

    def changed(self, uri: str, read: Read, publish: Publish, *, wait: bool = True) -> None:
        """The buffer ``uri`` changed (or opened, or was saved: ``wait=False``)."""
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # no event loop (a synchronous transport): analyse now, in full
            self._full_now(uri, read, publish)
            return
        doc = self._doc(uri)
        if doc.timer is not None:
            doc.timer.cancel()
        if doc.idle_timer is not None:
            doc.idle_timer.cancel()
            doc.idle_timer = None
        doc.timer = loop.call_later(self.debounce if wait else 0, self._settled, loop, uri,
                                    read, publish)

    def closed(self, uri: str) -> None:
        doc = self._docs.pop(uri, None)
        for timer in (doc.timer, doc.idle_timer) if doc is not None else ():
            if timer is not None:
                timer.cancel()

    def _full_now(self, uri: str, read: Read, publish: Publish) -> None:
        now = read(uri)
        if now is not None:
            text, version, path = now
            publish(uri, text, version, self._full(uri, text, path))

    def _full(self, uri: str, text: str, path: str) -> list[Diagnostic]:
        started = time.perf_counter()
        found = self.analyse(text, path)
        doc = self._doc(uri)
        with doc.lock:
            doc.full_s = time.perf_counter() - started
            doc.snapshot = incremental.Snapshot.of(text, path, found)
        return found

    def _settled(self, loop: asyncio.AbstractEventLoop, uri: str, read: Read,
                 publish: Publish) -> None:
        doc = self._doc(uri)
        doc.timer = None
        now = read(uri)
        if now is None:
            return
        text, version, path = now
        # JSON/YAML documents are analysed as saved, whole: the statements are `.sbpolicy`'s
        cheap = is_document(path) or (doc.full_s < self.full_budget if doc.full_s is not None
                                      else text.count("\n") < SMALL_ROWS)
        if cheap and not doc.running:
            publish(uri, text, version, self._full(uri, text, path))
            return
        with doc.lock:
            base = doc.snapshot
        publish(uri, text, version, incremental.diagnostics(text, path, base))
        doc.idle_timer = loop.call_later(0 if base is None else self.idle, self._lint, loop,
                                         uri, read, publish)

    def _lint(self, loop: asyncio.AbstractEventLoop, uri: str, read: Read,
              publish: Publish) -> None:
        doc = self._doc(uri)
        doc.idle_timer = None
        if doc.running:
            doc.again = True
            return
        now = read(uri)
        if now is None:
            return
        text, version, path = now
        doc.running = True

        started = time.perf_counter()
        work = partial(_analyse_safely, self.analyse, text, path)

        def done(found: list[Diagnostic] | None) -> None:
            doc.running = False
            if found is not None:
                with doc.lock:
                    doc.full_s = time.perf_counter() - started
                    doc.snapshot = incremental.Snapshot.of(text, path, found)
            current = read(uri)
            if current is None:
                return
            if found is not None and current[1] == version and current[0] == text:
                publish(uri, text, version, found)
            elif doc.again or current[0] != text:
                doc.again = False
                doc.idle_timer = loop.call_later(self.idle, self._lint, loop, uri, read,
                                                 publish)

        future = loop.run_in_executor(self._executor(), work)
        future.add_done_callback(lambda f: done(None if f.cancelled() or f.exception()
                                                else f.result()))

    def _executor(self) -> Executor:
        if self._pool is None:
            try:
                self._pool = ProcessPoolExecutor(
                    1, mp_context=multiprocessing.get_context("spawn"))
            except (OSError, ValueError):  # no processes here: a thread still keeps the loop free
                self._pool = ThreadPoolExecutor(1, thread_name_prefix="sbpolicy-lint")
        return self._pool

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)


def _analyse_safely(analyse: Analyse, text: str, path: str) -> list[Diagnostic] | None:
    try:
        return analyse(text, path)
    except Exception:  # an analysis bug must not stop the editor's diagnostics
        log.exception("analysing %s failed", path)
        return None


def default() -> Scheduler:
    """The server's scheduler over the full analysis of analysis.py."""
    from policy_engine.lsp import analysis

    return Scheduler(analysis.diagnostics)
