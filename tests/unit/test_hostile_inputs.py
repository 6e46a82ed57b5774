"""Input files that are not what they claim: devices, pipes, files over a limit, host files.

Every command reads its inputs through `policy_engine/inputs/inputfile.py`: a character device or
a named pipe reports 0 bytes and then never ends (or, opened without a writer, never starts),
so each is refused by what it is, with `SBP100`, before anything is read. An `import` names
only `.sbpolicy` files (SBP217) and directory walks take only regular files whose real path has
the suffix: a policy under review cannot make `check`/`lint`/`fmt`/`test` quote a host file.
All run through the real CLI in a child process with a memory cap and a timeout.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from hostile_cli import EXAMPLES, GIT_STATUS, ORG, Ran, run_cli

from policy_engine.inputs.inputfile import MAX_EVIDENCE_BYTES, MAX_KEY_BYTES

MARKER = "SECRET-MARKER-41c7e2"


def _refused(ran: Ran, *needles: str) -> None:
    assert ran.code == 2, ran
    assert ran.seconds < 30, ran
    assert ran.max_rss_kb < 400_000, ran
    assert "Traceback" not in ran.output, ran
    assert "UNKNOWN.INTERNAL" not in ran.output, ran
    for needle in needles:
        assert needle in ran.output, ran


@pytest.fixture
def fifo(tmp_path: Path) -> Path:
    path = tmp_path / "pipe"
    os.mkfifo(path)
    return path


# ---- F3: devices and pipes -------------------------------------------------------------------

def test_check_refuses_dev_zero_without_reading_it() -> None:
    ran = run_cli(["check", "/dev/zero"], timeout=30)
    _refused(ran, "/dev/zero:1:1: SBP100 `/dev/zero` is a character device, not a regular file",
             "inputs are read from regular files only")


def test_stats_refuses_dev_zero() -> None:
    ran = run_cli(["stats", "/dev/zero"], timeout=30)
    _refused(ran, "error: SBP100 cannot read evidence log `/dev/zero`: it is a character device")


def test_explain_refuses_dev_zero_as_manifest_and_grant() -> None:
    ran = run_cli(["explain", "--policy", str(ORG), "--request", str(GIT_STATUS),
                   "--manifest", "/dev/zero", "--grant", "/dev/zero"], timeout=30)
    _refused(ran, "/dev/zero:1:1: SBP100 `/dev/zero` is a character device")


def test_a_request_naming_a_pipe_json_as_its_manifest_is_refused(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "m.json")
    (tmp_path / "req.json").write_text(json.dumps({
        "op": {"kind": "fs.read", "path": "/workspace/x"},
        "manifest": "m.json", "grant": "m.json"}))
    ran = run_cli(["explain", "--policy", str(ORG), "--request", "req.json"], tmp_path,
                  timeout=20)
    _refused(ran, "m.json:1:1: SBP100 `m.json` is a named pipe (FIFO)")


def _fifo_commands(pipe: str, tmp: Path) -> dict[str, list[str]]:
    policy = str(ORG)
    return {
        "check": ["check", pipe],
        "lint": ["lint", pipe],
        "fmt": ["fmt", "--check", pipe],
        "test": ["test", pipe],
        "stats": ["stats", pipe],
        "explain-policy": ["explain", "--policy", pipe, "--request", str(GIT_STATUS)],
        "explain-request": ["explain", "--policy", policy, "--request", pipe],
        "explain-grant": ["explain", "--policy", policy, "--request", str(GIT_STATUS),
                          "--grant", pipe],
        "plugins-config": ["plugins", "--config", pipe],
        "evidence-verify": ["evidence", "verify", pipe],
        "evidence-public-key": ["evidence", "verify", str(tmp / "log.jsonl"),
                                "--public-key", pipe],
        "replay": ["replay", "--policy", policy, pipe],
        "replay-seal-key": ["replay", "--policy", policy, "--seal-key", pipe,
                            str(tmp / "log.jsonl")],
        "diff-evidence": ["diff", policy, policy, "--no-boundary", "--evidence", pipe],
        "diff-request": ["diff", policy, policy, "--no-boundary", "--request", pipe],
    }


@pytest.mark.parametrize("name", sorted(_fifo_commands("p", Path("."))))
def test_a_named_pipe_as_any_input_is_refused_never_waited_on(
        tmp_path: Path, fifo: Path, name: str) -> None:
    # nobody writes to the pipe: a command that opens it blocks until the timeout kills it
    (tmp_path / "log.jsonl").write_text("")
    ran = run_cli(_fifo_commands(str(fifo), tmp_path)[name], tmp_path, timeout=20)
    _refused(ran, "is a named pipe (FIFO), not a regular file")
    if name not in ("test", "lint", "check", "fmt", "explain-policy", "explain-request",
                    "explain-grant", "diff-request"):
        assert "SBP100" in ran.output, ran


def test_directory_walks_skip_pipes(tmp_path: Path) -> None:
    shutil.copy(EXAMPLES / "policies" / "network.sbpolicy", tmp_path / "ok.sbpolicy")
    os.mkfifo(tmp_path / "g.sbpolicy")
    os.mkfifo(tmp_path / "t.sbtest.yaml")
    lint = run_cli(["lint", "."], tmp_path, timeout=30)
    assert lint.code in (0, 1), lint
    assert lint.seconds < 30, lint
    assert "g.sbpolicy" not in lint.output, lint
    fmt = run_cli(["fmt", "--check", "."], tmp_path, timeout=30)
    assert fmt.code in (0, 1), fmt
    assert fmt.seconds < 30, fmt
    test = run_cli(["test", "."], tmp_path, timeout=30)
    assert test.seconds < 30, test
    assert "t.sbtest.yaml" not in test.output, test
    assert "SBP400" in test.output, test  # no test file found: the pipe was not taken


def test_an_imported_pipe_is_sbp100(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "lib.sbpolicy")
    (tmp_path / "p.sbpolicy").write_text('policy "a" version "1"\nimport "lib.sbpolicy"\n')
    ran = run_cli(["check", "p.sbpolicy"], tmp_path, timeout=20)
    assert ran.code in (1, 2), ran
    assert ran.seconds < 20, ran
    assert "lib.sbpolicy:1:1: SBP100" in ran.output, ran
    assert "named pipe (FIFO)" in ran.output, ran


def test_a_pipe_in_place_of_the_state_dirs_evidence_key_is_refused(tmp_path: Path) -> None:
    keys = tmp_path / "state" / "keys"
    keys.mkdir(parents=True)
    os.mkfifo(keys / "evidence-hmac.key")
    ran = run_cli(["run", "--state-dir", str(tmp_path / "state"), "--policy", str(ORG),
                   "--request", str(GIT_STATUS)], tmp_path, timeout=30)
    _refused(ran, "evidence-hmac.key` cannot be created or read: it is a named pipe (FIFO)")


# ---- F3: files over a limit, refused by their size before they are read ---------------------

def _sparse(path: Path, size: int) -> Path:
    with path.open("wb") as fh:
        fh.truncate(size)
    return path


def test_an_evidence_log_over_the_limit_is_sbp106_without_reading_it(tmp_path: Path) -> None:
    _sparse(tmp_path / "big.jsonl", MAX_EVIDENCE_BYTES + 1)
    ran = run_cli(["evidence", "verify", "big.jsonl"], tmp_path, timeout=30)
    _refused(ran, "error: SBP106 evidence log `big.jsonl` is larger than 1,073,741,824 bytes")
    assert ran.seconds < 10, ran
    ran = run_cli(["replay", "--policy", str(ORG), "big.jsonl"], tmp_path, timeout=30)
    _refused(ran, "SBP106 evidence log `big.jsonl`")


def test_a_key_file_over_the_limit_is_sbp106(tmp_path: Path) -> None:
    _sparse(tmp_path / "key.pem", MAX_KEY_BYTES + 1)
    (tmp_path / "log.jsonl").write_text("")
    ran = run_cli(["evidence", "verify", "log.jsonl", "--public-key", "key.pem"], tmp_path)
    _refused(ran, "SBP106 public key `key.pem` is larger than 65,536 bytes")
    ran = run_cli(["replay", "--policy", str(ORG), "--seal-key", "key.pem", "log.jsonl"],
                  tmp_path)
    _refused(ran, "SBP106 replay seal key `key.pem`")


# ---- F4: no host file is quoted through an import or a walk ---------------------------------

@pytest.fixture
def secret(tmp_path: Path) -> Path:
    outside = tmp_path / "host"
    outside.mkdir()
    path = outside / "shadow"
    path.write_text(f"{MARKER}:*:20228:0:99999:7:::\n")
    key = outside / "key.json"
    key.write_text(json.dumps({"crv": "P-256", "d": MARKER}) + "\n")
    return path


@pytest.mark.parametrize("target", ["host/shadow", "ABS", "host/key.json", "link.sbpolicy"])
@pytest.mark.parametrize("command", ["check", "lint", "explain"])
def test_an_import_of_a_non_policy_file_is_refused_unread(
        tmp_path: Path, secret: Path, target: str, command: str) -> None:
    (tmp_path / "link.sbpolicy").symlink_to(secret)
    written = str(secret) if target == "ABS" else target
    (tmp_path / "p.sbpolicy").write_text(f'policy "a" version "1"\nimport "{written}"\n')
    args = {"check": ["check", "p.sbpolicy"], "lint": ["lint", "p.sbpolicy"],
            "explain": ["explain", "--policy", "p.sbpolicy", "--request", str(GIT_STATUS)]}
    ran = run_cli(args[command], tmp_path)
    assert ran.code in (1, 2), ran
    assert f"p.sbpolicy:2:8: SBP217 import `{written}` is not a `.sbpolicy` file" in ran.output, \
        ran
    assert MARKER not in ran.output, ran


def test_an_import_of_a_missing_non_policy_file_does_not_say_whether_it_exists(
        tmp_path: Path) -> None:
    (tmp_path / "p.sbpolicy").write_text('policy "a" version "1"\nimport "/nonexistent/x"\n')
    ran = run_cli(["check", "p.sbpolicy"], tmp_path)
    assert ran.code == 1, ran
    assert "SBP217" in ran.output, ran
    assert "SBP204" not in ran.output, ran


def test_a_policy_named_link_to_a_host_file_is_skipped_by_directory_walks(
        tmp_path: Path, secret: Path) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    shutil.copy(EXAMPLES / "policies" / "network.sbpolicy", repo / "ok.sbpolicy")
    (repo / "evil.sbpolicy").symlink_to(secret)
    (repo / "evil.sbtest.yaml").symlink_to(secret.parent / "key.json")
    for args in (["lint", "."], ["fmt", "--check", "."], ["test", "."]):
        ran = run_cli(args, repo)
        assert ran.seconds < 30, ran
        assert "Traceback" not in ran.output, ran
        assert MARKER not in ran.output, (args, ran)
        assert "evil" not in ran.output, (args, ran)


@pytest.mark.parametrize("target", ["host/shadow", "link.json", "/dev/zero"])
@pytest.mark.parametrize("what", ["manifest", "grant"])
def test_a_request_naming_a_host_file_as_a_fixture_is_refused_unread(
        tmp_path: Path, secret: Path, target: str, what: str) -> None:
    (tmp_path / "link.json").symlink_to(secret)
    fixtures = {"manifest": str(EXAMPLES / "manifests" / "shell.json"),
                "grant": str(EXAMPLES / "grants" / "shell-agent.json"), what: target}
    (tmp_path / "req.json").write_text(json.dumps({
        "op": {"kind": "proc.exec", "tool": "git", "args": ["status"]}, **fixtures}))
    for command in (["explain", "--policy", str(ORG), "--request", "req.json"],
                    ["diff", str(ORG), str(ORG), "--no-boundary", "--request", "req.json"]):
        ran = run_cli(command, tmp_path, timeout=30)
        _refused(ran, f"req.json:1:1: SBP105 the request's `{what}` names `{target}`, which is "
                      "not a ")
        assert MARKER not in ran.output, ran


@pytest.mark.parametrize("field", ["policy", "manifest", "grant"])
def test_a_test_file_naming_a_host_file_is_refused_unread(
        tmp_path: Path, secret: Path, field: str) -> None:
    shutil.copy(EXAMPLES / "policies" / "network.sbpolicy", tmp_path / "p.sbpolicy")
    names = {"policy": "p.sbpolicy", "manifest": str(EXAMPLES / "manifests" / "shell.json"),
             "grant": str(EXAMPLES / "grants" / "shell-agent.json"), field: "host/shadow"}
    (tmp_path / "t.sbtest.yaml").write_text(
        "".join(f"{k}: {v}\n" for k, v in names.items())
        + "cases:\n  - name: c\n    op: {kind: fs.read, path: /workspace/x}\n"
          "    want_decision: deny\n    want_code: SANDBOX.PERMISSION_DENY\n")
    ran = run_cli(["test", "t.sbtest.yaml"], tmp_path)
    assert ran.code == 2, ran
    assert "is not a " in ran.output, ran
    assert "it was not read" in ran.output, ran
    assert MARKER not in ran.output, ran


# ---- F13: small robustness gaps ---------------------------------------------------------------

@pytest.mark.parametrize("digits", [400, 4_000])
def test_stats_counts_a_huge_integer_latency_as_unreadable(tmp_path: Path, digits: int) -> None:
    good = {"type": "end", "status": "ok", "sandbox_latency_ms": 12}
    (tmp_path / "e.jsonl").write_text(
        '{"type":"end","sandbox_latency_ms":' + "9" * digits + "}\n" + json.dumps(good) + "\n")
    ran = run_cli(["stats", "--format", "json", "e.jsonl"], tmp_path)
    assert ran.code == 0, ran
    summary = json.loads(ran.out)
    assert summary["unreadable_lines"] == 1, summary
    assert summary["calls"] == 1, summary


def test_stats_skips_an_evidence_line_over_a_mebibyte_without_holding_it(tmp_path: Path) -> None:
    huge = {"type": "end", "status": "ok", "padding": "x" * (3 << 20)}
    good = {"type": "end", "status": "ok", "sandbox_latency_ms": 12}
    (tmp_path / "e.jsonl").write_text(json.dumps(huge) + "\n" + json.dumps(good) + "\n")
    ran = run_cli(["stats", "--format", "json", "e.jsonl"], tmp_path)
    assert ran.code == 0, ran
    summary = json.loads(ran.out)
    assert summary["unreadable_lines"] == 1, summary
    assert summary["calls"] == 1, summary


@pytest.mark.parametrize("value", ["nan", "NaN", "-nan"])
def test_test_threshold_nan_is_a_usage_error(value: str) -> None:
    ran = run_cli(["test", "--threshold", value, str(EXAMPLES)])
    assert ran.code == 2, ran
    assert f"Invalid value for '--threshold': '{value}' is not a number" in ran.output, ran


def test_serve_approver_timeout_nan_is_a_usage_error() -> None:
    ran = run_cli(["serve", "--policy", str(ORG), "--approver-timeout", "nan"])
    assert ran.code == 2, ran
    assert "Invalid value for '--approver-timeout': 'nan' is not a number" in ran.output, ran


FMT_ERRORS = ('policy "a" version "1.0.0"   # header\n'
              'forbid "z" fs.read paths ["/w/#/**", "/w/*//**"]\n')


@pytest.mark.parametrize("check", [True, False])
def test_fmt_says_when_a_policy_that_check_rejects_was_proven_by_its_ast_only(
        tmp_path: Path, check: bool) -> None:
    # formatting is layout only (fmt.md): the file is formatted, but fmt must not let it pass
    # for one whose decision graph it compared; the note names the error `check` reports
    (tmp_path / "p.sbpolicy").write_text(FMT_ERRORS)
    ran = run_cli(["fmt", *(["--check"] if check else []), "p.sbpolicy"], tmp_path)
    assert ran.code == (1 if check else 0), ran
    assert ("p.sbpolicy: SBP422 `p.sbpolicy` does not compile (SBP206 at p.sbpolicy:2:38: path "
            "pattern `/w/*//**` contains an empty segment): its layout was proven by the syntax "
            "tree only") in ran.output, ran
    assert "help: run `policy-engine check` on the file and fix its errors" in ran.output, ran
    changed = (tmp_path / "p.sbpolicy").read_text()
    assert (changed == FMT_ERRORS) is check
    assert run_cli(["check", "p.sbpolicy"], tmp_path).code == 1


def test_fmt_still_formats_a_fragment_whose_profile_its_importer_defines(tmp_path: Path) -> None:
    # the fragment alone has SBP202 (its profile is defined by the importing file): formatted
    (tmp_path / "frag.sbpolicy").write_text(
        'tool "t" version "1" { description "d"   profile "dev" }\n')
    ran = run_cli(["fmt", "frag.sbpolicy"], tmp_path)
    assert ran.code == 0, ran
    assert "reformatted frag.sbpolicy" in ran.output, ran
    assert "SBP422" not in ran.output, ran  # a missing name is the importer's, not an error
