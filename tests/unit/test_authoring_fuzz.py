"""No input makes `check`, `lint`, `fmt` or `test` print a traceback: fuzzed example policies.

test_dsl_fuzz.py fuzzes the parser as a library; this drives the commands a user runs, through
the real click CLI, with mutated copies of the example policies and of a policy test file.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

from click.testing import CliRunner, Result
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from policy_engine.cli.main import cli

ROOT = Path(__file__).resolve().parents[2]
POLICIES = ROOT / "examples" / "policies"
SEEDS = {p.name: p.read_text(encoding="utf-8") for p in sorted(POLICIES.glob("*.sbpolicy"))}
MANIFESTS = ROOT / "examples" / "manifests"
SEEDS["file-editor.sbpolicy"] = (MANIFESTS / "file-editor.sbpolicy").read_text(encoding="utf-8")

TEST_FILE = f"""\
policy: org.sbpolicy
manifest: {ROOT / "examples" / "manifests" / "shell.json"}
grant: {ROOT / "examples" / "grants" / "shell-agent.json"}
now_ms: 1795000000000
cases:
  - name: git status is allowed
    op: {{kind: proc.exec, tool: git, args: [status]}}
    want_decision: allow
    want_rule: git-readonly
  - name: force push is refused
    op: {{kind: proc.exec, tool: git, args: [push, --force]}}
    want_decision: deny
    want_code: SANDBOX.CAPABILITY_BLOCKED
"""

DIAG_ID = re.compile(r"\bSBP\d{3}\b")
LOCATION = re.compile(r"\S+:\d+:\d+")

# ---- mutations ---------------------------------------------------------------------------------

_TOKENS = re.compile(r"\S+")
_NASTY = st.sampled_from(["\x00", "\r", "\n", "\t", '"', "`", "/", "\\", "#", "{", "}", "[", "]",
                          "|", "...", "\ufeff", "\u202e", "é", "😀", "\x7f", "%s", ":", "- "])


def _flip(text: str, i: int, ch: str) -> str:
    i %= len(text) + 1
    return text[:i] + ch + text[i + 1:]


def _delete(text: str, i: int, n: int) -> str:
    i %= len(text) + 1
    return text[:i] + text[i + n:]


def _duplicate_line(text: str, i: int) -> str:
    lines = text.split("\n")
    i %= len(lines)
    return "\n".join(lines[: i + 1] + lines[i:])


def _swap_tokens(text: str, i: int, j: int) -> str:
    spans = [m.span() for m in _TOKENS.finditer(text)]
    if len(spans) < 2:
        return text
    (a0, a1), (b0, b1) = sorted((spans[i % len(spans)], spans[j % len(spans)]))
    if a1 > b0:
        return text
    return text[:a0] + text[b0:b1] + text[a1:b0] + text[a0:a1] + text[b1:]


def _truncate(text: str, i: int) -> str:
    return text[: i % (len(text) + 1)]


def _insert(text: str, i: int, s: str) -> str:
    i %= len(text) + 1
    return text[:i] + s + text[i:]


def _crlf(text: str) -> str:
    return text.replace("\n", "\r\n")


_POS = st.integers(0, 10_000)
MUTATION: st.SearchStrategy[Callable[[str], str]] = st.one_of(
    st.builds(lambda i, c: lambda t: _flip(t, i, c), _POS, _NASTY | st.characters()),
    st.builds(lambda i, n: lambda t: _delete(t, i, n), _POS, st.integers(1, 60)),
    st.builds(lambda i: lambda t: _duplicate_line(t, i), _POS),
    st.builds(lambda i, j: lambda t: _swap_tokens(t, i, j), _POS, _POS),
    st.builds(lambda i: lambda t: _truncate(t, i), _POS),
    st.builds(lambda i, s: lambda t: _insert(t, i, s), _POS, st.text(max_size=12)),
    st.just(_crlf),
)


@st.composite
def mutated(draw: st.DrawFn, seed_text: st.SearchStrategy[str]) -> bytes:
    """A seed text put through 1-4 mutations, then maybe a raw byte flip (invalid UTF-8)."""
    text = draw(seed_text)
    for mutation in draw(st.lists(MUTATION, min_size=1, max_size=4)):
        text = mutation(text)
    data = text.encode("utf-8", errors="surrogatepass")
    if data and draw(st.integers(0, 9)) == 0:
        i = draw(st.integers(0, len(data) - 1))
        data = data[:i] + bytes([draw(st.integers(0x80, 0xFF))]) + data[i + 1:]
    return data


# ---- running and checking ------------------------------------------------------------------

def _invoke(argv: list[str], cwd: Path, stdin: bytes | None = None) -> Result:
    # commands take paths relative to the directory they run in, as a user's shell would
    old = Path.cwd()
    os.chdir(cwd)
    try:
        return CliRunner().invoke(cli, argv, input=stdin, catch_exceptions=True)
    finally:
        os.chdir(old)


def _no_traceback(result: Result, argv: list[str]) -> str:
    output = result.output
    where = f"`policy-engine {' '.join(argv)}` exited {result.exit_code}:\n{output[-2000:]}"
    assert result.exception is None or isinstance(result.exception, SystemExit), (
        f"{where}\nraised {result.exception!r}")
    assert "Traceback (most recent call last)" not in output, where
    assert result.exit_code in (0, 1, 2), where
    return where


def _has_location(output: str, fmt: str) -> bool:
    """Whether the output names a diagnostic ID and a line and column, in the format's terms."""
    if fmt in ("text", "github"):
        github = re.search(r"file=[^,]+,line=\d+,col=\d+", output) is not None
        return DIAG_ID.search(output) is not None and (LOCATION.search(output) is not None
                                                         or github)
    data = json.loads(output)
    if fmt == "json":
        return any(DIAG_ID.fullmatch(str(d.get("id"))) and d.get("line") and d.get("column")
                   for d in data.get("findings", data.get("diagnostics", [])))
    results = [r for run in data["runs"] for r in run["results"]]
    return any(DIAG_ID.fullmatch(str(r.get("ruleId"))) and
               r["locations"][0]["physicalLocation"]["region"].get("startLine")
               for r in results)


def _check_policy_commands(workdir: Path, name: str, data: bytes) -> None:
    (workdir / name).write_bytes(data)
    runs: list[tuple[list[str], str, bytes | None]] = [
        (["check", name], "text", None),
        *[(["lint", "--format", fmt, name], fmt, None)
          for fmt in ("text", "json", "sarif", "github")],
        (["fmt", "--check", name], "text", None),
        (["fmt", "-"], "text", data),
    ]
    for argv, fmt, stdin in runs:
        result = _invoke(argv, workdir, stdin)
        where = _no_traceback(result, argv)
        if result.exit_code == 2:
            assert _has_location(result.output, fmt), f"exit 2 without an ID and place: {where}"
        if result.exit_code != 0 and argv[0] in ("check", "lint"):
            assert DIAG_ID.search(result.output), f"a failure without a diagnostic ID: {where}"


def _workdir() -> tempfile.TemporaryDirectory[str]:
    tmp = tempfile.TemporaryDirectory()
    for src in POLICIES.glob("*.sbpolicy"):
        shutil.copy(src, Path(tmp.name) / src.name)
    return tmp


@settings(max_examples=15, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(st.sampled_from(sorted(SEEDS)), st.data())
def test_mutated_policies_never_make_a_command_print_a_traceback(
    name: str, data: st.DataObject,
) -> None:
    text = data.draw(mutated(st.just(SEEDS[name])))
    with _workdir() as tmp:
        _check_policy_commands(Path(tmp), name, text)


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mutated(st.just(SEEDS["org.sbpolicy"])), st.booleans())
def test_policy_tests_of_a_mutated_policy_never_traceback(policy: bytes, json_out: bool) -> None:
    with _workdir() as tmp:
        work = Path(tmp)
        (work / "org.sbpolicy").write_bytes(policy)
        (work / "org.sbtest.yaml").write_text(TEST_FILE, encoding="utf-8")
        argv = ["test", "--format", "json" if json_out else "text", "--junit", "j.xml", "."]
        result = _invoke(argv, work)
        where = _no_traceback(result, argv)
        if result.exit_code == 2 and not json_out:
            assert DIAG_ID.search(result.output), where
            assert LOCATION.search(result.output), where


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mutated(st.just(TEST_FILE)))
def test_mutated_test_files_never_traceback(test_file: bytes) -> None:
    with _workdir() as tmp:
        work = Path(tmp)
        (work / "org.sbtest.yaml").write_bytes(test_file)
        argv = ["test", "--coverage", "org.sbtest.yaml"]
        result = _invoke(argv, work)
        where = _no_traceback(result, argv)
        if result.exit_code == 2:
            assert DIAG_ID.search(result.output), where
            assert LOCATION.search(result.output), where


def test_the_mutations_really_mutate() -> None:
    org = SEEDS["org.sbpolicy"]
    assert _crlf(org).count("\r\n") == org.count("\n")
    assert _truncate(org, 10) == org[:10]
    assert _duplicate_line("a\nb\nc", 1) == "a\nb\nb\nc"
    assert _swap_tokens("permit fs.read", 0, 1) == "fs.read permit"
    assert _delete("abcdef", 1, 2) == "adef"
    assert _flip("abc", 1, "\x00") == "a\x00c"
    assert _insert("ac", 1, "b") == "abc"
