"""Outsider round 39, F01: the per-profile mask-pattern memo (``spec._mask_patterns``, commit
8341ea2) is a module dict shared by every thread; when it reaches 256 entries the next miss
clears it. A call that has just put its own entry and reads it back (``return
_PATTERNS[id(profile)][1]``) loses it when another thread's call clears the dict in between:
``ProcExecutor.execute`` then raises a bare ``KeyError`` (a traceback, not an answer) — in the
HTTP service or MCP server, where calls of different agents run on worker threads with a fresh
per-call profile each, one such call in every 256 profiles is exposed.

The interleaving is made deterministic, not simulated: a trace function on the victim's thread
pauses it at the first line after its entry is in the memo (the memo grew: a point where the GIL
may hand over to another thread at any time) and lets a second, real ``execute`` of another
agent run to its end there. Nothing is mocked; both calls run through the real proc-bwrap sandbox.
"""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path
from types import FrameType
from typing import Any

import pytest

from plugins.executor_proc import spec
from plugins.executor_proc.executor import ProcExecutor
from policy_engine.executor import ExecContext
from policy_engine.model import ExecResult, ProcExecOp, Profile
from tests.integration.test_proc_sandbox import make_profile

pytestmark = pytest.mark.integration

_CODE = spec._mask_patterns.__code__


def _run(ex: ProcExecutor, profile: Profile, text: str) -> ExecResult:
    ctx = ExecContext(profile=profile, deadline=time.monotonic() + 60)
    return ex.execute(ctx, ProcExecOp(tool="sh", args=("-c", f"echo {text}")))


def test_a_concurrent_call_clearing_the_mask_memo_does_not_crash_another(
        tmp_path: Path, bwrap_proc: ProcExecutor) -> None:
    root = tmp_path / "root"
    (root / "out").mkdir(parents=True)
    base = make_profile(root)
    alive: list[Profile] = []  # kept alive: a freed profile's id may come back for the next

    def fresh(tag: str) -> Profile:
        p = base.model_copy(update={"call_id": f"{tag}-{len(alive)}"})
        alive.append(p)
        return p

    # earlier calls (of any agent) filled the memo to one short of its bound: real calls
    memo = spec._PATTERNS
    guard = 0
    while len(memo) != 255:
        res = _run(bwrap_proc, fresh("fill"), "fill")
        assert res.ok
        assert res.out["exit_code"] == 0
        guard += 1
        assert guard < 600, "the memo never reached 255 entries"

    victim, other = fresh("victim"), fresh("other")
    other_result: list[ExecResult | BaseException] = []

    def other_agent() -> None:
        try:
            other_result.append(_run(bwrap_proc, other, "other"))
        except BaseException as exc:  # reported by the assertion below
            other_result.append(exc)

    fired = threading.Event()
    helper = threading.Thread(target=other_agent)

    size: list[int] = []

    def local(frame: FrameType, event: str, arg: Any) -> Any:
        if (event == "line" and not fired.is_set() and size
                and frame.f_locals.get("profile") is victim and len(memo) > size[0]):
            fired.set()  # the victim's entry is in: another agent's call runs now
            helper.start()
            helper.join(timeout=10)  # a fix that locks the memo: the victim goes on first
        return local

    def tracer(frame: FrameType, event: str, arg: Any) -> Any:
        if frame.f_code is not _CODE:
            return None
        if frame.f_locals.get("profile") is victim and not size:
            size.append(len(memo))  # the memo's size as the victim's look starts
        return local

    sys.settrace(tracer)
    try:
        try:
            mine: ExecResult | BaseException = _run(bwrap_proc, victim, "victim")
        except BaseException as exc:
            mine = exc
    finally:
        sys.settrace(None)
        if helper.is_alive() or fired.is_set():
            helper.join(timeout=60)
    assert fired.is_set(), "the victim's call never put its mask patterns in the memo"
    assert isinstance(other_result[0], ExecResult)
    assert other_result[0].out["stdout"] == "other\n"
    assert isinstance(mine, ExecResult), f"the victim's call crashed: {mine!r}"
    assert mine.ok
    assert mine.out["stdout"] == "victim\n"
