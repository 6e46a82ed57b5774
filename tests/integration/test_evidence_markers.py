"""No input value reaches evidence, logs or CLI output: a distinct marker in every input field of
every op kind, allowed and denied, run for real (sandboxed process, loopback server, Chromium, the
CLI), then looked for in the JSONL, every SQLite table and column, every file of the state
directory (spool and WAL included), the log records and the CLI's stdout and stderr.

Exempt, and only there: what an allowed op returns to its caller as content in its own
``result.out`` — the process's stdout (``out.stdout``), the response body's head
(``out.body.head_b64``, base64), the file's bytes (``out.bytes_b64``, base64), the page's text
and its own address (``out.text``, ``out.url`` of browser.nav). The same markers must not
appear anywhere else.
"""

from __future__ import annotations

import base64
import json
import logging
import secrets
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from policy_engine.compiler import compile_files
from policy_engine.config import EngineConfig
from policy_engine.model import (
    BrowserNavOp,
    ExecOp,
    FsReadOp,
    FsWriteOp,
    Grant,
    Manifest,
    NetHttpOp,
    ProcExecOp,
    Settings,
)
from policy_engine.orchestrator import Orchestrator, RunOutcome
from tests.integration.servers import LoopbackServer, send

pytestmark = pytest.mark.integration

_OPTIONS: dict[str, Any] = {"proc": {"env_allow": ["API_TOKEN"]}}
_EXEMPT_OUT = {"proc.exec": ("stdout",), "net.http": ("body",), "fs.read": ("bytes_b64",),
               "browser.nav": ("text", "url")}


class Markers:
    """One fresh marker per input field; ``all()`` is what must never leak."""

    def __init__(self) -> None:
        self.values: dict[str, str] = {}

    def __getitem__(self, field: str) -> str:
        if field not in self.values:
            self.values[field] = f"MK{field.upper()}{secrets.token_hex(5)}"
        return self.values[field]

    def needles(self) -> list[tuple[str, bytes]]:
        """Each marker as bytes and as base64: payloads (stdin, bodies, file bytes) travel
        base64-encoded, and each payload is exactly one marker, so a stored copy shows either way.
        """
        return [(name, form) for name, value in self.values.items()
                for form in (value.encode(), base64.b64encode(value.encode()))]


def _find(markers: Markers, blob: bytes, where: str,
          allowed: frozenset[str] = frozenset()) -> list[str]:
    return sorted({f"{name} in {where}" for name, needle in markers.needles()
                   if name not in allowed and needle in blob})


@pytest.fixture
def server(tmp_path: Path) -> Iterator[tuple[LoopbackServer, Markers]]:
    marks = Markers()
    routes = {
        "/data": lambda h: send(h, 200, "text/plain", marks["respbody"].encode()),
        "/page": lambda h: send(h, 200, "text/html", (
            f"<html><title>t</title><body><p>{marks['pagetext']}</p></body></html>").encode()),
    }
    with LoopbackServer(routes) as srv:
        yield srv, marks


def _setup(tmp: Path, port: int) -> tuple[Path, Grant, Manifest, Settings, Path]:
    ws = tmp / "ws"
    (ws / "work" / "deny").mkdir(parents=True)
    policy = tmp / "markers.sbpolicy"
    policy.write_text(
        'policy "t/markers" version "1.0.0"\n'
        "defaults {\n  timeout 30s\n  network on\n"
        "  limits { bytes_in 10MiB  bytes_out 1MiB  files 100  depth 3 }\n}\n"
        f'permit "ws-read" fs.read, fs.list paths ["{ws}/**"]\n'
        f'permit "ws-write" fs.write paths ["{ws}/work/**"]\n'
        f'forbid "no-deny-dir" fs.write paths ["{ws}/work/deny/**"]\n'
        'permit "py" proc.exec tool "python3" args ["-c", /.*/, /--token=.*/ ...]'
        ' env ["API_TOKEN"]\n'
        f'permit "fetch" net.http hosts ["127.0.0.1"] ports [{port}] schemes ["http"]'
        ' methods ["GET", "POST"]\n'
        f'permit "pages" browser.use hosts ["127.0.0.1"] ports [{port}] schemes ["http"]'
        " scopes [open, extract]\n"
        "require consent when `false`\n")
    perms: list[dict[str, Any]] = [
        {"kind": "fs.read", "paths": [f"{ws}/**"]}, {"kind": "fs.list", "paths": [f"{ws}/**"]},
        {"kind": "fs.write", "paths": [f"{ws}/work/**"]},
        {"kind": "proc.exec", "tool": "python3"},
        {"kind": "net.http", "hosts": ["127.0.0.1"], "ports": [port, port + 1],
         "schemes": ["http"], "methods": ["GET", "POST"]},
        {"kind": "browser.use", "hosts": ["127.0.0.1"], "ports": [port, port + 1],
         "schemes": ["http"], "scopes": ["open", "extract"]},
    ]
    manifest = Manifest.model_validate({
        "name": "mk", "version": "1.0.0", "permissions": perms, "network": "on",
        "side_effects": ["Process", "Read", "Write", "Network", "Browser"],
        "safety_class": "Low"})
    grant = Grant.model_validate({
        "tenant": "t", "subject_id": "agent:mk", "tool_name": "mk", "call_id": "c-mk",
        "capabilities": perms, "expires_at": 4_102_444_800_000})
    (tmp / "manifest.json").write_text(manifest.model_dump_json())
    (tmp / "grant.json").write_text(grant.model_dump_json())
    settings = Settings(root_fs=str(ws), tmp_dir=str(tmp / "scratch"))
    return ws, grant, manifest, settings, policy


def _ops(ws: Path, port: int, m: Markers) -> list[tuple[ExecOp, bool]]:
    """(op, expected to be allowed) with a marker in every input field."""
    script = f"import sys; sys.stdin.read(); print({m['stdout']!r})"
    b64 = lambda s: base64.b64encode(s.encode()).decode()  # noqa: E731
    (ws / "in.txt").write_text(m["fileread"])
    return [
        (ProcExecOp(tool="python3", args=("-c", script, f"--token={m['argv']}"),
                    env={"API_TOKEN": m["env"]}, stdin_b64=b64(m["stdin"])), True),
        (ProcExecOp(tool="python3", args=("-X", f"--token={m['argv_denied']}"),
                    env={"API_TOKEN": m["env_denied"]}, stdin_b64=b64(m["stdin_denied"])),
         False),
        (NetHttpOp(method="POST",
                   url=f"http://127.0.0.1:{port}/data"
                       f"?token={m['urlquery']}#{m['urlfrag']}",
                   headers={"Authorization": f"Bearer {m['header']}"},
                   body_b64=b64(m["reqbody"])), True),
        (NetHttpOp(method="POST",
                   url=f"http://u:{m['urlpass_denied']}@127.0.0.1:{port + 1}/data"
                       f"?token={m['urlquery_denied']}#{m['urlfrag_denied']}",
                   headers={"Authorization": f"Bearer {m['header_denied']}"},
                   body_b64=b64(m["reqbody_denied"])), False),
        # user info in a URL is refused by the guard (a denial must not record it either)
        (NetHttpOp(url=f"http://u{m['urluser']}:{m['urlpass']}@127.0.0.1:{port}/data"), False),
        (FsWriteOp(path=str(ws / "work" / "out.txt"), bytes_b64=b64(m["filewrite"]),
                   overwrite=True), True),
        (FsWriteOp(path=str(ws / "work" / "deny" / "out.txt"),
                   bytes_b64=b64(m["filewrite_denied"])), False),
        (FsReadOp(path=str(ws / "in.txt")), True),
    ]


def _browser_ops(port: int, m: Markers) -> list[tuple[ExecOp, bool]]:
    return [
        (BrowserNavOp(url=f"http://127.0.0.1:{port}/page"
                          f"?token={m['brquery']}#{m['brfrag']}"), True),
        (BrowserNavOp(url=f"http://b:{m['brpass']}@127.0.0.1:{port}/page"), False),
        (BrowserNavOp(url=f"http://127.0.0.1:{port + 1}/page"
                          f"?token={m['brquery_denied']}#{m['brfrag_denied']}"), False),
    ]


def _outcome_leaks(m: Markers, op: ExecOp, out: RunOutcome) -> list[str]:
    data = out.to_json()
    result_out = dict(data["result"]["out"])
    for key in _EXEMPT_OUT.get(op.kind, ()):
        result_out.pop(key, None)
    data["result"]["out"] = result_out
    return _find(m, json.dumps(data).encode(), f"{op.kind} outcome")


def _state_leaks(m: Markers, state: Path) -> list[str]:
    found: list[str] = []
    files = [p for p in state.rglob("*") if p.is_file()]
    assert any(p.name == "evidence.jsonl" for p in files)
    for path in files:
        found += _find(m, path.read_bytes(), str(path.relative_to(state)))
    db = sqlite3.connect(state / "evidence" / "evidence.sqlite")
    try:
        tables = [r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type='table'")]
        assert {"evidence_records", "sandbox_execs"} <= set(tables)
        for table in tables:
            for row in db.execute(f'SELECT * FROM "{table}"'):  # noqa: S608 -- names from sqlite
                found += _find(m, repr(row).encode(), f"sqlite {table}")
    finally:
        db.close()
    return found


def _config(tmp: Path) -> EngineConfig:
    return EngineConfig(state_dir=tmp / "state", budget_meter="memory",
                        evidence_sinks=("jsonl", "sqlite"), options=_OPTIONS)


def _run_all(tmp: Path, ops: list[tuple[ExecOp, bool]], settings: Settings, grant: Grant,
             manifest: Manifest, policy: Path, m: Markers) -> list[str]:
    leaks: list[str] = []
    with Orchestrator(compile_files([policy]), config=_config(tmp)) as orch:
        for op, allowed in ops:
            out = orch.run(grant, manifest, op, settings=settings)
            assert out.decision.allowed is allowed, (op.kind, out.decision)
            if allowed:
                assert out.result.ok, (op.kind, out.result)
                # the content the call returns is really there, where it is exempt
                returned = json.dumps(out.result.out)
                expected = {"proc.exec": m["stdout"], "browser.nav": m["pagetext"],
                            "fs.read": base64.b64encode(m["fileread"].encode()).decode(),
                            "net.http": base64.b64encode(m["respbody"].encode()).decode()}
                assert expected.get(op.kind, "") in returned, (op.kind, returned[:500])
            leaks += _outcome_leaks(m, op, out)
    return leaks


def test_no_marker_leaves_the_orchestrator(
        tmp_path: Path, server: tuple[LoopbackServer, Markers],
        caplog: pytest.LogCaptureFixture) -> None:
    srv, m = server
    ws, grant, manifest, settings, policy = _setup(tmp_path, srv.port)
    caplog.set_level(logging.DEBUG)
    ops = _ops(ws, srv.port, m)
    leaks = _run_all(tmp_path, ops, settings, grant, manifest, policy, m)
    # the calls really happened: the server saw the allowed request with its header and body
    assert any(m["header"] in h.get("Authorization", "") for _c, _p, h in srv.seen.requests)
    assert (ws / "work" / "out.txt").read_text() == m["filewrite"]
    leaks += _state_leaks(m, tmp_path / "state")
    leaks += _find(m, caplog.text.encode(), "log records")
    leaks += _find(m, "\n".join(repr(r.__dict__) for r in caplog.records).encode(), "log args")
    assert not leaks, leaks


def test_no_marker_leaves_a_browser_call(
        tmp_path: Path, server: tuple[LoopbackServer, Markers],
        caplog: pytest.LogCaptureFixture) -> None:
    srv, m = server
    _ws, grant, manifest, settings, policy = _setup(tmp_path, srv.port)
    caplog.set_level(logging.DEBUG)
    leaks = _run_all(tmp_path, _browser_ops(srv.port, m), settings, grant, manifest, policy, m)
    assert any(p.startswith("/page") for _c, p, _h in srv.seen.requests)
    leaks += _state_leaks(m, tmp_path / "state")
    leaks += _find(m, caplog.text.encode(), "log records")
    assert not leaks, leaks


def _cli(*args: str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run([sys.executable, "-m", "policy_engine.cli", *args],
                          capture_output=True, timeout=120, check=False)


def test_no_marker_in_cli_run_explain_and_stats(
        tmp_path: Path, server: tuple[LoopbackServer, Markers]) -> None:
    srv, m = server
    ws, _grant, _manifest, settings, policy = _setup(tmp_path, srv.port)
    config = tmp_path / "engine.json"
    config.write_text(json.dumps({"state_dir": str(tmp_path / "state"),
                                  "evidence_sinks": ["jsonl", "sqlite"],
                                  "budget_meter": "memory", "options": _OPTIONS}))
    leaks: list[str] = []
    for i, (op, allowed) in enumerate(_ops(ws, srv.port, m)):
        request = tmp_path / f"req-{i}.json"
        request.write_text(json.dumps({
            "op": op.model_dump(mode="json"), "settings": settings.model_dump(mode="json"),
            "manifest": "manifest.json", "grant": "grant.json"}))
        for fmt in ("text", "json"):
            ran = _cli("run", "--policy", str(policy), "--config", str(config),
                       "--request", str(request), "--format", fmt)
            shown = (ran.stdout + ran.stderr).decode()[:1500]
            assert ran.returncode == (0 if allowed else 1), shown
            out = ran.stdout
            if allowed and op.kind in _EXEMPT_OUT:  # the content the op itself returns
                exempt = {"proc.exec": {"stdout"}, "net.http": {"respbody"},
                          "fs.read": {"fileread"}}.get(op.kind, set())
                leaks += _find(m, out, f"run {op.kind} stdout", frozenset(exempt))
            else:
                leaks += _find(m, out, f"run {op.kind} stdout")
            leaks += _find(m, ran.stderr, f"run {op.kind} stderr")
            explained = _cli("explain", "--policy", str(policy), "--request", str(request),
                             "--format", fmt)
            assert explained.returncode == 0, explained.stderr.decode()[-2000:]
            leaks += _find(m, explained.stdout + explained.stderr, f"explain {op.kind}")
    # the `-- TOOL ARGS...` form: argv straight from the command line, allowed and denied
    for args, code in ((("-c", "print(1)", f"--token={m['argv_cli']}"), 0),
                       (("-X", f"--token={m['argv_cli_denied']}"), 1)):
        ran = _cli("run", "--policy", str(policy), "--config", str(config),
                   "--manifest", str(tmp_path / "manifest.json"),
                   "--grant", str(tmp_path / "grant.json"), "--", "python3", *args)
        assert ran.returncode == code, (ran.stdout + ran.stderr).decode()[:1500]
        leaks += _find(m, ran.stdout + ran.stderr, "run -- python3")
    for fmt in ("text", "json"):
        stats = _cli("stats", str(tmp_path / "state" / "evidence" / "evidence.jsonl"),
                     "--format", fmt)
        assert stats.returncode == 0, stats.stderr.decode()[-2000:]
        leaks += _find(m, stats.stdout + stats.stderr, "stats")
    leaks += _state_leaks(m, tmp_path / "state")
    assert not leaks, leaks
