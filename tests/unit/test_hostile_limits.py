"""Policy size is bounded (SBP106) and memory stays within a small multiple of the input.

Measured in a child process (its own peak RSS from wait4; about 55-60 MB is the interpreter
with the engine imported). Before: `fmt --check` and `lint` took 725 MB on a 4 MB file of `{`
and 224 MB on a 1 MB one; `check` took 24.5 s and 925 MB on a valid 10 MB policy.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hostile_cli import GIT_STATUS, Ran, run_cli

from policy_engine.dsl.parser import MAX_POLICY_BYTES

# the engine's imports take ~60 MB; a refused or small input may add little on top
BASE_RSS_KB = 100_000
MAX_SECONDS = 20


def _too_large(ran: Ran, name: str) -> None:
    assert ran.code == 2, ran
    assert f"{name}:1:1: SBP106 `{name}` is larger than {MAX_POLICY_BYTES:,} bytes, the limit " \
           "for policy files" in ran.output, ran
    assert "Traceback" not in ran.output, ran
    assert ran.max_rss_kb < BASE_RSS_KB, ran
    assert ran.seconds < MAX_SECONDS, ran


@pytest.fixture(scope="module")
def big_files(tmp_path_factory: pytest.TempPathFactory) -> Path:
    work = tmp_path_factory.mktemp("big")
    (work / "braces4M.sbpolicy").write_text("{" * 4_000_000)
    (work / "braces1M.sbpolicy").write_text("{" * 1_000_000)
    rules = ['policy "big" version "1.0.0"']
    size = 0
    while size < 10_000_000:
        rule = f'permit "r{len(rules)}" fs.read paths ["/workspace/d{len(rules)}/**"]'
        rules.append(rule)
        size += len(rule) + 1
    (work / "valid10M.sbpolicy").write_text("\n".join(rules) + "\n")
    return work


@pytest.mark.parametrize("command", [["check"], ["lint"], ["fmt", "--check"]])
def test_a_4mb_file_of_braces_is_refused_for_its_size(big_files: Path,
                                                      command: list[str]) -> None:
    _too_large(run_cli([*command, "braces4M.sbpolicy"], big_files), "braces4M.sbpolicy")


@pytest.mark.parametrize("command", [["check"], ["lint"], ["fmt", "--check"]])
def test_a_valid_10mb_policy_is_refused_for_its_size(big_files: Path,
                                                     command: list[str]) -> None:
    _too_large(run_cli([*command, "valid10M.sbpolicy"], big_files), "valid10M.sbpolicy")


def test_explain_and_fmt_stdin_refuse_an_oversized_policy(big_files: Path) -> None:
    _too_large(run_cli(["explain", "--policy", "braces4M.sbpolicy", "--request",
                        str(GIT_STATUS)], big_files), "braces4M.sbpolicy")
    ran = run_cli(["fmt", "-", "--stdin-filename", "in.sbpolicy"], big_files,
                  stdin=b"{" * 4_000_000)
    _too_large(ran, "in.sbpolicy")


@pytest.mark.parametrize("command", [["check"], ["lint"], ["fmt", "--check"]])
def test_a_1mb_file_of_braces_under_the_limit_costs_little_memory(
        big_files: Path, command: list[str]) -> None:
    ran = run_cli([*command, "braces1M.sbpolicy"], big_files)
    assert ran.code in (1, 2), ran
    assert "braces1M.sbpolicy:1:1: SBP101 unexpected `{`" in ran.output, ran
    assert ran.max_rss_kb < BASE_RSS_KB, ran  # was 224 MB for lint and fmt
    assert ran.seconds < MAX_SECONDS, ran


def test_a_policy_of_exactly_the_limit_is_not_refused_for_its_size(tmp_path: Path) -> None:
    head = 'policy "edge" version "1.0.0"\n'
    comment = "# " + "x" * 97 + "\n"
    body = comment * ((MAX_POLICY_BYTES - len(head)) // len(comment))
    text = head + body + "#" * (MAX_POLICY_BYTES - len(head) - len(body) - 1) + "\n"
    assert len(text.encode()) == MAX_POLICY_BYTES
    (tmp_path / "edge.sbpolicy").write_text(text)
    ran = run_cli(["check", "edge.sbpolicy"], tmp_path)
    assert ran.code == 0, ran
    (tmp_path / "over.sbpolicy").write_text(text + "\n")
    _too_large(run_cli(["check", "over.sbpolicy"], tmp_path), "over.sbpolicy")


def test_lint_stops_pairwise_shadowing_checks_on_a_budget(tmp_path: Path) -> None:
    # 1,000 permits under one prefix: every pair is compared (~60 us each); this took 70 s
    rules = [f'permit "r{i}" fs.read paths ["/workspace/**/d{i}/**"]' for i in range(1000)]
    (tmp_path / "same.sbpolicy").write_text('policy "same" version "1.0.0"\n'
                                            + "\n".join(rules) + "\n")
    ran = run_cli(["lint", "--format", "json", "same.sbpolicy"], tmp_path)
    assert ran.code == 0, ran  # a note does not fail lint
    stopped = [f["message"] for f in json.loads(ran.out)["findings"] if f["id"] == "SBP342"]
    # each pairwise check says where it stopped: shadowing (SBP338/339) and SBP337's "written
    # otherwise" (half a million pairs, ~20 s, before it had a budget)
    assert len(stopped) == 2, ran
    assert all("more than 50,000 rule comparisons" in m for m in stopped), stopped
    assert sum(m.startswith("SBP337") for m in stopped) == 1, stopped
    assert ran.seconds < MAX_SECONDS, ran
    assert ran.max_rss_kb < BASE_RSS_KB, ran
