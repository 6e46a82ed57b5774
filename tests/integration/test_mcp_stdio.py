"""`policy-engine mcp` over stdio, driven by the official SDK's own client: list, allowed and
denied calls, malformed arguments, a cancelled long call, concurrent calls, evidence."""

from __future__ import annotations

import base64
import json
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client, types
from mcp.client.stdio import StdioServerParameters

from tests.integration.mcp_fixtures import (
    BEAT_SCRIPT,
    Setup,
    assert_beat_stopped,
    make_setup,
    wait_for_beat,
)
from tests.integration.servers import LoopbackServer, redirect, send

pytestmark = pytest.mark.integration


@pytest.fixture
def setup(tmp_path: Path) -> Setup:
    return make_setup(tmp_path)


@asynccontextmanager
async def connect(setup: Setup) -> AsyncIterator[Client]:
    params = StdioServerParameters(
        command=sys.executable, env=setup.env(),
        args=setup.mcp_args("--tenant", "acme", "--subject", "agent:builder-7"))
    async with Client(params, read_timeout_seconds=120) as client:
        yield client


def _error(result: Any) -> dict[str, Any]:
    assert result.is_error, result
    meta = result.meta or {}
    error: dict[str, Any] = meta["policy-engine/error"]
    assert result.content[0].text.startswith(f"{error['code']}: ")
    return error


def test_list_tools_maps_skills_with_schemas_and_hints(setup: Setup) -> None:
    async def main() -> None:
        async with connect(setup) as client:
            listed = (await client.list_tools()).tools
            by_name = {t.name: t for t in listed}
            assert set(by_name) == {"skill.shell.run", "skill.python.run", "skill.http.fetch",
                                    "skill.docs.browse", "skill.files.read"}
            manifest = json.loads((setup.skills / "files.read" / "manifest.json").read_text())
            reader = by_name["skill.files.read"]
            assert reader.input_schema == manifest["interface"]["inputs"]
            assert reader.output_schema == manifest["interface"]["outputs"]
            assert reader.annotations is not None
            assert reader.annotations.read_only_hint is True
            assert reader.annotations.destructive_hint is False
            assert reader.annotations.open_world_hint is False
            shell = by_name["skill.shell.run"].annotations
            assert shell is not None
            assert (shell.read_only_hint, shell.destructive_hint) == (False, True)
            fetch = by_name["skill.http.fetch"].annotations
            assert fetch is not None
            assert fetch.open_world_hint is True

    anyio.run(main)


def test_allowed_and_denied_calls_leave_evidence(setup: Setup) -> None:
    async def main() -> None:
        async with connect(setup) as client:
            ok = await client.call_tool("skill.files.read", {"path": "inputs/hello.txt"})
            assert not ok.is_error, ok
            assert ok.structured_content is not None
            assert base64.b64decode(ok.structured_content["bytes_b64"]) == b"hello\n"
            assert ok.structured_content["size"] == 6
            # UTF-8 bytes reach the model as text, not base64 (issue 28 item 7)
            assert ok.structured_content["text"] == "hello\n"
            assert [c.text for c in ok.content if isinstance(c, types.TextContent)] == \
                ["hello\n"]
            envelope = (ok.meta or {})["policy-engine/envelope_id"]
            assert [e["status"] for e in setup.ends(envelope)] == ["ok"]

            denied = await client.call_tool("skill.files.read",
                                            {"path": "inputs/secret/key.txt"})
            error = _error(denied)
            assert error["code"] == "SANDBOX.CAPABILITY_BLOCKED"
            assert "no-secret" in error["message"]
            assert "k3y" not in json.dumps(denied.model_dump(mode="json"))
            ends = setup.ends(error["envelope_id"])
            assert [(e["status"], e["error_code"]) for e in ends] == [
                ("denied", "SANDBOX.CAPABILITY_BLOCKED")]

            # `..` cannot climb out: the guard decides the normalized path
            escaped = await client.call_tool("skill.files.read",
                                             {"path": "inputs/../mcp.sbpolicy"})
            assert _error(escaped)["code"] in ("SANDBOX.CAPABILITY_BLOCKED",
                                               "SANDBOX.PERMISSION_DENY")

            ran = await client.call_tool("skill.shell.run",
                                         {"script": "echo hi > out.txt; cat out.txt; pwd"})
            assert not ran.is_error, ran
            assert ran.structured_content == {
                "exit_code": 0, "stdout": "hi\n/workspace/work\n", "stderr": "",
                "stdout_truncated": False, "stderr_truncated": False}
            end = setup.ends((ran.meta or {})["policy-engine/envelope_id"])[0]
            assert end["sandbox_backend"] == "docker"

    anyio.run(main)


def test_malformed_arguments_are_refused_with_a_json_pointer(setup: Setup) -> None:
    async def main() -> None:
        async with connect(setup) as client:
            wrong_type = _error(await client.call_tool("skill.files.read", {"path": 5}))
            assert wrong_type["code"] == "SCHEMA.VALIDATION_FAILED"
            assert wrong_type["http_status"] == 422
            assert wrong_type["pointer"] == "/path"
            missing = _error(await client.call_tool("skill.shell.run", {}))
            assert missing["pointer"] == ""
            assert "`script`" in missing["message"]
            secret = "s3cr3t-token-value"
            extra = _error(await client.call_tool("skill.files.read",
                                                  {"path": "inputs/hello.txt", "x": secret}))
            assert extra["pointer"] == ""
            bad_pattern = _error(await client.call_tool("skill.files.read", {"path": secret}))
            assert bad_pattern["pointer"] == "/path"
            assert secret not in bad_pattern["message"] + extra["message"]
            unknown = _error(await client.call_tool("skill.nope", {}))
            assert unknown["code"] == "SERVICE.NOT_FOUND"
            # each refusal left evidence (begin + denied end), never the value itself
            for refused in (wrong_type, missing, extra, bad_pattern):
                ends = setup.ends(refused["envelope_id"])
                assert [(e["status"], e["error_code"]) for e in ends] == [
                    ("denied", "SCHEMA.VALIDATION_FAILED")]
            begins = [r for r in setup.evidence() if r.get("type") == "begin"
                      and r["envelope_id"] == extra["envelope_id"]]
            assert (begins[0]["tenant"], begins[0]["tool_name"]) == ("acme", "files.read")

    anyio.run(main)
    logs = list(setup.state.rglob("*.jsonl"))
    assert logs
    assert all("s3cr3t-token-value" not in log.read_text() for log in logs)
    for log in logs:  # the hash chain still verifies with these records in it
        done = subprocess.run([sys.executable, "-m", "policy_engine.cli", "evidence",
                               "verify", str(log)], capture_output=True, text=True,
                              timeout=60, env=setup.env(), check=False)
        assert done.returncode == 0, done.stdout + done.stderr


def test_a_cancelled_long_call_stops_the_process_and_records_it(setup: Setup) -> None:
    async def main() -> None:
        async with connect(setup) as client:
            scope = anyio.CancelScope()

            async def call() -> None:
                with scope:
                    await client.call_tool("skill.shell.run",
                                           {"script": BEAT_SCRIPT.format(name="beat.txt")})

            async with anyio.create_task_group() as tg:
                tg.start_soon(call)
                beat = await wait_for_beat(setup.state, "beat.txt")  # it runs: cancel it
                scope.cancel()
            assert scope.cancelled_caught
            # the end record appears once the executor has stopped the container
            deadline = time.monotonic() + 30
            cancelled: list[dict[str, Any]] = []
            while time.monotonic() < deadline and not cancelled:
                cancelled = [r for r in setup.evidence() if r.get("type") == "end"
                             and r.get("sandbox_error_kind") == "cancelled"]
                await anyio.sleep(0.2)
            assert len(cancelled) == 1, setup.evidence()
            assert cancelled[0]["status"] == "error"
            # the process was stopped, not abandoned: it writes into the work directory it
            # had no more
            assert beat.parent in set(setup.state.rglob("projects/*/work"))
            await assert_beat_stopped(beat)
            # the session is still usable after the cancellation
            after = await client.call_tool("skill.files.read", {"path": "inputs/hello.txt"})
            assert not after.is_error

    anyio.run(main)


def test_concurrent_calls_each_get_their_own_decision(setup: Setup) -> None:
    results: dict[int, Any] = {}

    async def main() -> None:
        async with connect(setup) as client:
            async def one(i: int) -> None:
                if i % 4 == 3:
                    results[i] = await client.call_tool(
                        "skill.python.run", {"code": f"print({i} * 2)"})
                else:
                    path = "inputs/secret/key.txt" if i % 4 == 2 else "inputs/hello.txt"
                    results[i] = await client.call_tool("skill.files.read", {"path": path})

            async with anyio.create_task_group() as tg:
                for i in range(8):
                    tg.start_soon(one, i)

    anyio.run(main)
    envelopes = set()
    for i, result in results.items():
        if i % 4 == 2:
            error = _error(result)
            assert error["code"] == "SANDBOX.CAPABILITY_BLOCKED"
            envelopes.add(error["envelope_id"])
            continue
        assert not result.is_error, result
        if i % 4 == 3:
            assert result.structured_content["stdout"] == f"{i * 2}\n"
        envelopes.add((result.meta or {})["policy-engine/envelope_id"])
    assert len(envelopes) == 8
    for envelope in envelopes:
        assert len(setup.ends(envelope)) == 1


def test_stdio_needs_one_configured_tenant(setup: Setup) -> None:
    done = subprocess.run([sys.executable, *setup.mcp_args()], capture_output=True,
                          text=True, timeout=60, env=setup.env(), check=False)
    assert done.returncode == 2
    assert "--tenant and --subject" in done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize(("tenant", "subject", "message"), [
    ("../other", "agent:a", "tenant `../other` must match"),
    ("acme", "agent:\x1b[31m", "--subject must be 1-200 printable characters")])
def test_stdio_refuses_an_unsafe_tenant_or_subject(setup: Setup, tenant: str, subject: str,
                                                   message: str) -> None:
    done = subprocess.run([sys.executable, *setup.mcp_args("--tenant", tenant,
                                                          "--subject", subject)],
                          capture_output=True, text=True, timeout=60, env=setup.env(),
                          check=False)
    assert done.returncode == 2
    assert message in done.stderr


def test_a_broken_skill_stops_the_server_with_diagnostics(setup: Setup) -> None:
    manifest = setup.skills / "files.read" / "manifest.json"
    manifest.write_text(manifest.read_text().replace('"kind": "fs"', '"kind": "podman"'))
    done = subprocess.run([sys.executable, *setup.mcp_args("--tenant", "a", "--subject", "b")],
                          capture_output=True, text=True, timeout=60, env=setup.env(),
                          check=False)
    assert done.returncode == 2
    assert f"{manifest}:" in done.stderr
    assert "SBP431 /runtime/kind" in done.stderr


def test_http_fetch_reaches_only_what_skill_and_policy_both_allow(tmp_path: Path) -> None:
    routes = {"/ok": lambda h: send(h, 200, "text/plain", b"fetched body"),
              "/hop": redirect("/private"),
              "/private": lambda h: send(h, 200, "text/plain", b"must not be served")}
    with LoopbackServer(routes) as web:
        setup = make_setup(tmp_path, (
            f'permit "web" net.http hosts ["127.0.0.1"] schemes ["http"] ports [{web.port}]\n'
            '  methods ["GET"]\n'
            'forbid "no-private" net.http hosts ["127.0.0.1"]\n'
            '  when `request.path.startsWith("/private")`\n'))
        manifest = setup.skills / "http.fetch" / "manifest.json"
        doc = json.loads(manifest.read_text())
        doc["permissions"]["net"] = {"mode": "restricted", "hosts": ["127.0.0.1"],
                                     "schemes": ["http"], "ports": [web.port]}
        manifest.write_text(json.dumps(doc))

        async def main() -> None:
            async with connect(setup) as client:
                ok = await client.call_tool("skill.http.fetch", {"url": web.url("/ok")})
                assert not ok.is_error, ok
                body = ok.structured_content["body"]
                assert base64.b64decode(body["head_b64"]) == b"fetched body"
                assert ok.structured_content["status"] == 200
                hop = _error(await client.call_tool("skill.http.fetch",
                                                    {"url": web.url("/hop")}))
                assert hop["code"] in ("SANDBOX.CAPABILITY_BLOCKED", "SANDBOX.PERMISSION_DENY")
                # the skill allows only that port: another is refused before any connection
                other = _error(await client.call_tool(
                    "skill.http.fetch", {"url": f"http://127.0.0.1:{web.port + 1}/ok"}))
                assert other["code"] in ("SANDBOX.CAPABILITY_BLOCKED",
                                         "SANDBOX.PERMISSION_DENY")

        anyio.run(main)
        assert "/private" not in [path for _, path, _ in web.seen.requests]
        assert "/ok" in [path for _, path, _ in web.seen.requests]


def test_docs_browse_opens_an_allowed_page_in_the_browser(tmp_path: Path) -> None:
    page = b"<html><head><title>Guide</title></head><body><p>read the docs</p></body></html>"
    routes = {"/guide": lambda h: send(h, 200, "text/html", page),
              "/admin": lambda h: send(h, 200, "text/html", b"<p>must not be served</p>")}
    with LoopbackServer(routes) as web:
        setup = make_setup(tmp_path, (
            f'permit "docs" browser.use hosts ["127.0.0.1"] schemes ["http"] ports [{web.port}]'
            '\n  scopes [open, extract] when `request.path.startsWith("/guide")`\n'))
        manifest = setup.skills / "docs.browse" / "manifest.json"
        doc = json.loads(manifest.read_text())
        doc["permissions"]["net"] = {"mode": "restricted", "hosts": ["127.0.0.1"],
                                     "schemes": ["http"], "ports": [web.port]}
        manifest.write_text(json.dumps(doc))

        async def main() -> None:
            async with connect(setup) as client:
                opened = await client.call_tool("skill.docs.browse",
                                                {"url": web.url("/guide")})
                assert not opened.is_error, opened
                assert opened.structured_content["title"] == "Guide"
                assert "read the docs" in opened.structured_content["text"]
                refused = _error(await client.call_tool("skill.docs.browse",
                                                        {"url": web.url("/admin")}))
                assert refused["code"] in ("SANDBOX.CAPABILITY_BLOCKED",
                                           "SANDBOX.PERMISSION_DENY")

        anyio.run(main)
        paths = [path for _, path, _ in web.seen.requests]
        assert "/guide" in paths
        assert "/admin" not in paths


def test_an_operator_manifest_is_offered_as_a_guarded_op_tool(setup: Setup) -> None:
    reader = setup.root / "reader.json"
    reader.write_text(json.dumps({
        "name": "reader", "version": "1.0.0", "side_effects": ["Read"],
        "permissions": [{"kind": "fs.read", "paths": [f"{setup.root}/inputs/**"]},
                        {"kind": "fs.list", "paths": [f"{setup.root}/inputs/**"]}]}))
    params = StdioServerParameters(
        command=sys.executable, env=setup.env(),
        args=setup.mcp_args("--tenant", "acme", "--subject", "agent:ops",
                            "--manifest", str(reader)))

    async def main() -> None:
        async with Client(params, read_timeout_seconds=120) as client:
            tools = {t.name: t for t in (await client.list_tools()).tools}
            op = tools["op.reader"]
            assert op.annotations is not None
            assert op.annotations.read_only_hint is True
            kinds = {ref["$ref"].rsplit("/", 1)[1]
                     for ref in op.input_schema["properties"]["op"]["oneOf"]}
            assert kinds == {"FsReadOp", "FsListOp"}
            hello = str(setup.root / "inputs" / "hello.txt")
            ok = await client.call_tool("op.reader", {"op": {"kind": "fs.read", "path": hello}})
            assert not ok.is_error, ok
            assert base64.b64decode(ok.structured_content["bytes_b64"]) == b"hello\n"
            secret = str(setup.root / "inputs" / "secret" / "key.txt")
            denied = _error(await client.call_tool(
                "op.reader", {"op": {"kind": "fs.read", "path": secret}}))
            assert denied["code"] == "SANDBOX.CAPABILITY_BLOCKED"
            assert setup.ends(denied["envelope_id"])
            # a kind the manifest does not declare is not an op this tool takes
            write = _error(await client.call_tool(
                "op.reader", {"op": {"kind": "fs.write", "path": hello}}))
            assert (write["code"], write["pointer"]) == ("SCHEMA.VALIDATION_FAILED", "/op/kind")
            bad = _error(await client.call_tool(
                "op.reader", {"op": {"kind": "fs.read", "path": hello, "offset": -1}}))
            assert bad["pointer"] == "/op/offset"
            odd = _error(await client.call_tool("op.reader", {"op": {"kind": ["fs.read"]}}))
            assert odd["pointer"] == "/op/kind"

    anyio.run(main)


@pytest.mark.parametrize("launcher", [True, False])
def test_a_cancelled_call_in_a_warm_container_is_killed(setup: Setup, launcher: bool) -> None:
    config = setup.root / "engine.yaml"
    config.write_text(f"options:\n  docker:\n    mode: pool\n    pool_size: 1\n"
                      f"    pool_launcher: {str(launcher).lower()}\n")
    params = StdioServerParameters(
        command=sys.executable, env=setup.env(),
        args=setup.mcp_args("--tenant", "acme", "--subject", "agent:warm",
                            "--config", str(config)))

    async def main() -> None:
        async with Client(params, read_timeout_seconds=120) as client:
            # the pooled container's work directory is not the host's: cancel at 3 s, as a
            # client giving up would
            with anyio.move_on_after(3) as scope:
                await client.call_tool("skill.shell.run",
                                       {"script": BEAT_SCRIPT.format(name="beat.txt")})
            assert scope.cancelled_caught
            # the same session's container: had the first process survived, it would still be
            # appending to beat.txt in this work directory (absent: it never started)
            after = await client.call_tool("skill.shell.run", {
                "script": "test -e beat.txt || { echo absent; exit 0; }; "
                          "sleep 0.5; a=$(wc -c < beat.txt); sleep 1.5; b=$(wc -c < beat.txt); "
                          "test \"$a\" = \"$b\" && echo stopped || echo \"grew from $a to $b\""})
            assert not after.is_error, after
            assert after.structured_content["stdout"] in ("stopped\n", "absent\n"), \
                after.structured_content

    anyio.run(main)
