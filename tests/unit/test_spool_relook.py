"""The spool is not looked at on every record while known empty (issue 27), yet no record the
process spooled is ever overtaken, and one another process spooled is replayed within
``RELOOK_S``."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from test_evidence_sinks import FlakySink, begin, end

from policy_engine.evidence import SpoolingSink, spool
from policy_engine.evidence.spool import RELOOK_S


def _stats(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every existence check of a spool file, recorded."""
    looked: list[str] = []
    original = Path.exists

    def exists(self: Path, *args: object, **kwargs: object) -> bool:
        if self.suffix == ".jsonl":
            looked.append(self.name)
        return original(self)

    monkeypatch.setattr(Path, "exists", exists)
    return looked


def test_an_empty_spool_is_looked_at_once_a_second(tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    looked = _stats(monkeypatch)
    sink = FlakySink()
    sink.down = False
    spooling = SpoolingSink(sink, tmp_path / "spool")
    for i in range(50):
        spooling.begin(begin(f"e{i}"))
        spooling.end(end(f"e{i}"))
    assert len(sink.got) == 100
    assert len(looked) == 1  # the first record looked; the other 99 trusted it


def test_a_record_spooled_by_a_sibling_sink_is_replayed_first(tmp_path: Path) -> None:
    """Two sinks of one process over one spool (the engine's orchestrator and a pinned one):
    what one spooled reaches the sink before the other's next record, as before."""
    shared = FlakySink()
    shared.down = False
    first, second = (SpoolingSink(shared, tmp_path / "spool") for _ in range(2))
    first.begin(begin("a"))
    second.begin(begin("b"))  # both have now seen the spool empty
    shared.down = True
    first.end(end("a"))  # refused: spooled
    shared.down = False
    second.end(end("b"))  # must replay `end:a` first, not trust its earlier look
    assert shared.got == ["begin:a", "begin:b", "end:a", "end:b"]
    assert second.pending() == 0


def test_another_process_spool_is_replayed_within_the_relook(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A spool written behind this process's back (another engine process that died with
    records spooled) is seen once the trusted second has passed."""
    now = [1000.0]
    monkeypatch.setattr(spool.time, "monotonic", lambda: now[0])
    sink = FlakySink()
    sink.down = False
    spooling = SpoolingSink(sink, tmp_path / "spool")
    spooling.begin(begin("mine-1"))
    # another process's record, written straight into the spool file
    other = SpoolingSink(FlakySink(), tmp_path / "spool")
    os.makedirs(tmp_path / "spool", exist_ok=True)
    (tmp_path / "spool" / "flaky.jsonl").write_bytes(
        begin("theirs").model_dump_json().encode() + b"\n")
    assert other.pending() == 1
    spooling.end(end("mine-1"))  # within the trusted window: not looked at yet
    assert sink.got == ["begin:mine-1", "end:mine-1"]
    now[0] += RELOOK_S + 0.01
    spooling.begin(begin("mine-2"))
    assert sink.got == ["begin:mine-1", "end:mine-1", "begin:theirs", "begin:mine-2"]
    assert spooling.pending() == 0
