"""`policy-engine serve` driven over HTTP: authentication, tenancy, refusals, decide, ops and
sandbox execs, against the real server in a subprocess on a loopback port."""

from __future__ import annotations

import hashlib
import json
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from plugins.budget_sqlite import SqliteBudgetMeter
from tests.integration.service_server import (
    POLICY,
    Service,
    add_token,
    cli,
    grant,
    manifest,
    serving,
    start,
)

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def svc(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    with serving(tmp_path_factory.mktemp("svc"), "--max-body-bytes", "65536") as service:
        yield service


@pytest.fixture(scope="module")
def alice(svc: Service) -> str:
    return add_token(svc.state, "acme", "agent:alice")


@pytest.fixture(scope="module")
def mallory(svc: Service) -> str:
    return add_token(svc.state, "evil", "agent:mallory")


def _assert_error(resp: httpx.Response, status: int, code: str) -> None:
    assert resp.status_code == status, resp.text
    err = resp.json()["error"]
    assert err["code"] == code, err
    assert err["http_status"] == status, err
    assert "Traceback" not in resp.text
    assert 'File "' not in resp.text


def _exec(c: httpx.Client, body: dict[str, object]) -> httpx.Response:
    return c.post("/sandbox/execs", json=body)


ENDPOINTS = [("POST", "/v1/decide"), ("POST", "/v1/ops"), ("POST", "/v1/run_code"),
             ("POST", "/sandbox/execs"),
             ("GET", "/sandbox/execs"), ("GET", "/sandbox/execs/" + "a" * 32),
             ("GET", "/sandbox/execs/" + "a" * 32 + "/artifacts"),
             ("GET", "/sandbox/execs/" + "a" * 32 + "/artifacts/stdout.txt")]


def test_health_needs_no_token_and_reports_the_runtime(svc: Service) -> None:
    with svc.client() as c:
        body = c.get("/sandbox/health").json()
    assert body["workspace_root"] == str(svc.state / "workspace")
    assert body["workspace_writable"] is True
    assert body["status"] == "ok"
    assert body["runtime_mode"] == "linux/strict"


@pytest.mark.parametrize(("method", "path"), ENDPOINTS)
def test_every_other_endpoint_needs_a_valid_token(svc: Service, alice: str, method: str,
                                                  path: str) -> None:
    for token in (None, "pet_0123456789abcdef." + "A" * 43, alice + "x", "garbage"):
        with svc.client(token) as c:
            _assert_error(c.request(method, path, json={}), 401, "AUTH.UNAUTHENTICATED")


def test_a_revoked_token_is_refused(svc: Service) -> None:
    token = add_token(svc.state, "acme", "agent:temp")
    with svc.client(token) as c:
        assert c.get("/sandbox/execs").status_code == 200
        token_id = token[4:20]
        done = cli("tokens", "revoke", token_id, state=svc.state)
        assert done.returncode == 0, done.stderr
        _assert_error(c.get("/sandbox/execs"), 401, "AUTH.UNAUTHENTICATED")
    listed = cli("tokens", "list", "--format", "json", state=svc.state)
    rows = json.loads(listed.stdout)
    assert any(r["token_id"] == token_id and r["revoked_at"] for r in rows)
    assert token[21:] not in listed.stdout  # the secret is never shown again
    db = sqlite3.connect(svc.state / "tokens.sqlite")
    stored = db.execute("SELECT secret_hash FROM service_tokens WHERE token_id = ?",
                        (token_id,)).fetchone()[0]
    db.close()
    assert stored == hashlib.sha256(token[21:].encode()).hexdigest()  # hashed, not the secret


def test_decide_is_the_explain_contract(svc: Service, alice: str) -> None:
    root = svc.root
    body = {"op": {"kind": "fs.read", "path": f"{root}/data/hello.txt"},
            "grant": grant("acme", "agent:alice", root), "manifest": "reader"}
    with svc.client(alice) as c:
        allow = c.post("/v1/decide?explain=full", json=body).json()
        compact = c.post("/v1/decide", json=body).json()
        body["op"] = {"kind": "fs.read", "path": f"{root}/data/secret/key.txt"}
        deny = c.post("/v1/decide", json={**body, "grant": grant(
            "acme", "agent:alice", root,
            capabilities=[{"kind": "fs.read", "paths": [f"{root}/data/**"]}])}).json()
    assert allow["decision"] == "allow"
    assert allow["rule"]["id"] == "read-data"
    assert allow["trace"]
    assert allow["profile"]["tenant"] == "acme"
    assert compact["rule"] == allow["rule"]
    assert compact["limits"] == allow["limits"]
    assert "trace" not in compact
    assert deny["decision"] == "deny"
    assert deny["code"] == "SANDBOX.CAPABILITY_BLOCKED"
    assert deny["rule"]["id"] == "no-secret"


def test_ops_runs_through_the_orchestrator_with_evidence(svc: Service, alice: str) -> None:
    root = svc.root
    body = {"op": {"kind": "fs.read", "path": f"{root}/data/hello.txt"},
            "grant": grant("acme", "agent:alice", root), "manifest": "reader"}
    with svc.client(alice) as c:
        ok = c.post("/v1/ops", json=body)
        body["op"] = {"kind": "fs.read", "path": f"{root}/data/secret/key.txt"}
        denied = c.post("/v1/ops", json=body)
    assert ok.status_code == 200, ok.text
    assert ok.json()["result"]["ok"] is True
    assert ok.json()["envelope_id"]
    _assert_error(denied, 403, "SANDBOX.CAPABILITY_BLOCKED")
    assert "k3y" not in denied.text
    envelope = denied.json()["envelope_id"]
    evidence = "\n".join(p.read_text() for p in (svc.state).rglob("*.jsonl"))
    assert envelope in evidence  # the denial left begin/end evidence too


def test_a_missing_file_is_404_not_a_retryable_failure(svc: Service, alice: str) -> None:
    """Outsider attack 15, F5: reading a file that does not exist was `500
    TOOL.EXECUTION_FAILED, retryable: true`, which tells a client to retry forever. It is the
    caller's mistake, not the executor's: `404 TOOL.NOT_FOUND`, not retryable, refused by the
    backend (no rule refused it), with its evidence."""
    root = svc.root
    with svc.client(alice) as c:
        for path in (f"{root}/data/no-such.txt", f"{root}/data/no-dir/x.txt"):
            body = {"op": {"kind": "fs.read", "path": path},
                    "grant": grant("acme", "agent:alice", root), "manifest": "reader"}
            resp = c.post("/v1/ops", json=body)
            _assert_error(resp, 404, "TOOL.NOT_FOUND")
            refusal = resp.json()["refusal"]
            assert refusal["retryable"] is False
            assert resp.json()["error"]["retryable"] is False
            assert refusal["refused_by"] == "backend"
            assert refusal["rule"] is None
            envelope = resp.json()["envelope_id"]
            records = [json.loads(line) for log in svc.state.rglob("*.jsonl")
                       for line in log.read_text().splitlines() if envelope in line]
            ends = [r for r in records if r.get("envelope_id") == envelope
                    and r.get("type") == "end"]
            assert len(ends) == 1
            assert ends[0]["error_code"] == "TOOL.NOT_FOUND"
            assert ends[0]["sandbox_error_kind"] == "not_found"


def test_a_secret_name_below_an_allowed_tree_is_no_existence_oracle(svc: Service,
                                                                    alice: str) -> None:
    """Outsider attack 35, F3: `fs.read <dir>/.env/x` answered 403 "cannot be resolved" when
    `<dir>/.env` existed (a file is no directory) and 404 when it did not, so a caller allowed
    the tree learned which hidden secret files exist (listings hide them; reading the file
    itself is refused either way). Nothing exists below a file: both are the same 404."""
    root = svc.root
    (root / "data" / ".env").write_text("API_KEY=oracle-marker\n")
    answers = []
    with svc.client(alice) as c:
        for name in (".env", "absent.env", "hello.txt"):
            body = {"op": {"kind": "fs.read", "path": f"{root}/data/{name}/x"},
                    "grant": grant("acme", "agent:alice", root), "manifest": "reader"}
            resp = c.post("/v1/ops", json=body)
            refusal = resp.json()["refusal"]
            answers.append((resp.status_code, refusal["code"], refusal["refused_by"],
                            refusal["message"].replace(name, "NAME")))
    assert answers[0] == answers[1] == answers[2], answers
    assert answers[0][:2] == (404, "TOOL.NOT_FOUND")
    assert all("oracle-marker" not in str(a) for a in answers)


def test_a_grant_or_context_for_another_tenant_is_refused(svc: Service, alice: str) -> None:
    root = svc.root
    op = {"kind": "fs.read", "path": f"{root}/data/hello.txt"}
    with svc.client(alice) as c:
        for path in ("/v1/decide", "/v1/ops"):
            other = {"op": op, "grant": grant("evil", "agent:alice", root),
                     "manifest": "reader"}
            _assert_error(c.post(path, json=other), 403, "SANDBOX.PERMISSION_DENY")
            spoof = {"op": op, "grant": grant("acme", "agent:alice", root),
                     "manifest": "reader", "context": {"tenant": {"id": "evil"}}}
            _assert_error(c.post(path, json=spoof), 422, "SCHEMA.VALIDATION_FAILED")


def test_inline_manifests_and_caller_consent_are_refused(svc: Service, alice: str) -> None:
    root = svc.root
    op = {"kind": "fs.read", "path": f"{root}/data/hello.txt"}
    consent = {"granted_by": "agent:alice", "granted_at": 0, "expires_at": 4102444800000}
    with svc.client(alice) as c:
        for path in ("/v1/decide", "/v1/ops"):
            inline = {"op": op, "grant": grant("acme", "agent:alice", root),
                      "manifest": manifest(root)}
            _assert_error(c.post(path, json=inline), 403, "SANDBOX.PERMISSION_DENY")
            self_consented = {"op": op, "manifest": "reader",
                              "grant": grant("acme", "agent:alice", root, consent=consent)}
            _assert_error(c.post(path, json=self_consented), 403, "SANDBOX.PERMISSION_DENY")
            unknown = {"op": op, "grant": grant("acme", "agent:alice", root),
                       "manifest": "nope"}
            _assert_error(c.post(path, json=unknown), 404, "SERVICE.NOT_FOUND")


def test_malformed_bodies_are_422_without_echoing_input(svc: Service, alice: str) -> None:
    with svc.client(alice) as c:
        resp = c.post("/v1/ops", json={"op": {"kind": "fs.read"}, "secret": "hunter2"})
        _assert_error(resp, 422, "SCHEMA.VALIDATION_FAILED")
        assert "hunter2" not in resp.text
        raw = c.post("/v1/decide", content=b"{not json",
                     headers={"content-type": "application/json"})
        _assert_error(raw, 422, "SCHEMA.VALIDATION_FAILED")
        _assert_error(c.get("/nope"), 404, "SERVICE.NOT_FOUND")
        _assert_error(c.delete("/sandbox/execs"), 405, "SERVICE.METHOD_NOT_ALLOWED")


def test_oversized_bodies_are_413(svc: Service, alice: str) -> None:
    big = {"project_id": "p", "exec": {"kind": "shell", "script": "true"},
           "inputs": [{"path": "big.txt", "content": "x" * 70_000}]}
    with svc.client(alice) as c:
        _assert_error(_exec(c, big), 413, "SERVICE.PAYLOAD_TOO_LARGE")

        def chunks() -> Iterator[bytes]:  # no Content-Length: the streamed size counts
            yield b'{"project_id": "p", "pad": "'
            for _ in range(20):
                yield b"y" * 8192
            yield b'"}'

        streamed = c.post("/sandbox/execs", content=chunks(),
                          headers={"content-type": "application/json"})
        _assert_error(streamed, 413, "SERVICE.PAYLOAD_TOO_LARGE")


def test_shell_exec_writes_the_seed_layout(svc: Service, alice: str) -> None:
    script = ('echo out; echo err >&2; cat ../inputs/notes/a.txt; pwd; '
              'printf report > "$(ls -d ../artifacts/*/ | head -1)report.txt"')
    body = {"project_id": "proj-1", "task_id": "task-7",
            "exec": {"kind": "shell", "script": script},
            "inputs": [{"path": "notes/./a.txt", "content": "from-input\n"}]}
    with svc.client(alice) as c:
        resp = _exec(c, body)
        assert resp.status_code == 200, resp.text
        rec = resp.json()
        assert rec["status"] == "ok", rec
        assert rec["exit_code"] == 0, rec
        assert rec["cmd"] == "bash"
        assert rec["args"][0] == "-lc"
        out_dir = Path(rec["artifacts_path"])
        base = svc.state / "workspace" / "tenants" / "acme" / "projects" / "proj-1"
        assert out_dir == base / "artifacts" / rec["exec_id"]
        stdout = c.get(f"/sandbox/execs/{rec['exec_id']}/artifacts/stdout.txt").text
        assert stdout.splitlines() == ["out", "from-input", str(base / "work")]
        assert (out_dir / "stderr.txt").read_text() == "err\n"
        listed = c.get(f"/sandbox/execs/{rec['exec_id']}/artifacts").json()["artifacts"]
        by_path = {a["path"]: a for a in listed}
        assert set(by_path) >= {"stdout.txt", "stderr.txt", "manifest.json", "meta.json"}
        report = c.get(f"/sandbox/execs/{rec['exec_id']}/artifacts/report.txt")
        assert report.content == b"report"
        assert by_path["report.txt"]["sha256"] == hashlib.sha256(b"report").hexdigest()
        meta = json.loads((out_dir / "meta.json").read_text())
        assert meta["exit_code"] == 0
        assert meta["mounts"]["inputs"].endswith("inputs:ro")
        assert meta["policy_snapshot"]["rule"] == "sh"
        assert c.get(f"/sandbox/execs/{rec['exec_id']}").json() == rec
        tasks = c.get("/sandbox/execs", params={"task_id": "task-7"}).json()["execs"]
        assert [t["exec_id"] for t in tasks] == [rec["exec_id"]]
        assert c.get("/sandbox/execs", params={"task_id": "none"}).json()["execs"] == []


def test_python_exec_runs_code_and_input_files(svc: Service, alice: str) -> None:
    with svc.client(alice) as c:
        code = _exec(c, {"project_id": "py", "exec": {"kind": "python",
                                                       "script": "print(6 * 7)"}}).json()
        assert code["status"] == "ok", code
        assert code["cmd"] == "python3", code
        assert c.get(f"/sandbox/execs/{code['exec_id']}/artifacts/stdout.txt").text == "42\n"
        body = {"project_id": "py", "exec": {"kind": "python", "file": "main.py"},
                "inputs": [{"path": "main.py", "content": "import sys; sys.exit(3)"}]}
        failed = _exec(c, body).json()
        assert failed["status"] == "failed", failed
        assert failed["exit_code"] == 3, failed
        _assert_error(_exec(c, {"project_id": "py", "exec": {"kind": "python",
                                                              "file": "missing.py"}}),
                      404, "SERVICE.NOT_FOUND")
        both = {"project_id": "py", "exec": {"kind": "python", "script": "1", "file": "a.py"}}
        _assert_error(_exec(c, both), 422, "SCHEMA.VALIDATION_FAILED")


def test_exec_cannot_write_outside_its_directories(svc: Service, alice: str) -> None:
    script = "echo pwned > ../inputs/x.txt; echo pwned > ../../other/x.txt; exit 0"
    with svc.client(alice) as c:
        rec = _exec(c, {"project_id": "box", "exec": {"kind": "shell", "script": script}}
                    ).json()
    assert rec["status"] == "ok", rec
    stderr = (Path(rec["artifacts_path"]) / "stderr.txt").read_text()
    assert stderr.count("Read-only file system") + stderr.count("No such file") == 2, stderr
    assert not (svc.state / "workspace" / "tenants" / "acme" / "projects" / "box" / "inputs"
                / "x.txt").exists()


@pytest.mark.parametrize("path", ["../escape.txt", "/etc/passwd", "a/../../b", "..", "./"])
def test_input_paths_outside_inputs_are_400(svc: Service, alice: str, path: str) -> None:
    body = {"project_id": "trav", "exec": {"kind": "shell", "script": "true"},
            "inputs": [{"path": path, "content": "x"}]}
    with svc.client(alice) as c:
        _assert_error(_exec(c, body), 400, "SERVICE.BAD_REQUEST")
    assert not (svc.state / "workspace" / "tenants" / "acme" / "escape.txt").exists()


def test_path_parameters_are_validated(svc: Service, alice: str) -> None:
    with svc.client(alice) as c:
        rec = _exec(c, {"project_id": "pp", "exec": {"kind": "shell", "script": "true"}}
                    ).json()
        eid = rec["exec_id"]
        for bad in ("..", "not-hex", "A" * 32, "a" * 31):
            resp = c.get(f"/sandbox/execs/{bad}")
            assert resp.status_code in (400, 404), resp.text
            assert resp.json()["error"]["code"] in ("SERVICE.BAD_REQUEST", "SERVICE.NOT_FOUND")
        for name in ("..%2f..%2finputs%2fx", "../meta.json", "%2e%2e/%2e%2e/work",
                     "/etc/passwd", "nope.txt"):
            resp = c.get(f"/sandbox/execs/{eid}/artifacts/{name}")
            assert resp.status_code in (400, 404), (name, resp.text)
        _assert_error(c.post("/sandbox/execs", json={"project_id": "../x", "exec": {
            "kind": "shell", "script": "true"}}), 422, "SCHEMA.VALIDATION_FAILED")


def test_a_planted_link_is_never_listed_or_served(svc: Service, alice: str) -> None:
    script = 'd="$(ls -d ../artifacts/*/ | head -1)"; ln -s /etc/hostname "$d"/host; ' \
             'ln -s ../../inputs "$d"/in; ln -s /etc/hostname "$d"/stdout.txt; true'
    with svc.client(alice) as c:
        rec = _exec(c, {"project_id": "links", "exec": {"kind": "shell", "script": script}}
                    ).json()
        listed = {a["path"] for a in c.get(
            f"/sandbox/execs/{rec['exec_id']}/artifacts").json()["artifacts"]}
        assert "host" not in listed
        assert not any(p.startswith("in/") for p in listed)
        _assert_error(c.get(f"/sandbox/execs/{rec['exec_id']}/artifacts/host"), 404,
                      "SERVICE.NOT_FOUND")
        # the service replaced the planted stdout.txt link with the real output
        assert c.get(f"/sandbox/execs/{rec['exec_id']}/artifacts/stdout.txt").text == ""


def test_a_tenant_never_sees_another_tenants_execs(svc: Service, alice: str,
                                                   mallory: str) -> None:
    with svc.client(alice) as c:
        rec = _exec(c, {"project_id": "shared-name", "task_id": "t-x",
                        "exec": {"kind": "shell", "script": "echo alice-secret"}}).json()
    eid = rec["exec_id"]
    with svc.client(mallory) as m:
        _assert_error(m.get(f"/sandbox/execs/{eid}"), 404, "SERVICE.NOT_FOUND")
        _assert_error(m.get(f"/sandbox/execs/{eid}/artifacts"), 404, "SERVICE.NOT_FOUND")
        _assert_error(m.get(f"/sandbox/execs/{eid}/artifacts/stdout.txt"), 404,
                      "SERVICE.NOT_FOUND")
        assert m.get("/sandbox/execs").json()["execs"] == []
        assert m.get("/sandbox/execs", params={"task_id": "t-x"}).json()["execs"] == []
        # the same project id is a different directory for another tenant
        own = _exec(m, {"project_id": "shared-name", "exec": {
            "kind": "shell", "script": "cat ../artifacts/*/stdout.txt; ls ../artifacts | wc -l"}}
            ).json()
        out = m.get(f"/sandbox/execs/{own['exec_id']}/artifacts/stdout.txt").text
        assert "alice-secret" not in out
        assert out.strip().endswith("1")


def test_the_served_openapi_document_is_the_committed_one(svc: Service) -> None:
    committed = Path(__file__).resolve().parents[2] / "docs" / "openapi.json"
    with svc.client() as c:
        assert c.get("/openapi.json").json() == json.loads(committed.read_text())


def test_a_refused_exec_is_recorded_as_denied_with_its_code(svc: Service, alice: str) -> None:
    body = {"project_id": "deny", "exec": {"kind": "shell", "script": "echo never"},
            "policy_overrides": {"network": "on"}}  # an override may only narrow
    with svc.client(alice) as c:
        rec = _exec(c, body).json()
        assert rec["status"] == "denied", rec
        assert rec["error_code"], rec
        assert rec["exit_code"] is None
        assert c.get(f"/sandbox/execs/{rec['exec_id']}").json()["status"] == "denied"
        assert c.get(f"/sandbox/execs/{rec['exec_id']}/artifacts/stdout.txt").text == ""


def test_per_tenant_rate_limit_goes_through_the_budget_meter(tmp_path: Path) -> None:
    with start(tmp_path, "--rate-per-minute", "5") as limited:
        busy = add_token(limited.state, "busy", "agent:a")
        calm = add_token(limited.state, "calm", "agent:b")
        with limited.client(busy) as c:
            codes = [c.get("/sandbox/execs").status_code for _ in range(12)]
            # a minute boundary may fall inside the loop: at most two windows' worth pass
            assert codes.count(200) <= 10, codes
            assert 429 in codes, codes
            refused = c.get("/sandbox/execs")
            if refused.status_code == 429:  # unless a new minute just began
                _assert_error(refused, 429, "QUOTA.BUDGET_EXCEEDED")
        with limited.client(calm) as other:
            assert other.get("/sandbox/execs").status_code == 200  # its own budget
        # the counts live in the configured meter's store (the SQLite meter's shared window
        # table beside budget.sqlite), one key per tenant and minute
        meter = SqliteBudgetMeter(limited.state / "budget.sqlite")
        now = int(time.time() // 60)
        counts = {t: [meter.window_count(f"service-rate/{t}", w) for w in (now - 1, now)]
                  for t in ("busy", "calm")}
        meter.close()
        assert all(sum(c) > 0 and max(c) <= 5 for c in counts.values()), counts


def test_run_code_over_http_picks_the_sandbox_by_risk(svc: Service, alice: str) -> None:
    with svc.client(alice) as c:
        safe = c.post("/v1/run_code", json={"session_id": "s", "code": "print(6 * 7)"}).json()
        assert safe["success"] is True, safe
        assert safe["stdout"] == "42\n"
        assert safe["sandbox_type"] == "proc-bwrap"
        assert safe["risk"]["level"] == "SAFE"
        risky = c.post("/v1/run_code", json={"session_id": "s", "timeout_s": 60,
                                              "code": "import os\nprint(os.getcwd())"}).json()
        assert risky["sandbox_type"] == "docker", risky
        assert risky["stdout"] == "/workspace/work\n"
        _assert_error(c.post("/v1/run_code", json={"session_id": "../x", "code": "1"}), 422,
                      "SCHEMA.VALIDATION_FAILED")


def test_run_code_sessions_are_per_tenant(svc: Service, alice: str, mallory: str) -> None:
    with svc.client(alice) as c:
        wrote = c.post("/v1/run_code", json={"session_id": "same", "language": "shell",
                                              "code": "echo alice-data > notes.txt"}).json()
        assert wrote["success"] is True, wrote
        assert wrote["sandbox_type"] == "proc-bwrap"
        again = c.post("/v1/run_code", json={"session_id": "same", "language": "shell",
                                              "code": "cat notes.txt"}).json()
        assert again["stdout"] == "alice-data\n", again
    with svc.client(mallory) as m:
        other = m.post("/v1/run_code", json={"session_id": "same", "language": "shell",
                                              "code": "cat notes.txt"}).json()
    assert other["success"] is False, other
    assert "alice-data" not in other["stdout"]


def test_max_concurrent_execs_serializes_execs(tmp_path: Path) -> None:
    import threading

    with start(tmp_path, "--max-concurrent-execs", "1") as one:
        token = add_token(one.state, "acme", "agent:a")
        spans: list[tuple[float, float]] = []

        def run() -> None:
            with one.client(token) as c:
                rec = _exec(c, {"project_id": "slots", "exec": {
                    "kind": "shell", "script": "date +%s.%N; sleep 0.6; date +%s.%N"}}).json()
                out = c.get(f"/sandbox/execs/{rec['exec_id']}/artifacts/stdout.txt").text
                start_s, end_s = (float(x) for x in out.split())
                spans.append((start_s, end_s))

        threads = [threading.Thread(target=run) for _ in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
    assert len(spans) == 3
    spans.sort()
    # one at a time: each exec started after the previous one ended
    assert all(later[0] >= earlier[1] for earlier, later in zip(spans, spans[1:], strict=False))


def test_output_over_the_cap_is_truncated_without_killing(svc: Service, alice: str) -> None:
    body = {"project_id": "big", "policy_overrides": {"limits": {"max_stdout_bytes": 1000}},
            "exec": {"kind": "shell", "script": "head -c 200000 /dev/zero | tr '\\0' x; "
                     "echo done >&2"}}
    with svc.client(alice) as c:
        rec = _exec(c, body).json()
        assert rec["status"] == "ok", rec
        assert rec["stdout_truncated"] is True
        assert rec["stderr_truncated"] is False
        out = c.get(f"/sandbox/execs/{rec['exec_id']}/artifacts/stdout.txt").content
        assert 0 < len(out) <= 1000
        assert set(out) == {ord("x")}
        # the process ran to its end: what it wrote after the flood is there
        err = c.get(f"/sandbox/execs/{rec['exec_id']}/artifacts/stderr.txt").text
        assert err == "done\n"


def test_artifacts_over_the_total_cap_are_removed(tmp_path: Path) -> None:
    with start(tmp_path, "--max-artifacts-bytes", "4096") as capped:
        token = add_token(capped.state, "acme", "agent:a")
        script = ('d="$(ls -d ../artifacts/*/ | head -1)"; head -c 3000 /dev/zero > "$d"a.bin; '
                  'head -c 3000 /dev/zero > "$d"b.bin; echo wrote')
        with capped.client(token) as c:
            rec = _exec(c, {"project_id": "cap", "exec": {"kind": "shell", "script": script}}
                        ).json()
            listed = {a["path"] for a in c.get(
                f"/sandbox/execs/{rec['exec_id']}/artifacts").json()["artifacts"]}
    assert rec["status"] == "failed", rec
    assert rec["error_code"] == "QUOTA.BUDGET_EXCEEDED"
    assert rec["exit_code"] == 0
    assert not {"a.bin", "b.bin"} & listed
    assert "stdout.txt" in listed
    assert not (Path(rec["artifacts_path"]) / "a.bin").exists()


def test_health_reports_an_unwritable_workspace(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    with start(tmp_path, "--workspace", str(blocker / "ws")) as broken:
        with broken.client() as c:
            body = c.get("/sandbox/health").json()
        token = add_token(broken.state, "acme", "agent:a")
        with broken.client(token) as c:
            resp = _exec(c, {"project_id": "p", "exec": {"kind": "shell", "script": "true"}})
    assert body["status"] == "degraded"
    assert body["workspace_writable"] is False
    _assert_error(resp, 503, "PROVIDER.UNAVAILABLE")
    assert "Traceback" not in broken.stop()


def test_text_that_is_not_unicode_is_422_not_500(svc: Service, alice: str) -> None:
    """Outsider round 2 F2: a lone surrogate (JSON "\\udfff") in an op field crashed the
    response and the evidence digest (500, no evidence)."""
    root = svc.root
    body = json.dumps({"op": {"kind": "fs.read", "path": f"{root}/data/SURROGATE"},
                       "grant": grant("acme", "agent:alice", root), "manifest": "reader"})
    raw = body.replace("SURROGATE", "\\udfff")  # json.dumps would refuse to write one
    headers = {"Content-Type": "application/json"}
    with svc.client(alice) as c:
        for path in ("/v1/decide", "/v1/ops"):
            resp = c.post(path, content=raw.encode(), headers=headers)
            _assert_error(resp, 422, "SCHEMA.VALIDATION_FAILED")
        ctx = raw.replace('"manifest": "reader"', '"manifest": "reader", "context": '
                          '{"\\udfff": 1}').replace("\\udfff\"}, \"grant", "x\"}, \"grant")
        assert c.post("/v1/decide", content=ctx.encode(), headers=headers).status_code < 500


def test_exec_records_are_owner_only(svc: Service, alice: str) -> None:
    """Outsider round 2 I1: exec records keep the script (`args`) and were world-readable."""
    with svc.client(alice) as c:
        assert c.get("/sandbox/execs").status_code == 200
    assert (svc.state / "service.sqlite").stat().st_mode & 0o077 == 0


def test_a_policy_with_a_shorter_timeout_still_runs_execs(tmp_path: Path) -> None:
    """The exec service's own defaults (60 s, 1 GiB, 1 core) were an operator *settings* layer,
    refused when wider than the policy's: under `defaults { timeout 30s }` (docs/sessions.md's
    recipe) every `POST /sandbox/execs` was denied, "settings would widen `limits.timeout_ms`
    from 30000 to 60000", `refused_by: grant` (outsider attack 15, F6). They narrow as the
    exec tool's manifest does: the call runs under the policy's 30 s."""
    text = POLICY.replace('version "1.0.0"\n', 'version "1.0.0"\ndefaults {{ timeout 30s }}\n',
                          1)
    with start(tmp_path, policy_text=text) as svc:
        token = add_token(svc.state, "acme", "agent:short")
        with svc.client(token) as c:
            done = _exec(c, {"project_id": "short",
                             "exec": {"kind": "shell", "script": "echo ran"}}).json()
        svc.stop()
    assert done["status"] == "ok", done
    assert done["policy_snapshot"]["limits"]["wall"].startswith("30.0s"), done["policy_snapshot"]
