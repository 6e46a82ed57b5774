"""The host-side policy proxy: HTTP and CONNECT on a Unix socket, each request guard-decided.

Every name is resolved once and only vetted addresses are dialed (``plugins.executor_http``'s
``vet`` and ``pin``); refusals answer 403/503/504 with the registry code and are recorded.
One request per connection (answered ``Connection: close``): a second request pipelined behind
the first is never read, so each plain-HTTP request is vetted on its own. A CONNECT tunnel is
opened only where the allowing rule admits every request (``tunnel_refusal``), carries TLS only,
and every byte through the proxy, both ways and tunnels included, counts against the call's
``bytes_in``/``bytes_out`` (``Meter``); a tunnel closes when they run out.
"""

from __future__ import annotations

import base64
import select
import socket
import socketserver
import threading
import time
from collections.abc import Callable
from contextlib import closing, suppress
from dataclasses import dataclass, field

import httpx

from policy_engine.errors import ErrorCode, PolicyEngineError
from policy_engine.executor import Decider
from policy_engine.model import Limits, NetHttpOp, Profile, SideEffect, SideEffectRec
from policy_engine.netproxy.body import check_mime
from policy_engine.netproxy.headers import clean_request_headers, redacted_url
from policy_engine.netproxy.resolve import (
    IPAddress,
    Resolver,
    Vetted,
    pin,
    tunnel_refusal,
    vet,
)
from policy_engine.netproxy.transport import PinnedTransport
from policy_engine.netproxy.wire import Head, Meter, Refused, read_head, reason_phrase

IDLE_SECONDS = 60.0
LINGER_SECONDS = 10.0
DRAIN_SECONDS = 1.0
DRAIN_BYTES = 1 << 20
HOP_BY_HOP = frozenset({"connection", "keep-alive", "proxy-connection", "transfer-encoding",
                        "te", "trailer", "upgrade", "proxy-authenticate", "proxy-authorization"})
ESTABLISHED = b"HTTP/1.1 200 Connection Established\r\n\r\n"


@dataclass(slots=True)
class ProxyPolicy:
    """What the proxy enforces for one run: the profile, the guard, DNS and TLS settings."""

    profile: Profile
    guard: Decider
    resolver: Resolver
    transport: PinnedTransport
    record: Callable[[SideEffectRec], None]
    deadline: float
    meter: Meter = field(default_factory=Meter)
    limits: Limits | None = None  # the call's effective limits (ExecContext.limits)

    def cap(self, name: str, per_request: int | None) -> int | None:
        """The tighter of the call's limit ``name`` and a proxied request's own."""
        lim = self.limits if self.limits is not None else self.profile.limits
        values = [v for v in (getattr(lim, name), per_request) if v is not None]
        return min(values) if values else None


class ProxyHandler(socketserver.StreamRequestHandler):
    """One client connection: one request (``Connection: close``) or one CONNECT tunnel."""

    server: ProxyServer

    def handle(self) -> None:
        server = self.server
        with server.idle:
            server.active += 1
        try:
            self._handle()
        finally:
            with server.idle:
                server.active -= 1
                server.idle.notify_all()

    def _handle(self) -> None:
        self.connection.settimeout(IDLE_SECONDS)
        meta: dict[str, object] = {"via": "proxy"}
        try:
            head = read_head(self.rfile)
            meta["method"] = head.method
            if head.method == "CONNECT":
                self._tunnel(head, meta)
            else:
                self._forward(head, meta)
        except Refused as r:
            meta["refused"] = r.error.code.value
            meta.setdefault("url", "<unparsed>")
            self._record(meta)  # INVARIANT: recorded before the client can see the refusal
            self._fail(r)
            return
        except (OSError, ValueError):
            meta["aborted"] = True
        self._record(meta)

    def _record(self, meta: dict[str, object]) -> None:
        if "url" in meta:
            self.server.policy.record(SideEffectRec(kind=SideEffect.NETWORK, meta=dict(meta)))

    def _vet(self, op: NetHttpOp, meta: dict[str, object],
             decided: Callable[[Vetted], None] | None = None,
             ) -> tuple[Vetted, tuple[IPAddress, ...]]:
        """Decide ``op``, call ``decided`` (which may refuse) before the name is resolved, then
        resolve and vet the addresses."""
        policy = self.server.policy
        try:
            vetted = vet(policy.guard, policy.profile, op)
            u = vetted.url
            meta["url"] = redacted_url(u.scheme, u.host, u.port, u.path)
            if decided is not None:
                decided(vetted)
            pinned = pin(u.host, u.port, u.ip, vetted.hosts, policy.resolver)
        except PolicyEngineError as exc:
            meta.setdefault("url", _shown(op.url))
            raise Refused(exc) from None
        meta["addresses"] = [str(a) for a in pinned.addresses]
        return vetted, pinned.addresses

    def _forward(self, head: Head, meta: dict[str, object]) -> None:
        method, target, headers = head.method, head.target, head.headers
        if not target.startswith("http://"):
            meta["url"] = _shown(target)
            raise Refused(PolicyEngineError(
                ErrorCode.CAPABILITY_BLOCKED, "only absolute http:// targets are proxied; "
                "https goes through CONNECT"))
        # hop-by-hop headers belong to the client's connection to the proxy; Host and the
        # length are the URL's and the body's (the guard refuses a call that sets them)
        kept = {k: v for k, v in headers
                if k.lower() not in HOP_BY_HOP and k.lower() not in ("host", "content-length")}
        length = next((v for k, v in headers if k.lower() == "content-length"), "0")
        if any(k.lower() == "transfer-encoding" for k, _ in headers) or not length.isdigit():
            meta["url"] = _shown(target)
            raise Refused(PolicyEngineError(ErrorCode.SCHEMA_VALIDATION_FAILED,
                                            "request bodies need a Content-Length"))
        policy = self.server.policy
        # the request line and headers leave with the body: checked against what is left
        # before the body is read (never buffered) and before the name is resolved
        out_bytes = head.size + int(length)
        cap = policy.meter.left("out", policy.cap("max_bytes_out", None))
        if cap is not None and out_bytes > cap:
            meta["url"] = _shown(target)
            raise Refused(PolicyEngineError(
                ErrorCode.CAPABILITY_BLOCKED,
                f"request of {out_bytes} bytes (line and headers {head.size}, body {length}) "
                f"exceeds what is left of max_bytes_out ({cap} bytes)"))
        body = self.rfile.read(int(length)) if int(length) else b""
        out_bytes = head.size + len(body)
        op = NetHttpOp(method=method, url=target, headers=kept,
                       body_b64=base64.b64encode(body).decode() if body else None)
        sent_headers: list[tuple[str, str]] = []
        what = "request (line, headers and body)"

        def check(vetted: Vetted) -> None:  # refused here, it costs no DNS lookup
            sent_headers.extend(clean_request_headers(kept))
            left = policy.meter.left("out", policy.cap("max_bytes_out", vetted.max_bytes_out))
            if left is not None and out_bytes > left:
                raise PolicyEngineError(
                    ErrorCode.CAPABILITY_BLOCKED,
                    f"{what} of {out_bytes} bytes exceeds what is left of max_bytes_out "
                    f"({left} bytes)")

        vetted, addresses = self._vet(op, meta, check)
        # charged once the addresses are vetted (a refused request costs nothing); the
        # charge, not the check, is what holds against concurrent requests
        refusal = policy.meter.charge("out", out_bytes,
                                      policy.cap("max_bytes_out", vetted.max_bytes_out), what)
        if refusal is not None:
            raise Refused(refusal)
        meta["bytes_out"] = out_bytes
        u = vetted.url
        remaining = min(policy.deadline - time.monotonic(),
                        (vetted.timeout_ms or 60_000) / 1000)
        try:
            response, address = policy.transport.open(
                method, u.scheme, u.host, u.port, u.path + (f"?{u.query}" if u.query else ""),
                addresses, sent_headers, body, remaining)
        except httpx.HTTPError as exc:
            code = ErrorCode.TIMEOUT if isinstance(exc, httpx.TimeoutException) \
                else ErrorCode.PROVIDER_UNAVAILABLE
            raise Refused(PolicyEngineError(code, f"`{meta['url']}` is unreachable")) from None
        meta["address"] = str(address)
        with closing(response):
            meta["status"] = response.status_code
            try:
                check_mime(vetted.mime, response.headers.get("content-type"))
            except PolicyEngineError as exc:
                raise Refused(exc) from None
            lines = [f"HTTP/1.1 {response.status_code} {response.reason_phrase}\r\n"]
            lines += [f"{k}: {v}\r\n" for k, v in response.headers.multi_items()
                      if k.lower() not in HOP_BY_HOP]
            lines.append("Connection: close\r\n\r\n")
            answer = "".join(lines).encode("latin-1")
            limit = policy.cap("max_bytes_in", vetted.max_bytes_in)
            # the status line and headers come in with the body: nothing of an answer whose
            # head alone passes the limit reaches the client, so it can still be refused
            refusal = policy.meter.charge("in", len(answer), limit,
                                          "response status line and headers")
            if refusal is not None:
                raise Refused(refusal)
            received = meta["bytes_in"] = len(answer)  # INVARIANT: meta = what was charged
            self.wfile.write(answer)
            for chunk in response.iter_raw():
                left = policy.meter.left("in", limit)
                part = chunk if left is None else chunk[:left]  # cut at the limit exactly
                if (time.monotonic() > policy.deadline
                        or not policy.meter.take("in", len(part), limit)):
                    meta["cut_off"] = True
                    break
                received = meta["bytes_in"] = received + len(part)
                self.wfile.write(part)
                if len(part) < len(chunk):
                    meta["cut_off"] = True
                    break

    def _tunnel(self, head: Head, meta: dict[str, object]) -> None:
        """CONNECT: decided as an https GET of the authority, then opened only where the rule
        admits every request (the tunnel's content is opaque), carrying TLS only, within the
        call's byte limits (the CONNECT head and the proxy's 200 count too)."""
        op = NetHttpOp(method="GET", url=f"https://{head.target}/")
        vetted, addresses = self._vet(op, meta)
        policy = self.server.policy
        why = tunnel_refusal(policy.guard, policy.profile, vetted)
        if why is not None:
            raise Refused(PolicyEngineError(ErrorCode.CAPABILITY_BLOCKED,
                                            f"CONNECT to `{meta['url']}` refused: {why}"))
        meter = policy.meter
        out_cap = policy.cap("max_bytes_out", vetted.max_bytes_out)
        in_cap = policy.cap("max_bytes_in", vetted.max_bytes_in)
        left = meter.left("out", out_cap)
        if left is not None and head.size > left:  # before dialing: no connection for nothing
            raise Refused(PolicyEngineError(
                ErrorCode.CAPABILITY_BLOCKED, f"CONNECT request of {head.size} bytes exceeds "
                f"what is left of max_bytes_out ({left} bytes)"))
        port = vetted.url.port
        upstream: socket.socket | None = None
        for a in addresses:
            try:
                upstream = socket.create_connection((str(a), port), timeout=10)
                # the tunnel relays small TLS records: no waiting for the delayed ACK
                upstream.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                meta["address"] = str(a)
                break
            except OSError:
                continue
        if upstream is None:
            raise Refused(PolicyEngineError(ErrorCode.PROVIDER_UNAVAILABLE,
                                            f"`{meta['url']}` is unreachable"))
        with upstream:
            refusal = meter.charge("out", head.size, out_cap, "CONNECT request")
            if refusal is None:
                meta["bytes_out"] = head.size
                refusal = meter.charge("in", len(ESTABLISHED), in_cap, "CONNECT answer")
            if refusal is not None:
                raise Refused(refusal)
            meta.update(status=200, bytes_in=len(ESTABLISHED))
            self.wfile.write(ESTABLISHED)

            def charge(outbound: bool, amount: int) -> bool:
                return meter.take("out" if outbound else "in", amount, out_cap if outbound
                                  else in_cap)

            up, down, stop = _splice(self.connection, upstream, policy.deadline, charge)
        meta.update(bytes_out=head.size + up, bytes_in=len(ESTABLISHED) + down)
        if stop == "limit":
            meta["cut_off"] = True
        elif stop == "not-tls":
            # recorded like any refusal; the client already had its 200, so it sees a close
            meta["refused"] = ErrorCode.CAPABILITY_BLOCKED.value

    def _fail(self, refused: Refused) -> None:
        """Answer the refusal, then read and drop (bounded) what the client is still sending:
        closing on unread bytes would reset the connection and lose the answer."""
        exc, status = refused.error, refused.status
        body = f"{exc.public_message()}\n".encode()
        with suppress(OSError, ValueError):
            self.wfile.write(
                f"HTTP/1.1 {status} {reason_phrase(status)}\r\nContent-Type: text/plain\r\n"
                f"X-Policy-Engine-Code: {exc.code.value}\r\nContent-Length: {len(body)}\r\n"
                "Connection: close\r\n\r\n".encode() + body)
            self.connection.shutdown(socket.SHUT_WR)
            self.connection.settimeout(DRAIN_SECONDS)
            end, left = time.monotonic() + DRAIN_SECONDS, DRAIN_BYTES
            while left > 0 and time.monotonic() < end:
                chunk = self.rfile.read1(min(left, 65536))
                if not chunk:
                    break
                left -= len(chunk)


def _splice(a: socket.socket, b: socket.socket, deadline: float,
            charge: Callable[[bool, int], bool]) -> tuple[int, int, str | None]:
    """Copy both ways until both sides close, the deadline passes, nothing moves for
    ``IDLE_SECONDS``, one side closed ``LINGER_SECONDS`` ago, or ``charge`` refuses a chunk
    (``charge(outbound, size)``: the byte limits; the refused chunk is not forwarded).

    The client's first bytes must open a TLS handshake: a tunnel is decided as ``https``, so
    plain HTTP inside it (whose method and path the proxy would otherwise never see) is cut.

    :return: bytes forwarded from ``a`` to ``b`` and back, and why it stopped early
        (``"limit"``, ``"not-tls"``) or ``None``.
    """
    counts = {a: 0, b: 0}
    peer = {a: b, b: a}
    open_ = [a, b]
    last = time.monotonic()
    end = deadline
    first = True
    while open_:
        now = time.monotonic()
        if now >= end or now - last > IDLE_SECONDS:
            break
        ready, _, _ = select.select(open_, [], [], min(1.0, end - now))
        for s in ready:
            try:
                data = s.recv(65536)
            except OSError:
                data = b""
            if not data:
                open_.remove(s)
                end = min(end, time.monotonic() + LINGER_SECONDS)
                with suppress(OSError):
                    peer[s].shutdown(socket.SHUT_WR)
                continue
            if s is a and first:
                first = False
                if not _tls_handshake(data):
                    return counts[a], counts[b], "not-tls"
            if not charge(s is a, len(data)):
                return counts[a], counts[b], "limit"
            last = time.monotonic()
            counts[s] += len(data)
            peer[s].sendall(data)
    return counts[a], counts[b], None


def _tls_handshake(data: bytes) -> bool:
    """The first bytes of a TLS handshake record: content type 22, version major 3."""
    return data[0] == 0x16 and (len(data) < 2 or data[1] == 0x03)


def _shown(url: str) -> str:
    try:
        u = httpx.URL(url)
        return redacted_url(u.scheme, u.host, u.port or 0, u.path)
    except (httpx.InvalidURL, ValueError, TypeError):
        return "<unparsed>"


class ProxyServer(socketserver.ThreadingUnixStreamServer):
    """The proxy listening on a Unix socket; one thread per connection."""

    daemon_threads = True
    block_on_close = False

    def __init__(self, path: str, policy: ProxyPolicy) -> None:
        self.policy = policy
        self.active = 0
        self.idle = threading.Condition()
        super().__init__(path, ProxyHandler)

    def quiesce(self, timeout: float) -> bool:
        """Wait until no connection is being handled (so every record is in); False on timeout."""
        with self.idle:
            return self.idle.wait_for(lambda: self.active == 0, timeout)


def serve_in_thread(server: ProxyServer) -> threading.Thread:
    """Start ``server`` in a daemon thread; ``server.shutdown()`` stops it.

    The proxy lives for one call and ``shutdown`` waits for the next poll, so the poll is
    short (10 ms): a 100 ms poll added ~100 ms to every restricted-mode call.
    """
    t = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.01},
                         daemon=True, name="policy-engine-netproxy")
    t.start()
    return t
