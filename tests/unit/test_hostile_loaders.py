"""Hostile JSON/YAML never loops, exhausts memory or crashes a loader: each is a diagnostic.

Requests, grants, manifests and policy-test files are all read by the bounded parser
(policy_engine/inputs/bounded.py); the named reproducers from the fuzzing pass (tests/data/hostile)
run through the real CLI in a child process capped at 1.5 GB, and every one must end with its
own diagnostic, its position, exit code 2, quickly and in little memory.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
from hostile_cli import (
    GIT_STATUS,
    HOSTILE,
    ORG,
    SHELL_GRANT,
    SHELL_MANIFEST,
    Ran,
    run_cli,
)

from policy_engine.compiler.loaders import load_document, load_grant, load_manifest
from policy_engine.config import load_config
from policy_engine.errors import DiagnosticsError
from policy_engine.explain.request import load_request
from policy_engine.inputs.bounded import (
    MAX_ALIAS_NODES,
    MAX_DEPTH,
    MAX_DOCUMENT_BYTES,
    MAX_INT_DIGITS,
    MAX_NODES,
    DocumentError,
    parse_json,
    parse_yaml,
)
from policy_engine.policytest.loader import load_test_file

# Far below the 7-8 GB, 20 s and segfaults seen before; far above what a refusal costs.
MAX_RSS_KB = 200_000
MAX_SECONDS = 20


def _refused(ran: Ran, diag: str, where: str, message: str) -> None:
    assert ran.code == 2, ran
    assert "Traceback" not in ran.output, ran
    assert f"{where}: {diag} " in ran.output, ran
    assert message in ran.output, ran
    assert ran.max_rss_kb < MAX_RSS_KB, ran
    assert ran.seconds < MAX_SECONDS, ran


def _explain(request: Path, *extra: str) -> list[str]:
    return ["explain", "--policy", str(ORG), "--request", str(request), *extra]


# ---- the reproducers, through the CLI -----------------------------------------------------------

def test_a_self_referencing_alias_as_request_is_refused_at_the_alias() -> None:
    ran = run_cli(_explain(HOSTILE / "cyclic.yaml"), HOSTILE)
    _refused(ran, "SBP105", "cyclic.yaml:2:5", "alias `*a` refers to a node that contains it")


def test_a_self_referencing_alias_as_grant_and_manifest_is_refused(tmp_path: Path) -> None:
    grant = run_cli(_explain(GIT_STATUS, "--grant", str(HOSTILE / "cyclic.yaml")), HOSTILE)
    _refused(grant, "SBP105", "cyclic.yaml:2:5", "refers to a node that contains it")
    shutil.copy(HOSTILE / "cyclic.yaml", tmp_path / "m.yaml")
    manifest = run_cli(_explain(GIT_STATUS, "--manifest", "m.yaml"), tmp_path)
    _refused(manifest, "SBP105", "m.yaml:2:5", "refers to a node that contains it")


def test_a_self_referencing_alias_as_test_file_is_refused() -> None:
    ran = run_cli(["test", "cyclic.sbtest.yaml"], HOSTILE)
    _refused(ran, "SBP105", "cyclic.sbtest.yaml:2:5", "refers to a node that contains it")


def test_an_alias_bomb_is_refused_before_it_expands() -> None:
    ran = run_cli(_explain(Path("alias-bomb.yaml"), "--manifest", str(SHELL_MANIFEST),
                           "--grant", str(SHELL_GRANT)), HOSTILE)
    _refused(ran, "SBP105", "alias-bomb.yaml:10:42",
             f"aliases expand the document by more than {MAX_ALIAS_NODES} nodes")


def test_25000_nested_lists_in_a_test_file_do_not_segfault() -> None:
    ran = run_cli(["test", "deep-list.sbtest.yaml"], HOSTILE)
    _refused(ran, "SBP105", f"deep-list.sbtest.yaml:1:{MAX_DEPTH + 1}",
             f"nested more than {MAX_DEPTH} levels deep")


@pytest.mark.parametrize(("args", "where"), [
    (["explain", "--policy", str(ORG), "--request", str(GIT_STATUS), "--grant",
      "bigint-grant.json"], "bigint-grant.json:1:106"),
    (["explain", "--policy", str(ORG), "--request", "bigint-req.yaml"], "bigint-req.yaml:2:9"),
    (["test", "bigint.sbtest.yaml"], "bigint.sbtest.yaml:3:9"),
])
def test_a_5000_digit_integer_is_refused_where_it_is_written(args: list[str], where: str) -> None:
    ran = run_cli(args, HOSTILE)
    _refused(ran, "SBP105", where,
             f"integer with 5000 digits; integers have at most {MAX_INT_DIGITS}")


def test_deep_json_is_refused_with_its_position(tmp_path: Path) -> None:
    (tmp_path / "g.json").write_text("[" * 100_000)
    ran = run_cli(_explain(GIT_STATUS, "--grant", "g.json"), tmp_path)
    _refused(ran, "SBP105", f"g.json:1:{MAX_DEPTH + 1}", "nested more than 64 levels deep")


@pytest.mark.parametrize("suffix", ["json", "yaml"])
def test_two_million_values_in_a_4mb_document_are_refused_early(tmp_path: Path,
                                                                suffix: str) -> None:
    # before: 2 GB and 54 s (JSON) / 110 s (YAML) building and validating two million ints
    values = ",".join(["1"] * 1_999_000)
    text = (f'{{"tenant": [{values}]}}' if suffix == "json" else f"tenant: [{values}]\n")
    (tmp_path / f"g.{suffix}").write_text(text)
    ran = run_cli(_explain(GIT_STATUS, "--grant", f"g.{suffix}"), tmp_path)
    column = 2 * MAX_NODES + (7 if suffix == "json" else 4)
    _refused(ran, "SBP105", f"g.{suffix}:1:{column}",
             f"more than {MAX_NODES:,} values in one document; split it")


def test_a_document_over_the_size_limit_is_refused_without_reading_it_all(
        tmp_path: Path) -> None:
    big = tmp_path / "r.json"
    with big.open("w") as fh:
        fh.write('{"op": {"kind": "fs.read", "path": "/workspace/a"}, "description": "')
        fh.write("x" * (MAX_DOCUMENT_BYTES + 10))
        fh.write('"}')
    ran = run_cli(_explain(big), tmp_path)
    _refused(ran, "SBP106", "r.json:1:1", f"larger than {MAX_DOCUMENT_BYTES:,} bytes")


# ---- duplicate keys (issue 10 item 8) -----------------------------------------------------------

def _diag(exc: pytest.ExceptionInfo[DiagnosticsError]) -> tuple[str, int, int, str]:
    d = exc.value.diagnostics[0]
    assert d.span is not None
    return d.id, d.span.line, d.span.column, d.message


def test_a_json_grant_with_a_key_written_twice_is_refused_at_the_second(tmp_path: Path) -> None:
    grant = json.loads(SHELL_GRANT.read_text())
    text = json.dumps(grant, indent=2)
    text = text.replace('"tenant": "acme",', '"tenant": "acme",\n  "tenant": "evil",', 1)
    (tmp_path / "g.json").write_text(text)
    with pytest.raises(DiagnosticsError) as exc:
        load_grant(tmp_path / "g.json")
    assert _diag(exc) == ("SBP105", 3, 3, "invalid JSON: duplicate key `tenant` (first written "
                                          "at line 2, column 3); a key may appear once in a "
                                          "mapping")


def test_a_yaml_manifest_with_two_permissions_keys_is_refused(tmp_path: Path) -> None:
    # the observed case: the second `permissions:` silently widened hosts to ['*']
    (tmp_path / "m.yaml").write_text(
        "name: fetch\nversion: '1'\npermissions:\n  - {kind: net.http, hosts: [api.github.com]}\n"
        "permissions:\n  - {kind: net.http, hosts: ['*']}\n")
    with pytest.raises(DiagnosticsError) as exc:
        load_manifest(tmp_path / "m.yaml")
    assert _diag(exc)[:3] == ("SBP105", 5, 1)
    assert "duplicate key `permissions` (first written at line 3, column 1)" in _diag(exc)[3]


def test_a_duplicate_key_nested_in_request_settings_is_refused(tmp_path: Path) -> None:
    (tmp_path / "r.yaml").write_text(
        "op: {kind: fs.read, path: /workspace/a}\nsettings:\n  network: restricted\n"
        "  network: on\n")
    with pytest.raises(DiagnosticsError) as exc:
        load_request(tmp_path / "r.yaml")
    assert _diag(exc)[:3] == ("SBP105", 4, 3)
    assert "duplicate key `network`" in _diag(exc)[3]


def test_a_duplicate_key_in_a_json_request_op_is_refused(tmp_path: Path) -> None:
    (tmp_path / "r.json").write_text(
        '{"op": {"kind": "fs.read", "path": "/workspace/a", "path": "/etc/shadow"}}')
    with pytest.raises(DiagnosticsError) as exc:
        load_request(tmp_path / "r.json")
    assert _diag(exc)[:3] == ("SBP105", 1, 52)
    assert "duplicate key `path`" in _diag(exc)[3]


def test_a_duplicate_case_key_in_a_test_file_is_refused(tmp_path: Path) -> None:
    (tmp_path / "t.sbtest.yaml").write_text(
        f"policy: {ORG}\nmanifest: {SHELL_MANIFEST}\ngrant: {SHELL_GRANT}\ncases:\n"
        "  - name: a\n    op: {kind: fs.read, path: /workspace/a}\n"
        "    want_decision: allow\n    want_decision: deny\n")
    with pytest.raises(DiagnosticsError) as exc:
        load_test_file(str(tmp_path / "t.sbtest.yaml"))
    assert _diag(exc)[:3] == ("SBP105", 8, 5)
    assert "duplicate key `want_decision`" in _diag(exc)[3]


def test_the_same_key_in_different_mappings_and_escaped_spellings() -> None:
    # different mappings may share key names; an escaped spelling of the same key is the same key
    data, _ = parse_json('{"a": {"k": 1}, "b": {"k": 2}}')
    assert data == {"a": {"k": 1}, "b": {"k": 2}}
    with pytest.raises(DocumentError, match="duplicate key `k`"):
        parse_json('{"k": 1, "\\u006b": 2}')
    # YAML: 1 (an int) and "1" (a string) are different keys
    data, _ = parse_yaml('1: a\n"1": b\n')
    assert data == {1: "a", "1": "b"}


# ---- what the scan lets through is unchanged, and positions stay right ---------------------------

def test_shared_anchors_within_the_budget_still_load(tmp_path: Path) -> None:
    (tmp_path / "r.yaml").write_text(
        "op: &op {kind: fs.read, path: /workspace/a}\ncontext:\n  tenant: {copy: *op}\n")
    request = load_request(tmp_path / "r.yaml")
    assert request.context["tenant"]["copy"] == {"kind": "fs.read", "path": "/workspace/a"}


def test_positions_of_keys_and_items_in_json_and_yaml(tmp_path: Path) -> None:
    (tmp_path / "d.json").write_text('{\n  "a": [1, {"b": 2}],\n  "c": "x"\n}')
    _, lookup = load_document(tmp_path / "d.json")
    assert lookup.positions[("a",)] == (2, 3)
    assert lookup.positions[("a", 1)] == (2, 12)
    assert lookup.positions[("a", 1, "b")] == (2, 13)
    assert lookup.positions[("c",)] == (3, 3)
    (tmp_path / "d.yaml").write_text("a:\n  - 1\n  - b: 2\nc: x\n")
    _, lookup = load_document(tmp_path / "d.yaml")
    assert lookup.positions[("a", 1)] == (3, 5)
    assert lookup.positions[("a", 1, "b")] == (3, 5)
    assert lookup.positions[("c",)] == (4, 1)


@pytest.mark.parametrize(("text", "message"), [
    ("a: !!int abc\n", "`abc` is not a valid `!!int`"),
    ("a: 2001-13-45\n", "`2001-13-45` is not a valid `!!timestamp`"),
    ("a: !!float x\n", "`x` is not a valid `!!float`"),
    ("a: 1\n---\nb: 2\n", "a file holds one YAML document"),
    ("a: *nothing\n", "alias `*nothing` names no anchor defined before it"),
])
def test_yaml_values_a_tag_cannot_hold_are_diagnostics(tmp_path: Path, text: str,
                                                       message: str) -> None:
    (tmp_path / "d.yaml").write_text(text)
    with pytest.raises(DiagnosticsError) as exc:
        load_document(tmp_path / "d.yaml")
    d = exc.value.diagnostics[0]
    assert d.id == "SBP105"
    assert message in d.message
    assert d.span is not None
    assert re.fullmatch(r"\d+", str(d.span.line))


def test_the_engine_configuration_is_bounded_and_refuses_duplicate_keys(tmp_path: Path) -> None:
    (tmp_path / "cyclic.yaml").write_text("&a\nmode: *a\n")
    with pytest.raises(ValueError, match=r"cyclic.yaml`:2:7: alias `\*a` refers to a node that "
                                         "contains it"):
        load_config(tmp_path / "cyclic.yaml")
    (tmp_path / "twice.yaml").write_text("mode: strict\nmode: compat\n")
    with pytest.raises(ValueError, match=r"twice.yaml`:2:1: duplicate key `mode`"):
        load_config(tmp_path / "twice.yaml")
    (tmp_path / "ok.yaml").write_text("mode: compat\n")
    assert load_config(tmp_path / "ok.yaml").mode == "compat"


def test_a_nul_byte_in_a_path_given_to_a_loader_is_sbp100() -> None:
    with pytest.raises(DiagnosticsError) as exc:
        load_grant("grants/x\x00.json")
    d = exc.value.diagnostics[0]
    assert (d.id, d.message) == ("SBP100", "cannot read `grants/x\\0.json`: the path contains "
                                           "a NUL byte")
