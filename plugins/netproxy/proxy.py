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

from plugins.executor_http.body import check_mime
from plugins.executor_http.executor import clean_request_headers, redacted_url
from plugins.executor_http.resolve import (
    IPAddress,
    Resolver,
    Vetted,
    pin,
    tunnel_refusal,
    vet,
)
from plugins.executor_http.transport import PinnedTransport
from policy_engine.errors import REGISTRY, ErrorCode, PolicyEngineError
from policy_engine.executor import Decider
from policy_engine.model import Limits, NetHttpOp, Profile, SideEffect, SideEffectRec

MAX_LINE = 8192
MAX_HEADERS = 100
IDLE_SECONDS = 60.0
LINGER_SECONDS = 10.0
HOP_BY_HOP = frozenset({"connection", "keep-alive", "proxy-connection", "transfer-encoding",
                        "te", "trailer", "upgrade", "proxy-authenticate", "proxy-authorization"})


class Meter:
    """The bytes the whole run moved through the proxy, each way: one call's ``bytes_in`` and
    ``bytes_out`` are totals over all its requests and tunnels, not per connection.

    :param consume: the call's budget charge (``ExecContext.consume``), called for every chunk
        let through, so the call's usage and its grant's budget count proxied traffic too.
    """

    def __init__(self, consume: Callable[[str, int], None] | None = None) -> None:
        self.bytes_in = 0
        self.bytes_out = 0
        self.refusal: PolicyEngineError | None = None
        self._consume = consume
        self._lock = threading.Lock()

    def take(self, direction: str, amount: int, limit: int | None) -> bool:
        """Charge ``amount`` bytes ``"in"`` or ``"out"`` unless that would pass ``limit`` or
        the budget refuses (kept in ``refusal``)."""
        with self._lock:
            used = self.bytes_in if direction == "in" else self.bytes_out
            if limit is not None and used + amount > limit:
                return False
            if self._consume is not None and amount:
                try:
                    self._consume(f"bytes_{direction}", amount)
                except PolicyEngineError as exc:
                    self.refusal = exc
                    return False
            if direction == "in":
                self.bytes_in += amount
            else:
                self.bytes_out += amount
            return True

    def left(self, direction: str, limit: int | None) -> int | None:
        """What remains of ``limit`` in ``direction`` (``None``: unlimited)."""
        with self._lock:
            used = self.bytes_in if direction == "in" else self.bytes_out
        return None if limit is None else max(limit - used, 0)


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


class _Refused(Exception):
    def __init__(self, exc: PolicyEngineError) -> None:
        super().__init__(exc.reason)
        self.error = exc


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
            method, target, headers = self._read_head()
            meta["method"] = method
            if method == "CONNECT":
                self._tunnel(target, meta)
            else:
                self._forward(method, target, headers, meta)
        except _Refused as r:
            meta["refused"] = r.error.code.value
            meta.setdefault("url", "<unparsed>")
            self._record(meta)  # INVARIANT: recorded before the client can see the refusal
            self._fail(r.error)
            return
        except (OSError, ValueError):
            meta["aborted"] = True
        self._record(meta)

    def _record(self, meta: dict[str, object]) -> None:
        if "url" in meta:
            self.server.policy.record(SideEffectRec(kind=SideEffect.NETWORK, meta=dict(meta)))

    def _read_head(self) -> tuple[str, str, list[tuple[str, str]]]:
        line = self.rfile.readline(MAX_LINE + 1)
        parts = line.decode("latin-1").split()
        if len(line) > MAX_LINE or len(parts) != 3 or not parts[2].startswith("HTTP/1."):
            raise _Refused(PolicyEngineError(ErrorCode.SCHEMA_VALIDATION_FAILED,
                                             "malformed proxy request line"))
        headers: list[tuple[str, str]] = []
        while True:
            raw = self.rfile.readline(MAX_LINE + 1)
            if raw in (b"\r\n", b"\n", b""):
                break
            name, sep, value = raw.decode("latin-1").partition(":")
            if not sep or len(headers) >= MAX_HEADERS or len(raw) > MAX_LINE:
                raise _Refused(PolicyEngineError(ErrorCode.SCHEMA_VALIDATION_FAILED,
                                                 "malformed proxy request header"))
            headers.append((name.strip(), value.strip()))
        return parts[0].upper(), parts[1], headers

    def _vet(self, op: NetHttpOp,
             meta: dict[str, object]) -> tuple[Vetted, tuple[IPAddress, ...]]:
        policy = self.server.policy
        try:
            vetted = vet(policy.guard, policy.profile, op)
            u = vetted.url
            meta["url"] = redacted_url(u.scheme, u.host, u.port, u.path)
            pinned = pin(u.host, u.port, u.ip, vetted.hosts, policy.resolver)
        except PolicyEngineError as exc:
            meta.setdefault("url", _shown(op.url))
            raise _Refused(exc) from None
        meta["addresses"] = [str(a) for a in pinned.addresses]
        return vetted, pinned.addresses

    def _forward(self, method: str, target: str, headers: list[tuple[str, str]],
                 meta: dict[str, object]) -> None:
        if not target.startswith("http://"):
            meta["url"] = _shown(target)
            raise _Refused(PolicyEngineError(
                ErrorCode.CAPABILITY_BLOCKED, "only absolute http:// targets are proxied; "
                "https goes through CONNECT"))
        # hop-by-hop headers belong to the client's connection to the proxy; Host and the
        # length are the URL's and the body's (the guard refuses a call that sets them)
        kept = {k: v for k, v in headers
                if k.lower() not in HOP_BY_HOP and k.lower() not in ("host", "content-length")}
        length = next((v for k, v in headers if k.lower() == "content-length"), "0")
        if any(k.lower() == "transfer-encoding" for k, _ in headers) or not length.isdigit():
            meta["url"] = _shown(target)
            raise _Refused(PolicyEngineError(ErrorCode.SCHEMA_VALIDATION_FAILED,
                                             "request bodies need a Content-Length"))
        policy = self.server.policy
        cap = policy.meter.left("out", policy.cap("max_bytes_out", None))
        if cap is not None and int(length) > cap:  # checked before reading: never buffered
            meta["url"] = _shown(target)
            raise _Refused(PolicyEngineError(
                ErrorCode.CAPABILITY_BLOCKED,
                f"request body of {length} bytes exceeds what is left of max_bytes_out "
                f"({cap} bytes)"))
        body = self.rfile.read(int(length)) if int(length) else b""
        op = NetHttpOp(method=method, url=target, headers=kept,
                       body_b64=base64.b64encode(body).decode() if body else None)
        vetted, addresses = self._vet(op, meta)
        try:
            sent_headers = clean_request_headers(kept)
        except PolicyEngineError as exc:
            raise _Refused(exc) from None
        if not policy.meter.take("out", len(body), policy.cap("max_bytes_out",
                                                              vetted.max_bytes_out)):
            raise _Refused(policy.meter.refusal or PolicyEngineError(
                ErrorCode.CAPABILITY_BLOCKED,
                f"request body of {len(body)} bytes exceeds what is left of max_bytes_out"))
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
            raise _Refused(PolicyEngineError(code, f"`{meta['url']}` is unreachable")) from None
        meta.update(address=str(address), bytes_out=len(body))
        with closing(response):
            meta["status"] = response.status_code
            try:
                check_mime(vetted.mime, response.headers.get("content-type"))
            except PolicyEngineError as exc:
                raise _Refused(exc) from None
            head = [f"HTTP/1.1 {response.status_code} {response.reason_phrase}\r\n"]
            head += [f"{k}: {v}\r\n" for k, v in response.headers.multi_items()
                     if k.lower() not in HOP_BY_HOP]
            head.append("Connection: close\r\n\r\n")
            self.wfile.write("".join(head).encode("latin-1"))
            sent = 0
            limit = policy.cap("max_bytes_in", vetted.max_bytes_in)
            for chunk in response.iter_raw():
                if (not policy.meter.take("in", len(chunk), limit)
                        or time.monotonic() > policy.deadline):
                    meta["cut_off"] = True
                    break
                sent += len(chunk)
                self.wfile.write(chunk)
            meta["bytes_in"] = sent

    def _tunnel(self, target: str, meta: dict[str, object]) -> None:
        """CONNECT: decided as an https GET of the authority, then opened only where the rule
        admits every request (the tunnel's content is opaque), carrying TLS only, within the
        call's byte limits."""
        op = NetHttpOp(method="GET", url=f"https://{target}/")
        vetted, addresses = self._vet(op, meta)
        policy = self.server.policy
        why = tunnel_refusal(policy.guard, policy.profile, vetted)
        if why is not None:
            raise _Refused(PolicyEngineError(ErrorCode.CAPABILITY_BLOCKED,
                                             f"CONNECT to `{meta['url']}` refused: {why}"))
        port = vetted.url.port
        upstream: socket.socket | None = None
        for a in addresses:
            try:
                upstream = socket.create_connection((str(a), port), timeout=10)
                meta["address"] = str(a)
                break
            except OSError:
                continue
        if upstream is None:
            raise _Refused(PolicyEngineError(ErrorCode.PROVIDER_UNAVAILABLE,
                                             f"`{meta['url']}` is unreachable"))
        meta["status"] = 200
        self.wfile.write(b"HTTP/1.1 200 Connection Established\r\n\r\n")
        meter = policy.meter
        out_cap = policy.cap("max_bytes_out", vetted.max_bytes_out)
        in_cap = policy.cap("max_bytes_in", vetted.max_bytes_in)

        def charge(outbound: bool, amount: int) -> bool:
            return meter.take("out" if outbound else "in", amount, out_cap if outbound
                              else in_cap)

        with upstream:
            up, down, stop = _splice(self.connection, upstream, policy.deadline, charge)
        meta.update(bytes_out=up, bytes_in=down)
        if stop == "limit":
            meta["cut_off"] = True
        elif stop == "not-tls":
            # recorded like any refusal; the client already had its 200, so it sees a close
            meta["refused"] = ErrorCode.CAPABILITY_BLOCKED.value

    def _fail(self, exc: PolicyEngineError) -> None:
        status = REGISTRY[exc.code].http_status
        body = f"{exc.public_message()}\n".encode()
        with suppress(OSError):
            self.wfile.write(
                f"HTTP/1.1 {status} {_reason(status)}\r\nContent-Type: text/plain\r\n"
                f"X-Policy-Engine-Code: {exc.code.value}\r\nContent-Length: {len(body)}\r\n"
                "Connection: close\r\n\r\n".encode() + body)


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


def _reason(status: int) -> str:
    return {403: "Forbidden", 422: "Unprocessable Content", 429: "Too Many Requests",
            500: "Internal Server Error", 503: "Service Unavailable",
            504: "Gateway Timeout"}.get(status, "Error")


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
