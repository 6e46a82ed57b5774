"""OTLP export for real: `policy-engine run` with `OTEL_EXPORTER_OTLP_ENDPOINT` pointing at a
loopback collector posts the call's spans (parsed back with the OTLP protobuf); a collector
that refuses them is counted as export failures and the call still succeeds."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor

from policy_engine import tracing
from policy_engine.tracing_sdk import CountingExporter

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]


class Collector(ThreadingHTTPServer):
    status = 200
    bodies: list[tuple[str, bytes]]


class _Handler(BaseHTTPRequestHandler):
    server: Collector

    def do_POST(self) -> None:  # noqa: N802 - the http.server API
        size = int(self.headers.get("Content-Length", "0"))
        self.server.bodies.append((self.path, self.rfile.read(size)))
        self.send_response(self.server.status)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def collector() -> Iterator[Collector]:
    server = Collector(("127.0.0.1", 0), _Handler)
    server.bodies = []
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


def test_run_exports_its_spans_to_the_configured_endpoint(collector: Collector,
                                                          tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT),
           "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{collector.server_port}",
           "OTEL_SERVICE_NAME": "pe-test"}
    ran = subprocess.run(
        [sys.executable, "-m", "policy_engine.cli", "run",
         "--policy", str(ROOT / "examples" / "policies" / "org.sbpolicy"),
         "--request", str(ROOT / "examples" / "requests" / "tmp-alloc-small.json"),
         "--state-dir", str(tmp_path / "state")],
        capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120)
    assert ran.returncode == 0, ran.stderr
    assert collector.bodies, "no export reached the collector"
    names: dict[str, dict[str, object]] = {}
    services = set()
    for path, body in collector.bodies:
        assert path == "/v1/traces"
        request = ExportTraceServiceRequest.FromString(body)
        for resource in request.resource_spans:
            services |= {a.value.string_value for a in resource.resource.attributes
                         if a.key == "service.name"}
            for scope in resource.scope_spans:
                for span in scope.spans:
                    names[span.name] = {a.key: a.value.string_value for a in span.attributes}
    assert services == {"pe-test"}
    assert {"policy_engine.run", "policy_engine.decide", "policy_engine.execute",
            "policy_engine.evidence"} <= set(names)
    assert names["policy_engine.run"]["policy_engine.rule"] == "scratch"
    assert names["policy_engine.execute"]["policy_engine.backend"] == "tmp"


def test_a_refused_export_is_counted_and_never_fails_the_caller(collector: Collector) -> None:
    collector.status = 400  # not retryable: the exporter gives up at once
    before = tracing.export_failures()
    provider = TracerProvider()
    endpoint = f"http://127.0.0.1:{collector.server_port}/v1/traces"
    provider.add_span_processor(SimpleSpanProcessor(CountingExporter(
        OTLPSpanExporter(endpoint=endpoint, timeout=5), tracing._count_failure)))
    tracing.use(provider)
    try:
        with tracing.span("policy_engine.run", {"policy_engine.tenant": "acme"}) as sp:
            sp.set_attribute("policy_engine.code", "")
        with tracing.span("policy_engine.run"):
            pass
    finally:
        tracing.use(None)
        provider.shutdown()
    assert len(collector.bodies) == 2  # both were tried
    assert tracing.export_failures() - before == 2
