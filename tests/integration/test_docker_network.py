"""Docker `network restricted`: a real container reaches the host-side policy proxy only.

The container has ``--network=none``; the bridge inside it forwards to the proxy socket mounted
read-only; the proxy on the host decides every request with the call's guard (a real compiled
policy whose condition admits only ``/ok`` paths) and dials the host's loopback server itself.
Run-once and warm-pool modes are both exercised.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from plugins.executor_docker.engine import DockerOptions
from plugins.executor_docker.executor import DockerExecutor
from policy_engine.errors import ErrorCode, PolicyEngineError
from policy_engine.executor import ExecContext
from policy_engine.guard import Guard
from policy_engine.model import (
    NetHttpCapability,
    NetHttpOp,
    NetworkMode,
    ProcExecOp,
    Profile,
    SideEffect,
)
from tests.integration.servers import LoopbackServer, compiled_profile, send

pytestmark = pytest.mark.integration

ROUTES = {
    "/ok/page": lambda h: send(h, 200, "text/plain", b"through the proxy"),
    "/nope": lambda h: send(h, 200, "text/plain", b"must never be served"),
}

CLIENT = """
import json, os, socket, sys, urllib.request, urllib.error
out = {"proxy": os.environ.get("http_proxy")}
for name, url in (("ok", sys.argv[1]), ("nope", sys.argv[2]), ("other", sys.argv[3])):
    try:
        r = urllib.request.urlopen(url, timeout=20)
        out[name] = [r.status, r.read().decode()]
    except urllib.error.HTTPError as e:
        out[name] = [e.code, e.headers.get("X-Policy-Engine-Code")]
    except OSError as e:
        out[name] = ["error", type(e).__name__]
host, port = sys.argv[4], int(sys.argv[5])
for name, addr in (("direct_loopback", (host, port)), ("direct_public", ("1.1.1.1", 80))):
    s = socket.socket()
    s.settimeout(5)
    try:
        s.connect(addr)
        out[name] = "connected"
    except OSError as e:
        out[name] = type(e).__name__
    finally:
        s.close()
print(json.dumps(out))
"""


@pytest.fixture
def server() -> Iterator[LoopbackServer]:
    with LoopbackServer(ROUTES) as srv:
        yield srv


@pytest.fixture(params=["run-once", "pool"])
def docker_ex(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[DockerExecutor]:
    ex = DockerExecutor(DockerOptions(mode=request.param, pool_size=1,
                                      workspace_root=str(tmp_path / "ws")))
    yield ex
    ex.close()


def policy(tmp: Path, port: int) -> tuple[Profile, Guard]:
    rules = (f'permit "ok-paths" net.http hosts ["127.0.0.1"] schemes ["http"] ports [{port}]\n'
             '  methods ["GET"] when `request.path.startsWith("/ok")`')
    cap = NetHttpCapability(hosts=("127.0.0.1",), schemes=("http",), ports=(port,),
                            methods=("GET",))
    # (a Process side effect would make the default policy ask for consent: not the point here)
    return compiled_profile(tmp, rules, (cap,), tool="py", network="restricted")


def test_container_reaches_allowed_loopback_only_through_the_proxy(
    tmp_path: Path, server: LoopbackServer, docker_ex: DockerExecutor
) -> None:
    profile, guard = policy(tmp_path, server.port)
    assert profile.network is NetworkMode.RESTRICTED
    refused_code = guard.decide(profile, NetHttpOp(url=server.url("/nope"))).code
    other = f"http://127.0.0.2:{server.port}/ok/page"  # loopback no rule names
    ctx = ExecContext(profile=profile, deadline=time.monotonic() + 120, guard=guard)
    op = ProcExecOp(tool="python3", args=("-c", CLIENT, server.url("/ok/page"),
                                          server.url("/nope"), other, "127.0.0.1",
                                          str(server.port)))
    res = docker_ex.execute(ctx, op)
    assert res.out["exit_code"] == 0, res.out["stderr"]
    seen = json.loads(res.out["stdout"])
    assert seen["proxy"].startswith("http://127.0.0.1:")
    assert seen["ok"] == [200, "through the proxy"]
    assert seen["nope"] == [403, refused_code]
    assert seen["other"][0] == 403
    # a program ignoring the proxy variables has no network at all
    assert seen["direct_loopback"] == "ConnectionRefusedError"  # the container's own lo
    assert seen["direct_public"] in ("OSError", "TimeoutError")  # no route out
    assert [p for _m, p, _h in server.seen.requests] == ["/ok/page"]
    net = [e for e in ctx.side_effects if e.kind is SideEffect.NETWORK]
    refused = {e.meta["url"]: e.meta["refused"] for e in net if "refused" in e.meta}
    assert refused[f"http://127.0.0.1:{server.port}/nope"] == refused_code
    assert f"http://127.0.0.2:{server.port}/ok/page" in refused
    allowed = [e for e in net if "refused" not in e.meta]
    assert [e.meta["status"] for e in allowed] == [200]
    meta = json.loads((Path(res.out["artifacts_dir"]) / "meta.json").read_text())
    assert meta["network_proxy"] == {"requests": 3, "refused": 2}
    assert meta["policy_snapshot"]["container"]["network_mode"] == "none"


def test_without_the_policy_guard_nothing_is_allowed(
    tmp_path: Path, server: LoopbackServer, docker_ex: DockerExecutor
) -> None:
    profile, _guard = policy(tmp_path, server.port)
    ctx = ExecContext(profile=profile, deadline=time.monotonic() + 120)  # no ctx.guard
    op = ProcExecOp(tool="python3", args=("-c", CLIENT, server.url("/ok/page"),
                                          server.url("/nope"), server.url("/nope"),
                                          "127.0.0.1", str(server.port)))
    res = docker_ex.execute(ctx, op)
    seen = json.loads(res.out["stdout"])
    assert seen["ok"] == [403, ErrorCode.PERMISSION_DENY.value]
    assert server.seen.requests == []


def test_declared_network_modes() -> None:
    assert DockerExecutor.capabilities.network_modes == {NetworkMode.OFF, NetworkMode.RESTRICTED}


def test_restricted_mode_can_be_turned_off(tmp_path: Path, server: LoopbackServer) -> None:
    profile, guard = policy(tmp_path, server.port)
    ex = DockerExecutor(DockerOptions(restricted_network=False,
                                      workspace_root=str(tmp_path / "ws")))
    try:
        with pytest.raises(PolicyEngineError) as info:
            ex.execute(ExecContext(profile=profile, deadline=time.monotonic() + 60, guard=guard),
                       ProcExecOp(tool="python3", args=("-c", "print(1)")))
        assert info.value.code is ErrorCode.CAPABILITY_BLOCKED
        assert "restricted_network" in info.value.reason
        with pytest.raises(ValueError, match="restricted_network"):
            DockerOptions.parse({"restricted_network": "yes"})
    finally:
        ex.close()
