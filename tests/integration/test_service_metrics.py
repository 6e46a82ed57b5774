"""`serve --metrics-port`: a real server, real calls, then a scrape parsed by prometheus_client.

The scrape has the engine's registry (docs/operations.md "Metrics") and the service's own
(requests by route and status, latency histograms, requests in flight, live run_code sessions,
consent answers), labelled by route templates only, with no token, argv or path in it.
"""

from __future__ import annotations

import re
import time
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.integration.service_server import add_token, grant, start

pytestmark = pytest.mark.integration


def _samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def _value(samples: dict[tuple[str, tuple[tuple[str, str], ...]], float], name: str,
           **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def test_metrics_are_scraped_after_real_calls(tmp_path: Path) -> None:
    root = tmp_path / "svc"
    root.mkdir()
    with start(root, "--metrics-port", "0", "--confirmation", "auto") as svc:
        log = (root / "serve.log").read_text()
        found = re.search(r"metrics on (http://127\.0\.0\.1:(\d+)/metrics)", log)
        assert found is not None, log
        metrics_url = found.group(1)
        assert f":{found.group(2)}" not in svc.url  # a listener of its own
        token = add_token(svc.state, "acme", "agent:alice")
        read = {"op": {"kind": "fs.read", "path": f"{root}/data/hello.txt"},
                "grant": grant("acme", "agent:alice", root), "manifest": "reader"}
        secret = {**read, "op": {"kind": "fs.read", "path": f"{root}/data/secret/key.txt"}}
        high = {**read, "grant": grant("acme", "agent:alice", root, tool_name="reader-high"),
                "manifest": "reader-high"}
        with httpx.Client(base_url=svc.url, headers={"Authorization": f"Bearer {token}"},
                          timeout=60) as c:
            assert c.post("/v1/decide", json=read).status_code == 200
            assert c.post("/v1/ops", json=read).status_code == 200
            assert c.post("/v1/ops", json=read).status_code == 200
            assert c.post("/v1/ops", json=secret).status_code == 403
            consented = c.post("/v1/ops", json=high)
            assert consented.status_code == 200, consented.text
            code = c.post("/v1/run_code", json={"session_id": "s1", "language": "shell",
                                                 "code": "echo hi"}).json()
            assert code["success"] is True, code
            missing = "0123456789abcdef0123456789abcdef"
            assert c.get(f"/sandbox/execs/{missing}").status_code == 404
        assert httpx.get(f"{svc.url}/sandbox/health").status_code == 200
        assert httpx.post(f"{svc.url}/v1/ops", json=read).status_code == 401
        assert httpx.get(f"{svc.url}/metrics").status_code in (401, 404)  # not on the API
        scrape = httpx.get(metrics_url, timeout=30)
    assert scrape.status_code == 200
    assert scrape.headers["content-type"].startswith("text/plain")
    text = scrape.text
    got = _samples(text)

    # the service's own: by route template and status
    requests = "policy_engine_http_requests_total"
    assert _value(got, requests, route="/v1/ops", method="POST", status="200") == 3
    assert _value(got, requests, route="/v1/ops", method="POST", status="403") == 1
    assert _value(got, requests, route="/v1/ops", method="POST", status="401") == 1
    assert _value(got, requests, route="/v1/decide", method="POST", status="200") == 1
    assert _value(got, requests, route="/v1/run_code", method="POST", status="200") == 1
    assert _value(got, requests, route="/sandbox/execs/{exec_id}", method="GET",
                  status="404") == 1
    assert _value(got, requests, route="/sandbox/health", method="GET", status="200") >= 1
    assert missing not in text  # a path parameter is never a label
    latency = "policy_engine_http_request_duration_seconds"
    assert _value(got, latency + "_count", route="/v1/ops", method="POST") == 5
    assert _value(got, latency + "_bucket", route="/v1/ops", method="POST", le="+Inf") == 5
    assert _value(got, latency + "_sum", route="/v1/ops", method="POST") > 0
    assert _value(got, "policy_engine_http_requests_in_flight") == 0
    assert _value(got, "policy_engine_sessions_live") == 1
    assert _value(got, "policy_engine_consent_answers_total", answer="approved",
                  mode="auto") == 1
    assert _value(got, "policy_engine_trace_export_failures_total") == 0

    # the engine's registry (docs/operations.md "Metrics"), run_code's orchestrator merged in
    assert _value(got, "sandbox_denied_total", code="SANDBOX.CAPABILITY_BLOCKED") == 1
    execs = sum(v for (name, labels), v in got.items()
                if name == "sandbox_exec_total" and ("tenant", "acme") in labels)
    assert execs == 4  # three reads and one run_code
    assert _value(got, "sandbox_latency_ms_count", domain="fs") == 4
    assert _value(got, "sandbox_latency_ms_count", domain="proc") == 1
    assert _value(got, "sandbox_guard_validate_ms_count") >= 4

    # nothing secret: no token, no file contents, no argv
    assert token not in text
    for secret_text in ("k3y", "echo hi", "hello.txt", str(root)):
        assert secret_text not in text


def test_each_worker_serves_its_own_metrics_port(tmp_path: Path) -> None:
    root = tmp_path / "svc"
    root.mkdir()
    with start(root, "--workers", "2", "--metrics-port", "0") as svc:
        deadline = time.monotonic() + 60
        found: list[str] = []
        while len(found) < 2:  # each worker prints its own line once it listens
            found = re.findall(r"metrics on (http://127\.0\.0\.1:\d+/metrics) \(worker \d\)",
                               (root / "serve.log").read_text())
            assert time.monotonic() < deadline, (root / "serve.log").read_text()
            time.sleep(0.1)
        token = add_token(svc.state, "acme", "agent:alice")
        with httpx.Client(base_url=svc.url, headers={"Authorization": f"Bearer {token}"},
                          timeout=60) as c:
            for _ in range(6):  # new connections: the kernel spreads them over the workers
                assert c.post("/v1/decide", json={
                    "op": {"kind": "fs.read", "path": f"{root}/data/hello.txt"},
                    "grant": grant("acme", "agent:alice", root), "manifest": "reader",
                }, headers={"Connection": "close"}).status_code == 200
        scrapes = [_samples(httpx.get(url, timeout=30).text) for url in sorted(set(found))]
    assert len(scrapes) == 2
    total = sum(_value(s, "policy_engine_http_requests_total", route="/v1/decide",
                       method="POST", status="200") for s in scrapes)
    assert total == 6  # every request counted once, by the worker that answered it
