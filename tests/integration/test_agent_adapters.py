"""The LangChain tools and the OpenAI Agents SDK function tools over a session of the real
service (a subprocess, real bubblewrap), called directly as the frameworks call them (no
model): answers as text, variables kept between calls, refusals as PolicyRefusal."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import anyio
import pytest
from agents import FunctionTool
from agents.tool_context import ToolContext

from policy_engine.client import Client, PolicyRefusal
from policy_engine.client.langchain_tools import langchain_tools
from policy_engine.client.openai_agents_tools import openai_agents_tools
from tests.integration.service_server import Service, add_token, serving

pytestmark = pytest.mark.integration
RISKY = "import subprocess\nsubprocess.run(['id'])"  # needs a container in permissive mode


@pytest.fixture(scope="module")
def svc(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    with serving(tmp_path_factory.mktemp("adapters"), "--security-mode",
                 "permissive") as service:
        yield service


@pytest.fixture
def session(svc: Service) -> Iterator[tuple[Client, str]]:
    with Client(svc.url, add_token(svc.state, "acme", "agent:tools")) as client:
        s = client.create_session(backend="proc-bwrap")
        yield client, s.session_id
        client.delete_session(s.session_id)


def test_langchain_tools_run_code_and_files_in_the_session(
        session: tuple[Client, str]) -> None:
    client, sid = session
    tools = {t.name: t for t in langchain_tools(client, sid)}
    assert set(tools) == {"run_code", "read_file", "write_file"}
    assert set(tools["run_code"].args) == {"code", "language"}
    assert tools["run_code"].invoke({"code": "x = 21\nprint(x)"}) == "21\n\n[exit code 0]"
    assert tools["run_code"].invoke({"code": "print(x * 2)"}).startswith("42\n")  # kept
    assert tools["write_file"].invoke({"path": "notes/a.txt", "content": "héllo"}) == \
        "wrote 6 bytes to notes/a.txt"
    assert tools["read_file"].invoke({"path": "notes/a.txt"}) == "héllo"
    assert "cat: nope" in tools["run_code"].invoke({"code": "cat nope", "language": "shell"})
    failed = tools["run_code"].invoke({"code": "raise SystemExit(3)"})
    assert failed.endswith("[exit code 3]")  # a program that failed: its output, no refusal
    with pytest.raises(PolicyRefusal) as risky:
        tools["run_code"].invoke({"code": RISKY})
    assert risky.value.refusal.code == "SANDBOX.CAPABILITY_BLOCKED"
    assert risky.value.refusal.refused_by == "backend"
    with pytest.raises(PolicyRefusal) as missing:
        tools["read_file"].invoke({"path": "no/such.txt"})
    assert (missing.value.refusal.code, missing.value.refusal.http_status) == \
        ("TOOL.NOT_FOUND", 404)  # a missing file, as every face says it
    told = {t.name: t for t in langchain_tools(client, sid, on_refusal="tell_model")}
    assert told["read_file"].invoke({"path": "no/such.txt"}).startswith(
        "refused: TOOL.NOT_FOUND: ")


def _invoke(tool: FunctionTool, args: dict[str, Any]) -> Any:
    raw = json.dumps(args)

    async def call() -> Any:
        ctx = ToolContext(context=None, tool_name=tool.name, tool_call_id="call-1",
                          tool_arguments=raw)
        return await tool.on_invoke_tool(ctx, raw)

    return anyio.run(call)


def test_openai_agents_function_tools_in_the_session(session: tuple[Client, str]) -> None:
    client, sid = session
    tools = {t.name: t for t in openai_agents_tools(client, sid)}
    assert set(tools) == {"run_code", "read_file", "write_file"}
    schema = tools["write_file"].params_json_schema
    assert schema["required"] == ["path", "content"]
    assert schema["properties"]["path"]["description"] == "relative to the session workspace"
    assert _invoke(tools["run_code"], {"code": "y = 5", "language": "python"}) == \
        "[exit code 0]"
    assert _invoke(tools["run_code"], {"code": "print(y + 1)", "language": "python"}) == \
        "6\n\n[exit code 0]"
    _invoke(tools["write_file"], {"path": "out.txt", "content": "from agents"})
    assert _invoke(tools["read_file"], {"path": "out.txt"}) == "from agents"
    assert client.download(sid, "out.txt") == b"from agents"  # the session's own file
    with pytest.raises(PolicyRefusal) as risky:
        _invoke(tools["run_code"], {"code": RISKY, "language": "python"})
    assert risky.value.refusal.code == "SANDBOX.CAPABILITY_BLOCKED"
    told = {t.name: t for t in openai_agents_tools(client, sid, on_refusal="tell_model")}
    assert _invoke(told["run_code"], {"code": RISKY, "language": "python"}).startswith(
        "refused: SANDBOX.CAPABILITY_BLOCKED: ")
