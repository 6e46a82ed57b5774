"""IPv4-translated addresses and unparseable redirects (outsider findings F17, F13).

F17: the SIIT form ``::ffff:0:a.b.c.d`` (RFC 2765) of a metadata or loopback address was
classified "reserved", so a broad CIDR rule let ``[::ffff:0:a9fe:a9fe]`` (169.254.169.254) pass
where the mapped, 6to4, NAT64 and Teredo forms are refused. F13: a redirect whose ``Location``
httpx cannot parse (``http://%5B::ffff:127.0.0.1%5D:P/``) ended in ``TOOL.EXECUTION_FAILED``; the
hop now reaches the guard, which refuses it as it would refuse that URL as a first request.
Both run for real: the CLI, the orchestrator, the http executor and a loopback server.
"""

from __future__ import annotations

import ipaddress
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from policy_engine.guard.ipaddr import classify, embedded_ipv4
from tests.integration.servers import Handler, LoopbackServer, send

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]
BLOCKED = "SANDBOX.CAPABILITY_BLOCKED"

# every range a careless policy might list, as in the finding: only naming the metadata
# address itself as an IP literal may reach it
BROAD = ('"169.254.0.0/16", "fd00::/8", "64:ff9b::/96", "2002::/16", "2001::/32", "::/0", '
         '"fe80::/10", "0.0.0.0/0"')


def caps(port: int) -> list[dict[str, Any]]:
    return [{"kind": "net.http", "hosts": ["*"], "schemes": ["http"], "ports": [80, port],
             "methods": ["GET"]}]


def files(tmp: Path, port: int, hosts: str) -> tuple[Path, Path, Path]:
    policy = tmp / "p.sbpolicy"
    policy.write_text(f'policy "t/net" version "1.0.0"\ndefaults {{ timeout 10s  network on }}\n'
                      f'permit "web" net.http hosts [{hosts}] schemes ["http"] '
                      f'ports [80, {port}] methods ["GET"]\n')
    grant = tmp / "g.json"
    grant.write_text(json.dumps({
        "tenant": "t", "subject_id": "agent:a", "tool_name": "fetch", "call_id": "c1",
        "capabilities": caps(port), "expires_at": 4_102_444_800_000, "budget": {"calls": 100},
        "consent": {"granted_by": "user:u", "granted_at": 1, "expires_at": 4_102_444_800_000}}))
    manifest = tmp / "m.json"
    manifest.write_text(json.dumps({
        "name": "fetch", "version": "1.0", "permissions": caps(port),
        "side_effects": ["Network"], "safety_class": "Low", "network": "on"}))
    return policy, grant, manifest


def cli(tmp: Path, cmd: str, policy: Path, grant: Path, manifest: Path,
        url: str) -> tuple[int, dict[str, Any]]:
    request = tmp / f"req-{cmd}.json"
    request.write_text(json.dumps({"op": {"kind": "net.http", "method": "GET", "url": url},
                                   "manifest": str(manifest), "grant": str(grant)}))
    proc = subprocess.run(
        [sys.executable, "-m", "policy_engine.cli", cmd, "--format", "json",
         "--policy", str(policy), "--request", str(request)],
        capture_output=True, text=True, timeout=120, cwd=tmp,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT),
             "POLICY_ENGINE_STATE": str(tmp / "state")})
    assert proc.returncode in (0, 1), proc.stdout + proc.stderr  # 1: a run refused
    assert "Traceback" not in proc.stderr
    return proc.returncode, json.loads(proc.stdout)


# ---- F17 ----------------------------------------------------------------------------------------

@pytest.mark.parametrize(("siit", "mapped", "cls"), [
    ("::ffff:0:a9fe:a9fe", "::ffff:a9fe:a9fe", "metadata"),
    ("::ffff:0:7f00:1", "::ffff:7f00:1", "loopback"),
    ("::ffff:0:a00:1", "::ffff:a00:1", "private"),
])
def test_translated_form_is_classified_like_the_mapped_form(siit: str, mapped: str,
                                                             cls: str) -> None:
    ip = ipaddress.IPv6Address(siit)
    assert embedded_ipv4(ip) == embedded_ipv4(ipaddress.IPv6Address(mapped))
    assert classify(ip) == classify(mapped) == cls


def test_translated_metadata_address_refused_by_explain_and_run(tmp_path: Path) -> None:
    policy, grant, manifest = files(tmp_path, 8702, BROAD)
    url = "http://[::ffff:0:a9fe:a9fe]/latest/meta-data/"
    code, dry = cli(tmp_path, "explain", policy, grant, manifest, url)
    assert (code, dry["decision"], dry["code"]) == (0, "deny", BLOCKED), dry
    assert "metadata address `::ffff:0:a9fe:a9fe` is not named by any rule" in dry["reason"]
    code, ran = cli(tmp_path, "run", policy, grant, manifest, url)
    assert code == 1
    assert ran["result"]["code"] == BLOCKED
    assert "metadata address" in ran["result"]["message"]
    assert ran["result"]["used"]["calls"] == 0  # refused before any connection


def test_translated_loopback_is_named_loopback(tmp_path: Path) -> None:
    policy, grant, manifest = files(tmp_path, 8702, '"*"')
    code, dry = cli(tmp_path, "explain", policy, grant, manifest, "http://[::ffff:0:7f00:1]/")
    assert (code, dry["code"]) == (0, BLOCKED)
    assert "loopback address `::ffff:0:7f00:1` is not named by any rule" in dry["reason"]


# ---- F13 ----------------------------------------------------------------------------------------

LOCATIONS = {
    "/pct": "http://%5B::ffff:127.0.0.1%5D:{port}/target",  # the finding's Location
    "/open": "http://[::1:{port}/target",  # unterminated IPv6 literal
}


def redirect(h: Handler) -> None:
    h.send_response(302)
    h.send_header("Location", LOCATIONS[h.path].format(port=h.server.server_address[1]))
    h.send_header("Content-Length", "0")
    h.end_headers()


@pytest.mark.parametrize("path", sorted(LOCATIONS))
def test_unparseable_redirect_is_refused_as_its_target_would_be(tmp_path: Path,
                                                                 path: str) -> None:
    routes = {p: redirect for p in LOCATIONS}
    routes["/target"] = lambda h: send(h, 200, "text/plain", b"should not be reached")
    with LoopbackServer(routes) as srv:
        policy, grant, manifest = files(tmp_path, srv.port, '"127.0.0.1", "::/0"')
        target = LOCATIONS[path].format(port=srv.port)
        _, first = cli(tmp_path, "explain", policy, grant, manifest, target)
        code, ran = cli(tmp_path, "run", policy, grant, manifest,
                        f"http://127.0.0.1:{srv.port}{path}")
        seen = [p for _, p, _ in srv.seen.requests]
    # the guard's own refusal of that URL as a first request (the finding's is CAPABILITY_BLOCKED)
    assert first["decision"] == "deny"
    assert first["code"] in (BLOCKED, "SCHEMA.VALIDATION_FAILED")
    assert code == 1
    assert ran["decision"]["decision"] == "allow"  # the first hop is allowed and sent
    result = ran["result"]
    assert result["code"] == first["code"], result  # was TOOL.EXECUTION_FAILED
    assert "redirect to " in result["message"]
    assert first["reason"] in result["message"]
    assert seen == [path]  # the redirect target was never requested
