"""Fuzz every loader and CLI command with hostile input: diagnostics only, never a crash.

Seeds are the examples and the minimized reproducers of the fuzzing pass (tests/data/hostile);
each is mutated (test_authoring_fuzz's byte/token mutations) or spliced with hostile YAML/JSON
fragments (aliases, cycles, deep nesting, huge integers, bad tags, duplicate keys, NULs). Every
outcome must be a success or a diagnostic: no exception out of a loader but DiagnosticsError, and
from the CLI (check, lint, fmt, explain, run, test, stats, schema) exit 0/1/2, no traceback and
no `UNKNOWN.INTERNAL` (the error boundary catching something is a bug the fuzzer found).

Budget: about a minute in the normal test run. Before a release, run longer with
``POLICY_ENGINE_FUZZ_SCALE=50`` (each test draws 50 times as many examples; see
docs/operations.md, "Input limits").
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from click.testing import CliRunner, Result
from hostile_cli import EXAMPLES, HOSTILE, ORG
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_authoring_fuzz import mutated

from policy_engine.cli.main import cli
from policy_engine.compiler.loaders import load_document, load_grant, load_manifest
from policy_engine.errors import DiagnosticsError
from policy_engine.explain.request import load_request
from policy_engine.policytest.loader import load_test_file

SCALE = max(1, int(os.environ.get("POLICY_ENGINE_FUZZ_SCALE", "1")))


def budget(n: int) -> Callable[[Any], Any]:
    return settings(max_examples=n * SCALE, deadline=None, derandomize=SCALE == 1,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                           HealthCheck.function_scoped_fixture])


def _text(path: Path) -> str:
    return path.read_text(encoding="utf-8")


REQUESTS = {p.name: _text(p) for p in sorted((EXAMPLES / "requests").glob("*.json"))[:6]}
REQUESTS |= {n: _text(HOSTILE / n) for n in ("cyclic.yaml", "alias-bomb.yaml", "bigint-req.yaml",
                                            "noman.json", "nul-path.json")}
GRANTS = {p.name: _text(p) for p in sorted((EXAMPLES / "grants").glob("*.json"))}
GRANTS |= {n: _text(HOSTILE / n) for n in ("badhost-grant.json", "bigint-grant.json")}
MANIFESTS = {p.name: _text(p) for p in sorted((EXAMPLES / "manifests").glob("*.*"))
             if p.suffix in (".json", ".yaml")}
TEST_FILES = {"org.sbtest.yaml": _text(EXAMPLES / "policies" / "org.sbtest.yaml")}
TEST_FILES |= {n: _text(HOSTILE / n) for n in ("cyclic.sbtest.yaml", "bigint.sbtest.yaml",
                                              "deep-list.sbtest.yaml")}
POLICIES = {n: _text(HOSTILE / n) for n in ("deep-regex.sbpolicy", "spurious-sbp200.sbpolicy")}
POLICIES["org.sbpolicy"] = _text(ORG)
EVIDENCE = {n: _text(HOSTILE / n) for n in ("stats-mixed.jsonl", "stats-unhashable.jsonl")}

# Fragments that broke a loader once, spliced into documents at a line start.
HOSTILE_FRAGMENTS = [
    "&a\nop: *a\n", "x: &b [*b]\n", "y: &c {k: *c}\n", "n: " + "9" * 5000 + "\n",
    "d: " + "[" * 3000 + "\n", "t: !!int abc\n", "t: 2001-13-45\n", "t: !!binary '%%'\n",
    "t: !!python/object:os.system x\n", "k: 1\nk: 2\n", "p: \"\\0\"\n", "---\nz: 1\n",
    "? [a]\n: b\n", "<<: *nothing\n", "<<: [1, 2]\n", "m: &m [x, x, x, x, x, x, x, x]\n"
    "m2: [*m, *m, *m, *m, *m, *m, *m, *m]\n", '"op": {"kind": "fs.read", "kind": "fs.write"}\n',
    "\ufeff", "\x00", "\t- a\n", "now_ms: -" + "1" * 30 + "\n", "now_ms: 1e308\n",
    "now_ms: .nan\n", "budget_used: {calls: -1}\n", "context: {tenant: [[[[[[[]]]]]]]}\n",
]


@st.composite
def hostile_document(draw: st.DrawFn, seeds: dict[str, str]) -> tuple[str, bytes]:
    """A seed (name, text) mutated, or with a hostile fragment spliced in at a line start."""
    name = draw(st.sampled_from(sorted(seeds)))
    text = seeds[name]
    if draw(st.booleans()):
        lines = text.split("\n")
        at = draw(st.integers(0, len(lines)))
        frag = draw(st.sampled_from(HOSTILE_FRAGMENTS))
        return name, "\n".join([*lines[:at], frag, *lines[at:]]).encode("utf-8")
    return name, draw(mutated(st.just(text)))


# ---- loaders as a library ----------------------------------------------------------------------

LOADERS: dict[str, tuple[Callable[[Path], object], dict[str, str]]] = {
    "request": (load_request, REQUESTS),
    "grant": (load_grant, GRANTS),
    "manifest": (load_manifest, MANIFESTS),
    "test file": (lambda p: load_test_file(str(p)), TEST_FILES),
    "document": (load_document, {**REQUESTS, **GRANTS, **MANIFESTS, **TEST_FILES}),
}


@budget(1200)
@given(st.sampled_from(sorted(LOADERS)), st.data())
def test_loaders_only_ever_raise_diagnostics(kind: str, data: st.DataObject) -> None:
    loader, seeds = LOADERS[kind]
    name, text = data.draw(hostile_document(seeds))
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / name
        path.write_bytes(text)
        for policy in ("org.sbpolicy",):  # test files name a policy next to them
            shutil.copy(ORG, Path(tmp) / policy)
        diagnostics = []
        try:
            loader(path)
        except DiagnosticsError as exc:
            diagnostics = exc.diagnostics
            assert diagnostics, "an empty DiagnosticsError"
        for d in diagnostics:
            assert re.fullmatch(r"SBP\d{3}", d.id)
            assert d.message


# ---- the CLI --------------------------------------------------------------------------------

def _invoke(argv: list[str], cwd: Path, stdin: bytes | None = None) -> Result:
    old = Path.cwd()
    os.chdir(cwd)
    try:
        return CliRunner().invoke(cli, argv, input=stdin, catch_exceptions=True)
    finally:
        os.chdir(old)


def _clean(result: Result, argv: list[str]) -> None:
    where = f"`policy-engine {' '.join(argv)}` exited {result.exit_code}:\n{result.output[-2000:]}"
    assert result.exception is None or isinstance(result.exception, SystemExit), (
        f"{where}\nraised {result.exception!r}")
    assert "Traceback (most recent call last)" not in result.output, where
    assert "UNKNOWN.INTERNAL" not in result.output, where
    assert result.exit_code in (0, 1, 2), where
    if result.exit_code == 2:
        assert re.search(r"\bSBP\d{3}\b|^error: |Error: ", result.output, re.M), where


def _workdir(tmp: str) -> Path:
    work = Path(tmp)
    for sub in ("policies", "manifests", "grants", "requests"):
        shutil.copytree(EXAMPLES / sub, work / sub)
    return work


@budget(300)
@given(st.sampled_from(["request", "grant", "manifest"]), st.data())
def test_explain_on_hostile_requests_grants_and_manifests(what: str, data: st.DataObject) -> None:
    seeds = {"request": REQUESTS, "grant": GRANTS, "manifest": MANIFESTS}[what]
    name, text = data.draw(hostile_document(seeds))
    with tempfile.TemporaryDirectory() as tmp:
        work = _workdir(tmp)
        (work / "requests" / f"fuzz-{name}").write_bytes(text)
        argv = ["explain", "--policy", "policies/org.sbpolicy"]
        if what == "request":
            argv += ["--request", f"requests/fuzz-{name}"]
        else:
            argv += ["--request", "requests/git-status.json",
                     f"--{what}", f"requests/fuzz-{name}"]
        _clean(_invoke(argv, work), argv)


RUN_POLICY = 'policy "fuzz/run" version "1.0.0"\n\npermit tmp.use max_bytes 1MiB\n'
RUN_GRANT = {"tenant": "acme", "subject_id": "agent:1", "tool_name": "scratch", "call_id": "c1",
             "expires_at": 4_000_000_000_000, "capabilities": [{"kind": "tmp.use"}]}
RUN_MANIFEST = {"name": "scratch", "version": "1.0", "permissions": [{"kind": "tmp.use"}]}


@budget(150)
@given(st.data())
def test_run_on_hostile_requests(data: st.DataObject) -> None:
    name, text = data.draw(hostile_document(REQUESTS))
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        (work / "p.sbpolicy").write_text(RUN_POLICY)
        (work / "g.json").write_text(json.dumps(RUN_GRANT))
        (work / "m.json").write_text(json.dumps(RUN_MANIFEST))
        (work / name).write_bytes(text)
        argv = ["run", "--state-dir", "state", "--policy", "p.sbpolicy", "--grant", "g.json",
                "--manifest", "m.json", "--request", name]
        _clean(_invoke(argv, work), argv)


@budget(200)
@given(st.data())
def test_test_command_on_hostile_test_files(data: st.DataObject) -> None:
    name, text = data.draw(hostile_document(TEST_FILES))
    with tempfile.TemporaryDirectory() as tmp:
        work = _workdir(tmp)
        (work / "policies" / "fuzz.sbtest.yaml").write_bytes(text)
        argv = ["test", "policies/fuzz.sbtest.yaml"]
        _clean(_invoke(argv, work), argv)


@budget(150)
@given(st.sampled_from(sorted(POLICIES)), st.data())
def test_check_lint_fmt_on_hostile_policies(name: str, data: st.DataObject) -> None:
    text = data.draw(mutated(st.just(POLICIES[name])))
    with tempfile.TemporaryDirectory() as tmp:
        work = _workdir(tmp)
        (work / "policies" / name).write_bytes(text)
        for argv, stdin in ((["check", f"policies/{name}"], None),
                            (["lint", f"policies/{name}"], None),
                            (["fmt", "--check", f"policies/{name}"], None),
                            (["fmt", "-"], text)):
            _clean(_invoke(argv, work, stdin), argv)


_EVIDENCE_VALUE = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner,
                                                                max_size=3),
    max_leaves=8,
)
_EVIDENCE_KEYS = st.sampled_from(["type", "status", "error_code", "sandbox_backend",
                                  "sandbox_latency_ms", "sandbox_timed_out", "sandbox_degraded",
                                  "sandbox_degrade_reason"])


@budget(300)
@given(st.lists(st.dictionaries(_EVIDENCE_KEYS, _EVIDENCE_VALUE | st.sampled_from(
    ["begin", "end", "ok", "denied", "error"])), max_size=6),
    mutated(st.sampled_from(sorted(EVIDENCE.values()))))
def test_stats_on_hostile_evidence(records: list[dict[str, Any]], mutated_log: bytes) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        lines = "\n".join(json.dumps(r) for r in records) + "\n"
        (work / "a.jsonl").write_text(lines)
        (work / "b.jsonl").write_bytes(mutated_log)
        for fmt in ("text", "json"):
            argv = ["stats", "--format", fmt, "a.jsonl", "b.jsonl"]
            _clean(_invoke(argv, work), argv)


@budget(60)
@given(st.lists(st.sampled_from(["grant", "manifest", "request", "settings", "nope", "",
                                 "\x00", "--format", "-h"]), max_size=3))
def test_schema_with_any_names(names: list[str]) -> None:
    argv = ["schema", *names]
    _clean(_invoke(argv, Path.cwd()), argv)
