"""The disk write watch samples from a thread scheduled ahead of the call it watches (at nice 0
it waited behind the writer on a loaded machine and let 96 MB past an 8 MB quota), and samples
a call far from its quota less often (four calls of 240 processes each, sampled every 10 ms,
cost the engine 57 % of a core: outsider attack 36)."""

from __future__ import annotations

import os
import threading
import time

import pytest

from plugins.executor_proc.writewatch import (
    INTERVAL_S,
    MAX_INTERVAL_S,
    PACE_BYTES_PER_S,
    WATCH_NICE,
    WriteWatch,
)


def _nice_of(tid: int) -> int:
    with open(f"/proc/self/task/{tid}/stat", encoding="ascii") as fh:
        fields = fh.read().rsplit(")", 1)[1].split()
    return int(fields[16])  # field 19 of proc(5), counted after "pid (comm)"


@pytest.mark.parametrize("shared", [False, True], ids=["own-thread", "shared-sampler"])
def test_the_sampling_thread_runs_at_a_higher_priority_than_the_engine(shared: bool) -> None:
    seen: list[int] = []

    def members() -> list[int]:
        seen.append(threading.get_native_id())
        return [os.getpid()]

    watch = WriteWatch(limit=1 << 40, members=members, kill=lambda: None, interval_s=0.001)
    watch.start(shared=shared)
    try:
        deadline = time.monotonic() + 10
        while not seen and time.monotonic() < deadline:
            time.sleep(0.005)
        assert seen, "the watch never sampled"
        assert seen[0] != threading.get_native_id()
        assert _nice_of(seen[0]) == WATCH_NICE
        assert _nice_of(threading.get_native_id()) == os.nice(0)  # the caller is unchanged
    finally:
        watch.stop()
    assert not watch.tripped


def test_a_call_far_from_its_quota_is_sampled_less_often() -> None:
    written = [0]
    watch = WriteWatch(limit=2 << 30, members=lambda: [], kill=lambda: None)
    watch.sample = lambda: written[0]  # type: ignore[method-assign]  # no process: the pacing
    watch.tick()
    assert watch.interval == MAX_INTERVAL_S  # 2 GiB left: a quarter second
    written[0] = (2 << 30) - 80 * 10**6  # 80 MB left: 10 ms at the pace
    watch.tick()
    assert watch.interval == pytest.approx(80 * 10**6 / PACE_BYTES_PER_S)
    written[0] = (2 << 30) - 1000  # near the quota: the shortest period, as before
    watch.tick()
    assert watch.interval == INTERVAL_S
    assert not watch.tripped
    written[0] = (2 << 30) + 1
    watch.tick()
    assert watch.tripped
