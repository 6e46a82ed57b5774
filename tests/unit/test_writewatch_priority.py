"""The disk write watch samples from a thread scheduled ahead of the call it watches: at nice 0
it waited behind the writer on a loaded machine and let 96 MB past an 8 MB quota."""

from __future__ import annotations

import os
import threading
import time

from plugins.executor_proc.writewatch import WATCH_NICE, WriteWatch


def _nice_of(tid: int) -> int:
    with open(f"/proc/self/task/{tid}/stat", encoding="ascii") as fh:
        fields = fh.read().rsplit(")", 1)[1].split()
    return int(fields[16])  # field 19 of proc(5), counted after "pid (comm)"


def test_the_sampling_thread_runs_at_a_higher_priority_than_the_engine() -> None:
    seen: list[int] = []

    def members() -> list[int]:
        seen.append(threading.get_native_id())
        return [os.getpid()]

    watch = WriteWatch(limit=1 << 40, members=members, kill=lambda: None, interval_s=0.001)
    watch.start()
    try:
        deadline = time.monotonic() + 10
        while not seen and time.monotonic() < deadline:
            time.sleep(0.005)
        assert seen, "the watch never sampled"
        assert _nice_of(seen[0]) == WATCH_NICE
        assert _nice_of(threading.get_native_id()) == os.nice(0)  # the caller is unchanged
    finally:
        watch.stop()
    assert not watch.tripped
