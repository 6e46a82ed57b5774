"""Loopback test servers: real HTTP(S) servers on 127.0.0.0/8 ephemeral ports, in threads.

Each server records what it saw (requests, bytes sent, whether the peer hung up early) so tests
can assert on the server side. Every socket has a timeout and every thread is a daemon, so a
failing test never leaves anything running.
"""

from __future__ import annotations

import datetime
import ipaddress
import socket
import ssl
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import TracebackType

from policy_engine.compiler import compile_files
from policy_engine.guard import Guard
from policy_engine.model import (
    SYSTEM_DEFAULT_LIMITS,
    AllowLists,
    Budget,
    Capability,
    CapabilityKind,
    DenyLists,
    Grant,
    Manifest,
    Mappings,
    NetHttpCapability,
    NetworkMode,
    Profile,
    ProfileCapability,
    RuleRef,
    SafetyClass,
    SideEffect,
)
from policy_engine.profile import ProfileBuilder

Route = Callable[["Handler"], None]


@dataclass
class Seen:
    """What a server observed."""

    requests: list[tuple[str, str, dict[str, str]]] = field(default_factory=list)
    bytes_sent: int = 0
    peer_closed_early: threading.Event = field(default_factory=threading.Event)
    done: threading.Event = field(default_factory=threading.Event)


class Handler(BaseHTTPRequestHandler):
    """Dispatches on the path (without query) to the server's routes."""

    protocol_version = "HTTP/1.1"
    timeout = 20
    server: _Server

    def log_message(self, format: str, *args: object) -> None:
        return

    def setup(self) -> None:
        super().setup()
        # headers and body go out in separate writes: without this, Nagle plus the client's
        # delayed ACK adds ~40 ms to a keep-alive response
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def _dispatch(self) -> None:
        path = self.path.split("?", 1)[0]
        length = int(self.headers.get("content-length") or 0)
        self.body = self.rfile.read(length) if length else b""
        self.server.seen.requests.append((self.command, self.path, dict(self.headers.items())))
        route = self.server.routes.get(path)
        if route is None:
            send(self, 404, "text/plain", b"not found")
            return
        route(self)

    do_GET = do_POST = do_HEAD = do_PUT = do_DELETE = _dispatch


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    routes: dict[str, Route]
    seen: Seen

    def handle_error(self, request: object, client_address: object) -> None:
        # a client hanging up is what many tests do on purpose; the default handler prints a
        # traceback to whatever stderr is captured at that moment, often another test's
        if isinstance(sys.exc_info()[1], (BrokenPipeError, ConnectionResetError,
                                           ConnectionAbortedError, TimeoutError)):
            self.seen.peer_closed_early.set()
            return
        super().handle_error(request, client_address)  # type: ignore[arg-type]


def send(h: Handler, status: int, ctype: str | None, body: bytes,
         headers: dict[str, str] | None = None) -> None:
    """A complete response with a ``Content-Length``."""
    h.send_response(status)
    if ctype:
        h.send_header("Content-Type", ctype)
    h.send_header("Content-Length", str(len(body)))
    for k, v in (headers or {}).items():
        h.send_header(k, v)
    h.end_headers()
    if h.command != "HEAD":
        h.wfile.write(body)


def redirect(to: str, status: int = 302) -> Route:
    """A route answering ``status`` with ``Location: to``."""
    return lambda h: send(h, status, "text/plain", b"moved", {"Location": to})


def endless(chunk: int = 64 * 1024, limit: int = 10 * 1024**3, delay: float = 0.0,
            declare: bool = False) -> Route:
    """A body of ``limit`` bytes (10 GB by default) streamed until the peer hangs up.

    Without ``declare`` there is no ``Content-Length``: the body ends when the connection does.
    """
    def route(h: Handler) -> None:
        h.send_response(200)
        h.send_header("Content-Type", "application/octet-stream")
        if declare:
            h.send_header("Content-Length", str(limit))
        else:
            h.send_header("Connection", "close")
        h.end_headers()
        h.close_connection = True
        block = b"x" * chunk
        sent = 0
        try:
            while sent < limit:
                h.wfile.write(block)
                sent += len(block)
                h.server.seen.bytes_sent = sent
                if delay:
                    time.sleep(delay)
        except (BrokenPipeError, ConnectionResetError, TimeoutError, OSError):
            h.server.seen.peer_closed_early.set()
        finally:
            h.server.seen.done.set()
    return route


class LoopbackServer:
    """An HTTP (or HTTPS, with ``tls``) server on ``host``:``port`` (0 = ephemeral)."""

    def __init__(self, routes: dict[str, Route], host: str = "127.0.0.1", port: int = 0,
                 tls: ssl.SSLContext | None = None) -> None:
        self.httpd = _Server((host, port), Handler)
        self.httpd.routes = routes
        self.httpd.seen = Seen()
        if tls is not None:
            self.httpd.socket = tls.wrap_socket(self.httpd.socket, server_side=True)
        self.host = host
        self.port = self.httpd.server_address[1]
        self.scheme = "https" if tls else "http"
        self._thread = threading.Thread(target=self.httpd.serve_forever,
                                        kwargs={"poll_interval": 0.05}, daemon=True)

    @property
    def seen(self) -> Seen:
        return self.httpd.seen

    def url(self, path: str, host: str | None = None) -> str:
        return f"{self.scheme}://{host or self.host}:{self.port}{path}"

    def __enter__(self) -> LoopbackServer:
        self._thread.start()
        return self

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self._thread.join(timeout=10)


def self_signed(tmp: Path, names: tuple[str, ...] = ("localhost",),
                ips: tuple[str, ...] = ("127.0.0.1",)) -> tuple[Path, Path]:
    """Generate a self-signed certificate (with ``cryptography``); return (cert, key) paths."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, names[0])])
    now = datetime.datetime.now(datetime.UTC)
    san = [x509.DNSName(n) for n in names] + [
        x509.IPAddress(ipaddress.ip_address(i)) for i in ips]
    cert = (
        x509.CertificateBuilder().subject_name(subject).issuer_name(subject)
        .public_key(key.public_key()).serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(hours=1))
        .add_extension(x509.SubjectAlternativeName(san), critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = tmp / "cert.pem", tmp / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption()))
    return cert_path, key_path


def server_tls(cert: Path, key: Path) -> ssl.SSLContext:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(cert, key)
    return ctx


def client_tls(cert: Path) -> ssl.SSLContext:
    return ssl.create_default_context(cafile=str(cert))


def http_profile(
    *hosts: str, ports: tuple[int, ...] = (), schemes: tuple[str, ...] = ("http", "https"),
    methods: tuple[str, ...] = ("GET", "HEAD", "POST"), mime: tuple[str, ...] = (),
    network: str = "on", **limits: int,
) -> Profile:
    """A profile with one ``net.http`` permit for ``hosts`` (what the profile builder emits)."""
    cap = NetHttpCapability(hosts=hosts, ports=ports, schemes=schemes, methods=methods, mime=mime)
    lim = SYSTEM_DEFAULT_LIMITS.model_copy(update=limits)
    return Profile(
        tenant="acme", subject_id="agent:1", tool_name="fetch", call_id="call-1",
        capabilities=(ProfileCapability(
            kind=CapabilityKind.NET_HTTP, all_of=(cap,),
            rule=RuleRef(id="net-permit", file="policy.sbpolicy", line=1, column=1)),),
        granted=(cap,), declared=(cap,), safety=SafetyClass.LOW,
        side_effects=(SideEffect.NETWORK,), limits=lim, budget=Budget(), allow=AllowLists(),
        deny=DenyLists(), mappings=Mappings(), network=NetworkMode(network),
        timeout_ms=lim.timeout_ms or 60_000, consent_required=False,
        expires_at=int(time.time() * 1000) + 3_600_000, policy_name="acme/agents",
        policy_version="1.0.0", policy_version_hash="0" * 64, manifest_version="1.0.0",
    )


def compiled_profile(
    tmp: Path, rules: str, caps: tuple[Capability, ...], *, tool: str = "fetch",
    network: str = "on", side_effects: tuple[SideEffect, ...] = (SideEffect.NETWORK,),
) -> tuple[Profile, Guard]:
    """A profile built the production way from a real policy file, and the guard for it.

    ``rules`` is the body of a ``.sbpolicy`` file (the header is added) written into ``tmp``; the
    grant and the manifest both ask for ``caps``. The returned ``Guard`` holds the compiled
    policy set: what the orchestrator passes to executors as ``ExecContext.guard``.
    """
    path = tmp / "policy.sbpolicy"
    path.write_text(f'policy "test/executors" version "1.0.0"\n\n{rules}\n')
    ps = compile_files([path])
    grant = Grant(tenant="acme", subject_id="agent:1", tool_name=tool, call_id="call-1",
                  capabilities=caps, expires_at=int(time.time() * 1000) + 3_600_000)
    manifest = Manifest(name=tool, version="1.0.0", permissions=caps,
                        side_effects=side_effects, network=NetworkMode(network))
    return ProfileBuilder(ps).build(grant, manifest), Guard(ps)
