"""Hot reload in `policy-engine serve`: a changed policy file reaches `/v1/decide`, `/v1/ops`
and their evidence for new requests; a broken one keeps the old policy and shows in health.
The real server in a subprocess on a loopback port; the policy file is edited on disk."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.integration.service_server import POLICY, Service, add_token, grant, start

pytestmark = pytest.mark.integration

FORBID_HELLO = 'forbid "no-hello" fs.read paths ["{root}/data/hello.txt"]\n'


@pytest.fixture
def svc(tmp_path: Path) -> Iterator[Service]:
    with start(tmp_path, "--reload-interval", "0.1") as service:
        yield service


def policy_text(svc: Service, *, forbid: bool) -> str:
    base = POLICY.format(root=svc.root, ws=svc.state / "workspace")
    return base + (FORBID_HELLO.format(root=svc.root) if forbid else "")


def write_policy(svc: Service, text: str) -> None:
    tmp = svc.root / "svc.sbpolicy.tmp"
    tmp.write_text(text)
    tmp.replace(svc.root / "svc.sbpolicy")  # one rename, as a deploy would


def health(svc: Service) -> dict[str, Any]:
    return dict(httpx.get(f"{svc.url}/sandbox/health", timeout=10).json())


def wait_for(svc: Service, pred: Any, what: str) -> dict[str, Any]:
    deadline = time.monotonic() + 20
    while True:
        body = health(svc)
        if pred(body):
            return body
        assert time.monotonic() < deadline, f"{what}: {json.dumps(body['policy'])}"
        time.sleep(0.05)


def read_hello(svc: Service) -> dict[str, Any]:
    return {"op": {"kind": "fs.read", "path": f"{svc.root}/data/hello.txt"},
            "grant": grant("acme", "agent:alice", svc.root), "manifest": "reader"}


def test_a_changed_policy_reaches_decide_ops_and_evidence(svc: Service) -> None:
    token = add_token(svc.state, "acme", "agent:alice")
    first = health(svc)["policy"]
    assert first["reload"] is True
    assert first["reloads"] == 0
    with svc.client(token) as c:
        before = c.post("/v1/decide", json=read_hello(svc)).json()
        assert before["decision"] == "allow"
        ran = c.post("/v1/ops", json=read_hello(svc))
        assert ran.status_code == 200, ran.text

        write_policy(svc, policy_text(svc, forbid=True))
        now = wait_for(svc, lambda b: b["policy"]["reloads"] == 1, "no reload")["policy"]
        assert now["version_hash"] != first["version_hash"]

        after = c.post("/v1/decide", json=read_hello(svc)).json()
        assert after["decision"] == "deny"
        assert after["rule"]["id"] == "no-hello"
        assert after["policy"]["version_hash"] == now["version_hash"]
        refused = c.post("/v1/ops", json=read_hello(svc))
        assert refused.status_code == 403, refused.text
    ends = [json.loads(line) for line in
            (svc.state / "evidence" / "evidence.jsonl").read_text().splitlines()
            if '"type":"end"' in line.replace(" ", "")]
    assert [e["policy_version_hash"] for e in ends[-2:]] == [first["version_hash"],
                                                            now["version_hash"]]


def test_a_broken_policy_keeps_the_old_one_and_says_where(svc: Service) -> None:
    token = add_token(svc.state, "acme", "agent:alice")
    good = health(svc)["policy"]
    write_policy(svc, policy_text(svc, forbid=False) + 'permit "oops" fs.read paths [\n'
                 'ghp_SECRETMARKER42 ]\n')
    body = wait_for(svc, lambda b: b["policy"]["reload_error"] is not None, "no error shown")
    assert body["status"] == "degraded"
    assert body["policy"]["version_hash"] == good["version_hash"]
    error = body["policy"]["reload_error"]
    assert error.startswith(f"{svc.root / 'svc.sbpolicy'}:9:"), error
    assert " SBP" in error
    # health needs no token: it names the place and the diagnostic, never the source text
    # (outsider round 2 F3: it quoted the unexpected token)
    assert "SECRETMARKER" not in json.dumps(body)
    with svc.client(token) as c:  # still the old policy
        assert c.post("/v1/decide", json=read_hello(svc)).json()["decision"] == "allow"
    write_policy(svc, policy_text(svc, forbid=True))  # fixed: loaded, health clears
    fixed = wait_for(svc, lambda b: b["policy"]["reloads"] == 1, "fix not loaded")
    assert fixed["status"] == "ok"
    assert fixed["policy"]["reload_error"] is None


def test_no_request_is_decided_by_a_mix_of_two_policies(svc: Service) -> None:
    """Decisions race with 8 flips between two policies; each answer must be the one its
    own reported policy version gives (allow under the first, deny under the second)."""
    token = add_token(svc.state, "acme", "agent:alice")
    allow_hash = health(svc)["policy"]["version_hash"]
    seen: list[tuple[str, str]] = []
    stop = threading.Event()

    def hammer() -> None:
        with svc.client(token) as c:
            while not stop.is_set():
                out = c.post("/v1/decide", json=read_hello(svc)).json()
                seen.append((out["policy"]["version_hash"], out["decision"]))

    worker = threading.Thread(target=hammer)
    worker.start()
    try:
        for n in range(1, 9):
            write_policy(svc, policy_text(svc, forbid=n % 2 == 1))
            wait_for(svc, lambda b, n=n: b["policy"]["reloads"] == n, f"flip {n}")
    finally:
        stop.set()
        worker.join(30)
    hashes = {h for h, _ in seen}
    assert allow_hash in hashes
    assert len(hashes) == 2, hashes  # both versions answered during the run
    for version, decision in seen:
        assert decision == ("allow" if version == allow_hash else "deny"), (version, decision)


def test_a_policy_path_turned_into_a_link_to_another_file_is_not_read(svc: Service) -> None:
    """Outsider round 2 F3: a policy file replaced by a link to a root-only token file had the
    token's first characters shown by the unauthenticated health endpoint."""
    secret = svc.root / "gh_token"
    secret.write_text("ghp_SECRETMARKER43\n")
    secret.chmod(0o600)
    policy = svc.root / "svc.sbpolicy"
    policy.unlink()
    policy.symlink_to(secret)
    body = wait_for(svc, lambda b: b["policy"]["reload_error"] is not None, "no error shown")
    assert "SBP217" in body["policy"]["reload_error"]
    assert "SECRETMARKER" not in json.dumps(body)
    assert body["status"] == "degraded"


WRITER = """import sys, time
path, head, tail, pause = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4])
with open(path, "w") as fh:  # in place, one open: as cp, scp or an editor's save writes
    fh.write(head)
    fh.flush()
    time.sleep(pause)
    fh.write(tail)
"""


def test_a_half_written_policy_never_decides(svc: Service) -> None:
    """Issue 32 item 8: a writer rewriting the policy in place pauses ten reload intervals
    with a compiling prefix on disk (the forbid cut off); no decision is ever made under it,
    and the whole file is loaded once the writer closes it."""
    write_policy(svc, policy_text(svc, forbid=True))
    loaded = wait_for(svc, lambda b: b["policy"]["reloads"] == 1, "first policy")["policy"]
    token = add_token(svc.state, "acme", "agent:alice")
    full = policy_text(svc, forbid=True).replace('version "1.0.0"', 'version "1.0.1"')
    cut = full.index('forbid "no-hello"')
    seen: list[tuple[str, str]] = []
    stop = threading.Event()

    def probe() -> None:
        with svc.client(token) as c:
            while not stop.is_set():
                out = c.post("/v1/decide", json=read_hello(svc)).json()
                seen.append((out["policy"]["version_hash"], out["decision"]))
                time.sleep(0.02)

    worker = threading.Thread(target=probe)
    worker.start()
    try:
        done = subprocess.run([sys.executable, "-c", WRITER, str(svc.root / "svc.sbpolicy"),
                               full[:cut], full[cut:], "1.0"], timeout=30, check=False)
        assert done.returncode == 0
        now = wait_for(svc, lambda b: b["policy"]["reloads"] == 2, "whole file")["policy"]
        time.sleep(0.3)
    finally:
        stop.set()
        worker.join(30)
    assert len(seen) > 20
    assert {h for h, _ in seen} == {loaded["version_hash"], now["version_hash"]}
    assert {d for _, d in seen} == {"deny"}  # the prefix (no forbid) never decided


HOLD_NEW = """import sys, time
path, head, tail, pause = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4])
with open(path, "w") as fh:  # a new file, written in one open
    fh.write(head)
    fh.flush()
    print("open", flush=True)
    time.sleep(pause)
    fh.write(tail)
"""


def test_a_newly_imported_file_still_being_written_never_decides(svc: Service) -> None:
    """Outsider round attack32 M4: the forbid moves from the entry file into a new
    `sub.sbpolicy`, still open for writing with only its header on disk, and the entry file is
    replaced atomically by one that imports it. The writer check covered only the files the
    last good bundle imported, so the prefix went live and `/v1/decide` allowed the read."""
    token = add_token(svc.state, "acme", "agent:alice")
    loaded = health(svc)["policy"]
    sub = svc.root / "sub.sbpolicy"
    head = 'policy "svc/sub" version "1.0.0"\n# the forbid moves here\n'
    tail = FORBID_HELLO.format(root=svc.root)
    seen: list[tuple[str, str]] = []
    stop = threading.Event()

    def probe() -> None:
        with svc.client(token) as c:
            while not stop.is_set():
                out = c.post("/v1/decide", json=read_hello(svc)).json()
                seen.append((out["policy"]["version_hash"], out["decision"]))
                time.sleep(0.02)

    write_policy(svc, policy_text(svc, forbid=True))
    wait_for(svc, lambda b: b["policy"]["reloads"] == 1, "the forbid in the entry file")
    worker = threading.Thread(target=probe)
    worker.start()
    writer = subprocess.Popen([sys.executable, "-c", HOLD_NEW, str(sub), head, tail, "2.0"],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert writer.stdout is not None
        assert writer.stdout.readline() == "open\n"
        base = policy_text(svc, forbid=False)
        write_policy(svc, base.replace("\n", '\nimport "sub.sbpolicy"\n', 1))
        assert writer.wait(timeout=30) == 0
        wait_for(svc, lambda b: b["policy"]["reloads"] >= 2, "the new bundle")
        time.sleep(0.5)  # five more polls: a second reload would show
    finally:
        writer.kill()
        writer.wait()
        stop.set()
        worker.join(30)
    assert len(seen) > 20
    allowed = [h for h, d in seen if d != "deny"]
    assert not allowed, f"{len(allowed)} of {len(seen)} answers allowed the read"
    now = health(svc)["policy"]
    assert now["reloads"] == 2  # the whole new bundle, loaded once
    assert now["version_hash"] != loaded["version_hash"]
    assert now["reload_error"] is None
