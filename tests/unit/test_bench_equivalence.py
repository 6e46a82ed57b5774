"""Every benchmarked engine gives the wanted answer on every case of the decision set."""

from __future__ import annotations

import sys
from pathlib import Path
from types import ModuleType

import pytest

# benchmarks/ is not an installed package; the benchmark imports it from the checkout root too
ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.peers import (  # noqa: E402 - needs the checkout root on sys.path first
    casbin_peer,
    cedar_peer,
    common,
    policy_engine_peer,
    rego_peer,
)

ENGINES: list[ModuleType] = [policy_engine_peer, cedar_peer, casbin_peer]
if rego_peer.import_error() is None:
    ENGINES.append(rego_peer)


@pytest.mark.parametrize("variant", common.VARIANTS)
@pytest.mark.parametrize("engine", ENGINES, ids=lambda m: m.NAME)
def test_engine_gives_the_wanted_answers(engine: ModuleType, variant: str) -> None:
    cases = common.load_cases(variant)
    eng = engine.Engine(variant, cases)
    wrong = [f"{c.label}: want {'allow' if c.want else 'deny'}"
             for c in cases if eng.decide(eng.prepare(c)) is not c.want]
    assert wrong == []


@pytest.mark.parametrize("variant", common.VARIANTS)
def test_our_guard_agrees_without_symlink_resolution(variant: str) -> None:
    cases = common.load_cases(variant, ("fs.read", "fs.write"))
    eng = policy_engine_peer.Engine(variant, cases, resolve_symlinks=False)
    assert [c.label for c in cases if eng.decide(eng.prepare(c)) is not c.want] == []


def test_cedar_batch_agrees_with_single_calls() -> None:
    cases = common.load_cases("cel")
    eng = cedar_peer.Engine("cel", cases)
    assert eng.decide_batch([eng.prepare(c) for c in cases]) == [c.want for c in cases]


def test_decision_set_covers_every_domain_with_both_answers() -> None:
    cases = common.load_cases("plain")
    for domain in common.DOMAINS:
        answers = {c.want for c in cases if c.domain == domain}
        assert answers == {True, False}, domain


def test_regopy_imports() -> None:
    """regopy is in the ``bench`` extra; if it stops loading the README must say why."""
    assert rego_peer.import_error() is None
