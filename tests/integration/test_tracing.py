"""OpenTelemetry spans of real calls, read back with the SDK's in-memory exporter: the HTTP
face's server span under the caller's W3C traceparent, then consent and the orchestrator's run
with decide, execute and evidence below it; the same through the MCP face (`_meta`)."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx
import httpx2
import pytest
import uvicorn
from fastapi import FastAPI
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from policy_engine import tracing
from policy_engine.compiler import compile_files
from policy_engine.compiler.loaders import load_manifest
from policy_engine.config import EngineConfig
from policy_engine.confirm.services import AutoConfirmation
from policy_engine.mcp.ops import OpTool
from policy_engine.mcp.server import build_server
from policy_engine.mcp.transports import fixed_principal, http_app, token_principal
from policy_engine.model import Settings
from policy_engine.orchestrator import Orchestrator
from policy_engine.runcode.manager import OrchestratorPool
from policy_engine.service.app import asgi_app, open_engine
from policy_engine.service.config import ServiceConfig
from policy_engine.service.fastpath import FastPath
from policy_engine.skills.invoke import SkillInvoker
from policy_engine.tokens import TokenStore
from tests.integration.service_server import POLICY, grant, manifest

pytestmark = pytest.mark.integration

TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT = "00f067aa0ba902b7"
TRACEPARENT = f"00-{TRACE}-{PARENT}-01"


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracing.use(provider)
    try:
        yield exporter
    finally:
        tracing.use(None)
        provider.shutdown()


def _setup(root: Path) -> tuple[ServiceConfig, Path]:
    (root / "data" / "secret").mkdir(parents=True)
    (root / "data" / "hello.txt").write_text("hello\n")
    (root / "data" / "secret" / "key.txt").write_text("k3y\n")
    policy = root / "svc.sbpolicy"
    policy.write_text(POLICY.format(root=root, ws=root / "workspace"))
    manifests = {}
    for name, fields in (("reader", {}), ("reader-high", {"safety_class": "High"})):
        path = root / f"{name}.json"
        path.write_text(json.dumps({**manifest(root), "name": name, **fields}))
        manifests[name] = load_manifest(path)
    config = ServiceConfig(policyset=compile_files([policy]),
                           engine=EngineConfig(state_dir=root / "state"),
                           workspace_root=root / "workspace", manifests=manifests,
                           confirmation=AutoConfirmation(),
                           op_settings=Settings(root_fs=str(root)))
    return config, policy


def _tree(finished: tuple[ReadableSpan, ...]) -> dict[str, list[ReadableSpan]]:
    by_name: dict[str, list[ReadableSpan]] = {}
    for s in finished:
        by_name.setdefault(s.name, []).append(s)
    return by_name


def _parent_of(child: ReadableSpan, parent: ReadableSpan) -> bool:
    return child.parent is not None and parent.context is not None and (
        child.parent.span_id == parent.context.span_id)


def _no_secrets(finished: tuple[ReadableSpan, ...], *secrets: str) -> None:
    for s in finished:
        for value in (s.attributes or {}).values():
            for secret in secrets:
                assert secret not in str(value), (s.name, value)


def test_http_calls_leave_a_span_tree_under_the_callers_traceparent(
        tmp_path: Path, spans: InMemorySpanExporter) -> None:
    config, _ = _setup(tmp_path)
    engine = open_engine(config)
    token, _ = engine.tokens.add("acme", "agent:alice")
    app: Any = asgi_app(config, engine)
    fastapi_app = app
    while not isinstance(fastapi_app, FastAPI):  # below the middlewares
        fastapi_app = fastapi_app.app
    high = {"op": {"kind": "fs.read", "path": f"{tmp_path}/data/hello.txt"},
            "grant": grant("acme", "agent:alice", tmp_path, tool_name="reader-high"),
            "manifest": "reader-high"}
    secret = {"op": {"kind": "fs.read", "path": f"{tmp_path}/data/secret/key.txt"},
              "grant": grant("acme", "agent:alice", tmp_path), "manifest": "reader"}

    async def calls() -> list[int]:
        async with fastapi_app.router.lifespan_context(fastapi_app):
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://svc",
                                         headers={"Authorization": f"Bearer {token}"}) as c:
                ok = await c.post("/v1/ops", json=high, headers={"traceparent": TRACEPARENT})
                denied = await c.post("/v1/ops", json=secret)
                return [ok.status_code, denied.status_code]

    assert asyncio.run(calls()) == [200, 403]
    finished = spans.get_finished_spans()
    by = _tree(finished)
    servers = by["POST /v1/ops"]
    assert len(servers) == 2
    first, second = servers
    assert first.kind is SpanKind.SERVER
    assert first.context is not None
    assert f"{first.context.trace_id:032x}" == TRACE
    assert first.parent is not None
    assert f"{first.parent.span_id:016x}" == PARENT
    assert first.parent.is_remote
    assert (first.attributes or {})["http.route"] == "/v1/ops"
    assert (first.attributes or {})["http.response.status_code"] == 200
    assert second.parent is None  # no traceparent: a new trace
    # face → gateway → run; the run decides once, asks consent about that decision, then
    # writes the begin record, executes and writes the end record
    gateway = next(s for s in by["policy_engine.gateway"] if _parent_of(s, first))
    assert (gateway.attributes or {})["policy_engine.consent.asked"] is True
    run = next(s for s in by["policy_engine.run"] if _parent_of(s, gateway))
    consent = next(s for s in by["policy_engine.consent"] if _parent_of(s, run))
    assert (consent.attributes or {})["policy_engine.consent.approved"] is True
    run_attrs = run.attributes or {}
    assert run_attrs["policy_engine.tenant"] == "acme"
    assert run_attrs["policy_engine.decision"] == "allow"
    assert run_attrs["policy_engine.backend"] == "fs"
    assert run_attrs["policy_engine.rule"] == "read-data"
    below = [s.name for s in sorted((s for s in finished if _parent_of(s, run)),
                                    key=lambda s: s.start_time or 0)]
    # a contained read (fs.read) writes its begin and end records in one append after it
    # (docs/operations.md "One append for contained reads")
    assert below == ["policy_engine.decide", "policy_engine.consent", "policy_engine.execute",
                     "policy_engine.evidence"]
    appended = next(s for s in by["policy_engine.evidence"] if _parent_of(s, run))
    assert (appended.attributes or {})["policy_engine.record"] == "begin+end"
    decide = next(s for s in by["policy_engine.decide"] if _parent_of(s, run))
    assert (decide.attributes or {})["policy_engine.rule"] == "read-data"
    execute = next(s for s in by["policy_engine.execute"] if _parent_of(s, run))
    assert (execute.attributes or {})["policy_engine.backend"] == "fs"

    refused_gateway = next(s for s in by["policy_engine.gateway"] if _parent_of(s, second))
    assert (refused_gateway.attributes or {})["policy_engine.refused_by"] == "policy"
    refused = next(s for s in by["policy_engine.run"] if _parent_of(s, refused_gateway))
    assert (refused.attributes or {})["policy_engine.code"] == "SANDBOX.CAPABILITY_BLOCKED"
    assert (refused.attributes or {})["policy_engine.rule"] == "no-secret"
    assert not [s for s in finished if s.name == "policy_engine.execute"
                and _parent_of(s, refused)]  # a denial never reaches an executor
    _no_secrets(finished, token, "hello.txt", "key.txt", "k3y", str(tmp_path))


def test_mcp_calls_honour_the_traceparent_in_meta(
        tmp_path: Path, spans: InMemorySpanExporter) -> None:
    config, _ = _setup(tmp_path)
    engine = replace(config.engine)
    orch = Orchestrator(config.policyset, config=engine)
    pool = OrchestratorPool(config.policyset, engine)
    invoker = SkillInvoker({}, config.policyset, engine, fs_root=str(tmp_path),
                           orchestrator=orch, pool=pool)
    server = build_server(invoker, fixed_principal("acme", "agent:alice"),
                          (OpTool(config.manifests["reader"]),))
    read = {"op": {"kind": "fs.read", "path": f"{tmp_path}/data/hello.txt"}}

    async def call() -> Any:
        async with Client(server) as client:
            return await client.call_tool("op.reader", read, meta={"traceparent": TRACEPARENT})

    try:
        result = asyncio.run(call())
    finally:
        pool.close()
        orch.close()
    assert result.is_error is False, result
    finished = spans.get_finished_spans()
    by = _tree(finished)
    face = by["mcp tools/call"][0]
    assert face.context is not None
    assert f"{face.context.trace_id:032x}" == TRACE
    assert face.parent is not None
    assert f"{face.parent.span_id:016x}" == PARENT
    assert (face.attributes or {})["mcp.tool"] == "op.reader"
    gateway = next(s for s in by["policy_engine.gateway"] if _parent_of(s, face))
    run = next(s for s in by["policy_engine.run"] if _parent_of(s, gateway))
    assert (run.attributes or {})["policy_engine.decision"] == "allow"
    assert [s.name for s in finished if _parent_of(s, run)] == [
        "policy_engine.decide", "policy_engine.execute", "policy_engine.evidence"]
    _no_secrets(finished, "hello.txt", str(tmp_path))


def test_without_a_tracer_provider_nothing_is_recorded_and_calls_run(tmp_path: Path) -> None:
    assert not tracing.enabled()
    with tracing.span("x", {"a": 1}) as sp:
        assert sp is tracing.NO_SPAN
    config, _ = _setup(tmp_path)
    engine = open_engine(config)
    try:  # no middleware at all when neither metrics nor tracing is on
        assert isinstance(asgi_app(config, engine), FastPath)  # the first of the app's own
    finally:
        engine.close()


def test_mcp_over_http_honours_the_traceparent_header(
        tmp_path: Path, spans: InMemorySpanExporter) -> None:
    config, _ = _setup(tmp_path)
    engine = config.engine
    tokens = TokenStore(engine.state_dir / "tokens.sqlite")
    token, _ = tokens.add("acme", "agent:alice")
    orch = Orchestrator(config.policyset, config=engine)
    pool = OrchestratorPool(config.policyset, engine)
    invoker = SkillInvoker({}, config.policyset, engine, fs_root=str(tmp_path),
                           orchestrator=orch, pool=pool)
    app = http_app(build_server(invoker, token_principal(tokens),
                                (OpTool(config.manifests["reader"]),)), tokens, host="127.0.0.1")
    sock = socket.create_server(("127.0.0.1", 0))
    url = f"http://127.0.0.1:{sock.getsockname()[1]}/mcp"
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    read = {"op": {"kind": "fs.read", "path": f"{tmp_path}/data/hello.txt"}}

    async def call() -> Any:
        for _ in range(100):  # until uvicorn serves
            if server.started:
                break
            await asyncio.sleep(0.05)
        http = httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}",
                                           "traceparent": TRACEPARENT}, timeout=60)
        async with http, Client(streamable_http_client(url, http_client=http)) as client:
            return await client.call_tool("op.reader", read)

    try:
        result = asyncio.run(call())
    finally:
        server.should_exit = True
        thread.join(timeout=20)
        pool.close()
        orch.close()
        tokens.close()
    assert result.is_error is False, result
    by = _tree(spans.get_finished_spans())
    face = by["mcp tools/call"][0]
    assert face.context is not None
    assert f"{face.context.trace_id:032x}" == TRACE
    assert face.parent is not None
    assert f"{face.parent.span_id:016x}" == PARENT
    gateway = next(s for s in by["policy_engine.gateway"] if _parent_of(s, face))
    run = next(s for s in by["policy_engine.run"] if _parent_of(s, gateway))
    assert (run.attributes or {})["policy_engine.tenant"] == "acme"
