"""The same consent-needing call through all eight faces, with a real loopback webhook approver
(issue 25 items 2 and 3): each face asks the approver exactly once, sends it the reviewable op,
records the answer beside the evidence of the call, and — when the answer is no — answers with
the same refusal document (code, status, who refused, the consent seen)."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from mcp import Client
from mcp.client.stdio import StdioServerParameters

from policy_engine import PolicyRefusal, SandboxManager
from policy_engine.compiler import compile_files
from policy_engine.config import EngineConfig
from policy_engine.confirm.services import WebhookConfirmation
from tests.integration.mcp_fixtures import REPO
from tests.integration.service_server import Service, add_token, start
from tests.integration.test_confirmation import SECRET, Approver

pytestmark = pytest.mark.integration

# every process needs consent (`request.kind`), and so does a read of a `.private` file
POLICY = """policy "gateway/faces" version "1.0.0"
permit "files" fs.read, fs.list, fs.write  paths ["{root}/**"]
permit "py" proc.exec  tool "python3"
require consent when `request.kind == "proc.exec" || request.path.endsWith(".private")`
"""
CODE = "print(6 * 7)"
GRANT_TTL = 4102444800000


class World:
    """A policy, manifest, grant, sandbox config and approver shared by the eight faces."""

    def __init__(self, root: Path, approver: Approver) -> None:
        self.root = root
        self.approver = approver
        self.state = root / "state"
        (root / "inputs").mkdir(parents=True)
        (root / "inputs" / "notes.private").write_text("private notes\n")
        (root / "project").mkdir()
        self.policy = root / "faces.sbpolicy"
        self.policy.write_text(POLICY.format(root=root))
        self.secret = root / "approver.secret"
        self.secret.write_bytes(SECRET)
        self.manifest = root / "runner.json"
        self.manifest.write_text(json.dumps({
            "name": "runner", "version": "1.0.0", "side_effects": ["Process"],
            "permissions": [{"kind": "proc.exec", "tool": "python3"}]}))
        self.grant = root / "grant.json"
        self.grant.write_text(json.dumps(self.grant_doc()))
        self.sandbox = root / "sandbox.json"
        self.sandbox.write_text(json.dumps({"enabled": True}))

    def grant_doc(self) -> dict[str, Any]:
        return {"tenant": "acme", "subject_id": "agent:a", "tool_name": "runner",
                "call_id": "c-1", "expires_at": GRANT_TTL,
                "capabilities": [{"kind": "proc.exec", "tool": "python3"}]}

    def confirm_args(self, flag: str = "--confirm") -> list[str]:
        return [flag, "webhook", "--approver-url", self.approver.url,
                "--approver-secret-file", str(self.secret), "--approver-timeout", "10"]

    def cli(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "policy_engine.cli", *args],
                              capture_output=True, text=True, timeout=120, check=False,
                              cwd=REPO)

    def consent_log(self) -> list[dict[str, Any]]:
        lines = []
        for path in self.state.rglob("consent.jsonl"):
            lines += [json.loads(x) for x in path.read_text().splitlines()]
        return lines


# -- the eight faces: each runs the call and answers (envelope id, refusal document or None) --

Face = Callable[[World, Service], tuple[str, dict[str, Any] | None]]


def cli_run(w: World, _: Service) -> tuple[str, dict[str, Any] | None]:
    done = w.cli("run", "--policy", str(w.policy), "--manifest", str(w.manifest), "--grant",
                 str(w.grant), "--state-dir", str(w.state), *w.confirm_args(), "--format",
                 "json", "--", "python3", "-c", CODE)
    doc = json.loads(done.stdout)
    return doc["envelope_id"], doc.get("refusal")


def cli_sandbox_exec(w: World, _: Service) -> tuple[str, dict[str, Any] | None]:
    done = w.cli("sandbox", "exec", "--config", str(w.sandbox), "--state-dir", str(w.state),
                 "--cwd", str(w.root / "project"), *w.confirm_args(), "--format", "json", "--",
                 "python3", "-c", CODE)
    doc = json.loads(done.stdout)
    return doc["evidence"], doc.get("refusal")


def http_ops(w: World, svc: Service) -> tuple[str, dict[str, Any] | None]:
    token = add_token(svc.state, "acme", "agent:a")
    with svc.client(token) as http:
        doc = http.post("/v1/ops", json={
            "op": {"kind": "proc.exec", "tool": "python3", "args": ["-c", CODE]},
            "grant": w.grant_doc(), "manifest": "runner"}).json()
    return doc["envelope_id"], doc.get("refusal")


def http_run_code(w: World, svc: Service) -> tuple[str, dict[str, Any] | None]:
    token = add_token(svc.state, "acme", "agent:a")
    with svc.client(token) as http:
        doc = http.post("/v1/run_code", json={"session_id": "s1", "code": CODE}).json()
    return doc["exec_id"], doc.get("refusal")


def http_execs(w: World, svc: Service) -> tuple[str, dict[str, Any] | None]:
    token = add_token(svc.state, "acme", "agent:a")
    with svc.client(token) as http:
        doc = http.post("/sandbox/execs", json={
            "project_id": "p1", "exec": {"kind": "python", "script": CODE}}).json()
    return doc["envelope_id"], doc.get("refusal")


def http_skill(w: World, svc: Service) -> tuple[str, dict[str, Any] | None]:
    token = add_token(svc.state, "acme", "agent:a")
    with svc.client(token) as http:
        doc = http.post("/skills/files.read/invoke",
                        json={"inputs": {"path": "inputs/notes.private"}}).json()
    return doc["envelope_id"], doc.get("refusal")


def mcp_tool(w: World, _: Service) -> tuple[str, dict[str, Any] | None]:
    params = StdioServerParameters(command=sys.executable, cwd=str(REPO), args=[
        "-m", "policy_engine.cli", "mcp", "--policy", str(w.policy), "--skills",
        str(REPO / "skills"), "--manifest", str(w.manifest), "--state-dir", str(w.state),
        "--root-fs", str(w.root), "--tenant", "acme", "--subject", "agent:a",
        *w.confirm_args()])
    answer: list[tuple[str, dict[str, Any] | None]] = []

    async def main() -> None:
        async with Client(params, read_timeout_seconds=120) as client:
            result = await client.call_tool("op.runner", {"op": {
                "kind": "proc.exec", "tool": "python3", "args": ["-c", CODE]}})
            meta = result.meta or {}
            if result.is_error:
                assert result.structured_content is not None
                refusal = result.structured_content["refusal"]
                assert meta["policy-engine/refusal"] == refusal
                answer.append((refusal["envelope_id"], refusal))
            else:
                answer.append((meta["policy-engine/envelope_id"], None))

    anyio.run(main)
    return answer[0]


def python_manager(w: World, _: Service) -> tuple[str, dict[str, Any] | None]:
    service = WebhookConfirmation(w.approver.url, SECRET, timeout_s=10)
    with SandboxManager("py1", policyset=compile_files([w.policy]),
                        config=EngineConfig(state_dir=w.state / "python"),
                        workspace_root=w.root / "rc", confirmation=service) as manager:
        result = manager.run_code(CODE)
        if result.refusal is not None:  # the exception carries the same document
            with pytest.raises(PolicyRefusal) as raised:
                manager.run_code(CODE, check=True)
            assert raised.value.refusal.to_json().keys() == result.refusal.keys()
            assert raised.value.code.value == result.refusal["code"]
            assert raised.value.refused_by == result.refusal["refused_by"]
            w.approver.seen.pop()  # the second call asked again: one question per call
    return result.exec_id, result.refusal


FACES: dict[str, Face] = {
    "policy-engine run": cli_run, "sandbox exec": cli_sandbox_exec,
    "POST /v1/ops": http_ops, "POST /v1/run_code": http_run_code,
    "POST /sandbox/execs": http_execs, "POST /skills/{id}/invoke": http_skill,
    "MCP tool": mcp_tool, "SandboxManager.run_code": python_manager,
}


@pytest.fixture(scope="module")
def approver() -> Iterator[Approver]:
    a = Approver()
    yield a
    a.close()


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory, approver: Approver
          ) -> Iterator[tuple[World, Service]]:
    root = tmp_path_factory.mktemp("faces")
    w = World(root, approver)
    with start(root, "--manifest", str(w.manifest), "--skills", str(REPO / "skills"),
               *w.confirm_args("--confirmation"), policy_text=POLICY) as svc:
        yield w, svc


def _drive(w: World, svc: Service, mode: str) -> dict[str, tuple[str, dict[str, Any] | None]]:
    w.approver.mode = mode
    answers = {}
    for name, face in FACES.items():
        before = len(w.approver.seen)
        answers[name] = face(w, svc)
        asked = w.approver.seen[before:]
        assert len(asked) == 1, f"{name}: asked {len(asked)} times"
        assert asked[0]["valid"] is True, name  # signed with the shared secret
    return answers


def test_every_face_asks_the_approver_once_and_records_the_yes(
        world: tuple[World, Service]) -> None:
    w, svc = world
    answers = _drive(w, svc, "approve")
    log = {line["envelope_id"]: line for line in w.consent_log()}
    for name, (envelope, refusal) in answers.items():
        assert refusal is None, f"{name}: {refusal}"
        assert log[envelope]["answer"]["approved"] is True, name
        assert log[envelope]["answer"]["kind"] == "approved", name
        assert log[envelope]["answer"]["approver"] == "user:dana", name
    # the approver saw what it approved: the full code of every process call
    for seen in w.approver.seen:
        review = seen["request"]["review"]  # type: ignore[index]
        if review["kind"] == "proc.exec":
            assert CODE in review["argv"], review
            assert review["argv_digest"].startswith("sha256:")
        else:
            assert review["path"].endswith("inputs/notes.private")
    # ... and the evidence kept only the digest of that form
    for line in w.consent_log():
        assert set(line["request"]["review"]) == {"digest"}


def test_every_face_refuses_a_no_with_the_same_refusal_document(
        world: tuple[World, Service]) -> None:
    w, svc = world
    answers = _drive(w, svc, "refuse")
    seen = []
    for name, (envelope, refusal) in answers.items():
        assert refusal is not None, name
        assert refusal["envelope_id"] == envelope, name
        assert refusal["consent"]["at"] is not None, name
        assert refusal["message"].startswith("permission denied: consent required"), name
        seen.append((name, {k: v for k, v in refusal.items() if k not in (
            "envelope_id", "consent", "message", "rule")},
            {k: v for k, v in refusal["consent"].items() if k != "at"}))
    expected = ({"code": "SANDBOX.PERMISSION_DENY", "http_status": 403, "retryable": False,
                 "refused_by": "consent", "location": None},
                {"asked": True, "answer": "refused", "by": "webhook:user:dana"})
    for name, fields, consent in seen:
        assert (fields, consent) == expected, name


def test_an_approver_that_is_down_is_no_service_never_an_allow(
        world: tuple[World, Service]) -> None:
    w, svc = world
    url = w.approver.url
    w.approver.url = "http://127.0.0.1:9/approve"  # discard port: nothing listens
    try:
        envelope, refusal = cli_run(w, svc)
    finally:
        w.approver.url = url
    assert refusal is not None
    assert refusal["code"] == "SANDBOX.PERMISSION_DENY"
    assert refusal["consent"]["answer"] == "no_service"
    assert refusal["envelope_id"] == envelope


def test_a_malformed_call_gets_the_same_refusal_shape(world: tuple[World, Service]) -> None:
    w, svc = world
    token = add_token(svc.state, "acme", "agent:a")
    with svc.client(token) as http:
        bad = http.post("/v1/ops", json={"op": {"kind": "proc.exec"}, "grant": {},
                                         "manifest": "runner"})
    assert bad.status_code == 422
    refusal = bad.json()["refusal"]
    assert refusal["code"] == "SCHEMA.VALIDATION_FAILED"
    assert refusal["refused_by"] == "service"
    assert refusal["location"]  # where it broke
    assert set(refusal) >= {"code", "http_status", "retryable", "message", "refused_by",
                            "rule", "consent", "envelope_id"}
    unreadable = httpx.post(f"{svc.url}/v1/ops", content=b"{", headers={
        "authorization": f"Bearer {token}", "content-type": "application/json"})
    assert unreadable.json()["refusal"]["code"] == "SCHEMA.VALIDATION_FAILED"
