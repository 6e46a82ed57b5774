"""The `sample-http` executor and its policy-engine hook: a pinned, deadline-aware HTTP client."""

from __future__ import annotations

import base64
import http.client
import io
import ipaddress
import select
import socket
import ssl
import time
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from policy_engine.config import EngineConfig
from policy_engine.errors import ErrorCode, PolicyEngineError
from policy_engine.executor import ExecContext, ExecutorCapabilities
from policy_engine.guard.ipaddr import check_address
from policy_engine.guard.urls import ParsedUrl, parse_url
from policy_engine.hookspecs import hookimpl
from policy_engine.model import (
    Digest,
    ExecOp,
    ExecResult,
    NetHttpCapability,
    NetHttpOp,
    OpKind,
    SideEffect,
    SideEffectRec,
    Usage,
)

if TYPE_CHECKING:
    from policy_engine.conformance import Probe, ProbeEnv

POLICY_ENGINE_HOOK_API = "1.0"
"""The hook API this plugin was written for (docs/plugins.md, "Hook API version"): an engine
with another major version refuses to load it, by name, instead of calling it wrongly."""

_POLL_S = 0.05  # how often a blocked wait looks at the cancel token and the deadline
_CHUNK = 64 * 1024
_DEFAULT_MAX_BYTES_IN = 10 * 1024 * 1024


def _check_time(ctx: ExecContext) -> float:
    """Seconds left before the deadline; raises the registry code when time is up."""
    if ctx.cancel.cancelled:
        raise PolicyEngineError(ErrorCode.EXECUTION_FAILED, ctx.cancel.reason or "cancelled")
    left = ctx.deadline - time.monotonic()
    if left <= 0:
        raise PolicyEngineError(ErrorCode.TIMEOUT, "the request exceeded its deadline")
    return left


def _host_patterns(ctx: ExecContext) -> list[str]:
    """The profile's net.http host patterns: only these may name a private address."""
    return [h for pc in ctx.profile.capabilities for c in pc.all_of
            if isinstance(c, NetHttpCapability) for h in c.hosts]


def _connect(ctx: ExecContext, url: ParsedUrl) -> socket.socket:
    """Resolve once, vet every address, dial the first one (pinned: no second lookup)."""
    if url.ip is not None:
        addresses = [str(url.ip)]
    else:
        try:
            infos = socket.getaddrinfo(url.host, url.port, type=socket.SOCK_STREAM)
        except OSError as exc:
            raise PolicyEngineError(ErrorCode.PROVIDER_UNAVAILABLE,
                                    f"host `{url.host}` does not resolve") from exc
        addresses = sorted({str(info[4][0]) for info in infos})
    patterns = _host_patterns(ctx)
    for addr in addresses:
        check_address(url.host, ipaddress.ip_address(addr), patterns)
    try:
        sock = socket.create_connection((addresses[0], url.port),
                                        timeout=min(_check_time(ctx), 10.0))
    except OSError as exc:
        raise PolicyEngineError(ErrorCode.PROVIDER_UNAVAILABLE,
                                f"cannot connect to `{url.host}:{url.port}`") from exc
    if url.scheme == "https":
        sock = ssl.create_default_context().wrap_socket(sock, server_hostname=url.host)
    return sock


def _wait_readable(ctx: ExecContext, sock: socket.socket) -> None:
    """Block until ``sock`` has data, waking every _POLL_S to honour cancel and deadline."""
    while True:
        left = _check_time(ctx)
        if isinstance(sock, ssl.SSLSocket) and sock.pending():
            return
        ready, _, _ = select.select([sock], [], [], min(_POLL_S, left))
        if ready:
            return


class _DeadlineReader(io.RawIOBase):
    """Raw reads from the socket that wait in _POLL_S steps, checking cancel and deadline."""

    def __init__(self, sock: socket.socket, ctx: ExecContext) -> None:
        self.sock, self.ctx = sock, ctx

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        _wait_readable(self.ctx, self.sock)
        return self.sock.recv_into(buffer)


class _DeadlineSocket:
    """What http.client needs of a socket, with reads going through _DeadlineReader."""

    def __init__(self, sock: socket.socket, ctx: ExecContext) -> None:
        self.sock, self.ctx = sock, ctx

    def makefile(self, mode: str) -> io.BufferedReader:
        return io.BufferedReader(_DeadlineReader(self.sock, self.ctx))

    def sendall(self, data: bytes) -> None:
        self.sock.settimeout(min(_check_time(self.ctx), 10.0))
        self.sock.sendall(data)

    def close(self) -> None:
        """http.client closes its connection while the response is still being read (on
        `Connection: close`); the real socket is closed by execute() when the call ends.
        """


class SampleHttpExecutor:
    """GET/HEAD over HTTP(S) for net.http ops the guard allowed."""

    name = "sample-http"
    capabilities = ExecutorCapabilities(op_kinds=frozenset({OpKind.NET_HTTP}))

    def execute(self, ctx: ExecContext, op: ExecOp) -> ExecResult:
        if not isinstance(op, NetHttpOp):
            raise PolicyEngineError(ErrorCode.EXECUTION_FAILED,
                                    f"sample-http cannot run `{op.kind}`")
        method = op.method.upper()
        if method not in ("GET", "HEAD") or op.body_b64:
            raise PolicyEngineError(ErrorCode.SCHEMA_VALIDATION_FAILED,
                                    "sample-http sends only GET and HEAD without a body")
        url = parse_url(op.url, schemes=("http", "https"))
        sock = _connect(ctx, url)
        try:
            return self._exchange(ctx, op, url, method, sock)
        finally:
            sock.close()

    def _exchange(self, ctx: ExecContext, op: NetHttpOp, url: ParsedUrl, method: str,
                  sock: socket.socket) -> ExecResult:
        conn = http.client.HTTPConnection(url.host, url.port)
        # already connected to the vetted address; every read waits through the deadline-aware
        # reader, so a stalled server can neither outlive the deadline nor ignore a cancel
        conn.sock = _DeadlineSocket(sock, ctx)
        target = url.path + ("" if url.query is None else "?" + url.query)
        try:
            conn.request(method, target, headers={"Host": url.netloc, **op.headers})
            resp = conn.getresponse()
            body, truncated = self._read_body(ctx, resp)
        except (OSError, http.client.HTTPException) as exc:
            raise PolicyEngineError(ErrorCode.PROVIDER_UNAVAILABLE,
                                    f"`{url.host}` failed mid-request: "
                                    f"{type(exc).__name__}") from exc
        ctx.record_side_effect(SideEffectRec(kind=SideEffect.NETWORK, meta={
            "method": method, "host": url.host, "port": url.port, "status": resp.status,
            "bytes_in": len(body), "truncated": truncated}))
        out = {"status": resp.status, "content_type": resp.getheader("Content-Type"),
               "body_b64": base64.b64encode(body).decode(), "truncated": truncated,
               "body_digest": Digest.of(body).model_dump()}
        if 300 <= resp.status < 400:
            out["location"] = resp.getheader("Location")  # not followed: the caller decides
        return ExecResult(ok=True, out=out, used=Usage(bytes_in=len(body)))

    @staticmethod
    def _read_body(ctx: ExecContext, resp: http.client.HTTPResponse) -> tuple[bytes, bool]:
        limit = ctx.profile.limits.max_bytes_in or _DEFAULT_MAX_BYTES_IN
        parts: list[bytes] = []
        size = 0
        while size <= limit:
            chunk = resp.read1(_CHUNK)
            if not chunk:
                return b"".join(parts), False
            ctx.consume("bytes_in", len(chunk))
            parts.append(chunk)
            size += len(chunk)
        return b"".join(parts)[:limit], True

    def conformance_probes(self, env: ProbeEnv) -> Iterable[Probe]:
        """Extra probes for the conformance kit (added to its default net.http probes): a POST
        the policy allows but this executor refuses, with the code it must carry.
        """
        from policy_engine.conformance import Probe

        cap = NetHttpCapability(hosts=("127.0.0.1",), schemes=("http",),
                                ports=(env.server.port,), methods=("POST",))
        return [Probe(NetHttpOp(method="POST", url=env.server.url("/hello"), body_b64="e30="),
                      [cap], role="refuse",
                      expect_code=ErrorCode.SCHEMA_VALIDATION_FAILED.value,
                      title="POST is refused (GET/HEAD only)")]

    def close(self) -> None:
        """Nothing pooled: every call opens and closes its own connection."""


@hookimpl
def policy_engine_executors(config: EngineConfig) -> list[SampleHttpExecutor]:
    options = config.plugin_options("sample_http")
    if options:
        raise ValueError(f"sample_http: unknown options {sorted(options)}")
    return [SampleHttpExecutor()]
