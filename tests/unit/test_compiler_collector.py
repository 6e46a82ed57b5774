"""The compiler pauses the cyclic collector while it runs and always restores its state."""

from __future__ import annotations

import gc
from pathlib import Path

import pytest

from policy_engine.compiler import compile_files
from policy_engine.compiler.pipeline import collector_paused, run_stages
from policy_engine.errors import DiagnosticsError

GOOD = 'policy "t/gc" version "1.0.0"\npermit "r" fs.read paths ["/w/**"]\n'


@pytest.mark.parametrize("was_on", [True, False])
def test_the_collector_state_is_restored_after_a_compile(tmp_path: Path, was_on: bool) -> None:
    good, bad = tmp_path / "good.sbpolicy", tmp_path / "bad.sbpolicy"
    good.write_text(GOOD)
    bad.write_text('policy "t/gc" version "1.0.0"\npermit "r" fs.read paths [\n')
    (gc.enable if was_on else gc.disable)()
    try:
        assert compile_files([good]).rules
        assert gc.isenabled() is was_on
        with pytest.raises(DiagnosticsError):
            compile_files([bad])
        assert gc.isenabled() is was_on
    finally:
        gc.enable()


def test_the_collector_is_off_during_the_stages(tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    from policy_engine.compiler import pipeline

    seen: list[bool] = []
    stages = [("Probe", lambda ctx: seen.append(gc.isenabled()), False)]
    monkeypatch.setattr(pipeline, "STAGES", tuple(stages))
    (tmp_path / "p.sbpolicy").write_text(GOOD)
    assert gc.isenabled()
    run_stages([tmp_path / "p.sbpolicy"])
    assert seen == [False]
    assert gc.isenabled()


def test_an_exception_inside_restores_the_collector() -> None:
    assert gc.isenabled()
    inside: list[bool] = []

    def fail() -> None:
        with collector_paused():
            inside.append(gc.isenabled())
            raise RuntimeError("boom")

    with pytest.raises(RuntimeError):
        fail()
    assert inside == [False]
    assert gc.isenabled()
