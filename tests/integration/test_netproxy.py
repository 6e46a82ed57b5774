"""Restricted network mode under real bubblewrap: only the policy proxy is reachable."""

from __future__ import annotations

import ipaddress
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from policy_engine.errors import ErrorCode
from policy_engine.model import Profile
from policy_engine.netproxy import RestrictedHandle, RestrictedNetwork
from tests.integration.servers import (
    LoopbackServer,
    endless,
    http_profile,
    self_signed,
    send,
    server_tls,
)

pytestmark = pytest.mark.integration

BWRAP = shutil.which("bwrap") or "/usr/bin/bwrap"
BASE = [BWRAP, "--ro-bind", "/usr", "/usr", "--symlink", "usr/lib", "/lib",
        "--symlink", "usr/lib64", "/lib64", "--symlink", "usr/bin", "/bin",
        "--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp", "--tmpfs", "/run",
        "--die-with-parent", "--new-session"]

ROUTES = {
    "/ok": lambda h: send(h, 200, "text/plain", b"through the proxy"),
    "/html": lambda h: send(h, 200, "text/html", b"<p>not json</p>"),
    "/huge": endless(),
}


def sandboxed(net: RestrictedHandle, argv: list[str], *binds: str, timeout: float = 60,
              clearenv: bool = False) -> subprocess.CompletedProcess[str]:
    """Run ``argv`` in bwrap with the handle's namespace and bridge; ``binds`` are ro dirs.

    With ``clearenv`` the sandbox inherits nothing and the proxy variables come as ``--setenv``
    (how the proc executor builds its sandboxes); otherwise they come from the environment.
    """
    extra = [a for d in binds for a in ("--ro-bind", d, d)]
    if clearenv:
        extra = ["--clearenv", "--setenv", "PATH", "/usr/bin:/bin", *extra,
                 *net.network_hook()(None)]
    else:
        extra += net.bwrap_args()
    cmd = [*BASE, *extra, "--", *net.wrap_argv(argv)]
    env = {"PATH": "/usr/bin:/bin", **({} if clearenv else net.env())}
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout,
                          check=False)


def curl(*args: str) -> list[str]:
    return ["curl", "-sS", "--max-time", "20", "-o", "-", "-w", "\n%{http_code}", *args]


@pytest.fixture
def server() -> Iterator[LoopbackServer]:
    with LoopbackServer(ROUTES) as srv:
        yield srv


def restricted(profile: Profile) -> RestrictedHandle:
    return RestrictedNetwork(profile).start()


def test_curl_reaches_an_allowed_host_and_is_refused_elsewhere(server: LoopbackServer) -> None:
    profile = http_profile("127.0.0.1", ports=(server.port,), network="restricted")
    with restricted(profile) as net:
        ok = sandboxed(net, curl(server.url("/ok?q=secret-query")))
        assert ok.stdout.splitlines() == ["through the proxy", "200"], ok.stderr
        denied = sandboxed(net, curl("-D", "-", f"http://127.0.0.2:{server.port}/ok?q=x"))
        assert denied.stdout.rstrip().endswith("403"), denied
        assert f"X-Policy-Engine-Code: {ErrorCode.PERMISSION_DENY.value}" in denied.stdout
        (refusal,) = net.refusals()
        assert refusal.meta["refused"] == ErrorCode.PERMISSION_DENY.value
        assert refusal.meta["url"] == f"http://127.0.0.2:{server.port}/ok"
        allowed = [e for e in net.side_effects() if "refused" not in e.meta]
        assert allowed[0].meta["status"] == 200
        assert "secret-query" not in str(net.side_effects())
    assert len(server.seen.requests) == 1


def test_python_urllib_uses_the_proxy_and_mime_is_enforced(server: LoopbackServer) -> None:
    profile = http_profile("127.0.0.1", ports=(server.port,), network="restricted",
                           mime=("text/plain",))
    script = (
        "import sys, urllib.request, urllib.error\n"
        "for path in sys.argv[1:]:\n"
        "    try:\n"
        "        r = urllib.request.urlopen(path, timeout=20)\n"
        "        print(r.status, r.read().decode())\n"
        "    except urllib.error.HTTPError as e:\n"
        "        print(e.code, e.headers.get('X-Policy-Engine-Code'))\n"
    )
    with restricted(profile) as net:
        run = sandboxed(net, ["python3", "-I", "-c", script, server.url("/ok"),
                              server.url("/html")], clearenv=True)
        assert run.stdout.splitlines() == [
            "200 through the proxy", f"403 {ErrorCode.CAPABILITY_BLOCKED.value}"], run.stderr
        assert [e.meta["refused"] for e in net.refusals()] == [
            ErrorCode.CAPABILITY_BLOCKED.value]


def test_a_program_ignoring_the_proxy_has_no_network(server: LoopbackServer) -> None:
    """Direct sockets: the host's loopback server is not in this namespace, nothing routes out."""
    profile = http_profile("127.0.0.1", ports=(server.port,), network="restricted")
    script = (
        "import socket, sys\n"
        "for host, port in (('127.0.0.1', int(sys.argv[1])), ('10.0.0.1', 80),\n"
        "                   ('93.184.216.34', 80), ('::1', int(sys.argv[1]))):\n"
        "    try:\n"
        "        socket.create_connection((host, port), timeout=5).close()\n"
        "        print(host, 'CONNECTED')\n"
        "    except OSError as e:\n"
        "        print(host, type(e).__name__)\n"
    )
    with restricted(profile) as net:
        run = sandboxed(net, ["python3", "-I", "-c", script, str(server.port)])
        lines = run.stdout.splitlines()
        assert len(lines) == 4, run.stderr
        assert not any("CONNECTED" in line for line in lines), lines
        direct = sandboxed(net, curl("--noproxy", "*", server.url("/ok")))
        assert direct.returncode != 0
        assert direct.stdout.strip().endswith("000")
    assert server.seen.requests == []


def test_request_body_over_max_bytes_out_is_refused_unread(server: LoopbackServer) -> None:
    profile = http_profile("127.0.0.1", ports=(server.port,), network="restricted",
                           max_bytes_out=1000)
    with restricted(profile) as net:
        run = sandboxed(net, curl("--data-binary", "x" * 5000, server.url("/ok")))
        assert run.stdout.strip().endswith("403"), run
        assert [e.meta["refused"] for e in net.refusals()] == [
            ErrorCode.CAPABILITY_BLOCKED.value]
    assert server.seen.requests == []


def test_oversize_body_through_the_proxy_is_cut_off(server: LoopbackServer) -> None:
    limit = 1024 * 1024
    profile = http_profile("127.0.0.1", ports=(server.port,), network="restricted",
                           max_bytes_in=limit)
    with restricted(profile) as net:
        run = sandboxed(net, ["sh", "-c", f"curl -sS --max-time 30 {server.url('/huge')} | wc -c"])
        assert int(run.stdout.split()[0]) <= limit
        (effect,) = net.side_effects()
        assert effect.meta["cut_off"] is True
    assert server.seen.peer_closed_early.wait(30)


def test_connect_tunnel_allowed_and_refused_by_host_and_port(tmp_path: Path) -> None:
    """``sneaky.test`` is answered by a resolver stub standing in for DNS (no DNS server runs
    here): it resolves to 127.0.0.2, a loopback address no rule names."""
    cert, key = self_signed(tmp_path, names=("sneaky.test",), ips=("127.0.0.1",))

    def stub_dns(host: str, port: int) -> list[ipaddress.IPv4Address]:
        return [ipaddress.IPv4Address("127.0.0.2" if host == "sneaky.test" else "127.0.0.1")]

    with LoopbackServer(ROUTES, tls=server_tls(cert, key)) as tls_srv, \
            LoopbackServer(ROUTES, tls=server_tls(cert, key)) as other:
        # a tunnel needs a rule admitting every method (test_netproxy_connect.py)
        profile = http_profile("127.0.0.1", "*", ports=(tls_srv.port,), network="restricted",
                               methods=("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE",
                                        "OPTIONS"))
        with RestrictedNetwork(profile, resolver=stub_dns).start() as net:
            ok = sandboxed(net, curl("--cacert", str(cert), tls_srv.url("/ok")), str(tmp_path))
            assert ok.stdout.splitlines() == ["through the proxy", "200"], ok.stderr
            wrong_port = sandboxed(net, curl("--cacert", str(cert), other.url("/ok")),
                                   str(tmp_path))
            assert wrong_port.returncode != 0
            assert "403" in wrong_port.stderr
            # `*` admits the name, but it resolves to a loopback address no rule names
            by_name = sandboxed(net, curl("--cacert", str(cert),
                                          tls_srv.url("/ok", host="sneaky.test")), str(tmp_path))
            assert by_name.returncode != 0
            assert "403" in by_name.stderr
            refused = [(e.meta["method"], e.meta["refused"]) for e in net.refusals()]
            assert refused == [("CONNECT", ErrorCode.PERMISSION_DENY.value),
                               ("CONNECT", ErrorCode.CAPABILITY_BLOCKED.value)]
            tunnel = [e for e in net.side_effects() if "refused" not in e.meta][0]
            assert tunnel.meta["bytes_in"] > 0
        assert other.seen.requests == []
        assert len(tls_srv.seen.requests) == 1


def test_docker_options_and_env_describe_the_same_bridge() -> None:
    profile = http_profile("127.0.0.1", network="restricted")
    with restricted(profile) as net:
        opts = net.docker_options()
        assert opts["network_mode"] == "none"
        (mount,) = opts["volumes"].values()
        assert mount == {"bind": net.sandbox_dir, "mode": "ro"}
        assert opts["environment"]["HTTPS_PROXY"] == net.proxy_url
        assert net.wrap_argv(["true"])[-2:] == ["--", "true"]
        assert (net.runtime_dir / "bridge.py").exists()
        runtime = net.runtime_dir
    assert not runtime.exists()
