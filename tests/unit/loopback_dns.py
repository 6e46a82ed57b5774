"""A real DNS server on a loopback UDP port, and a resolver that asks it (nothing else).

Tests use the pair as the proxy's and the executors' ``Resolver``: names resolve over real UDP
DNS messages to whatever addresses the test chose (metadata, loopback, a public/private mix),
without ``/etc/hosts`` and without any packet leaving loopback.
"""

from __future__ import annotations

import ipaddress
import secrets
import socket
import struct
import threading
from collections.abc import Mapping, Sequence
from types import TracebackType

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
A, AAAA = 1, 28


def _qname(name: str) -> bytes:
    return b"".join(bytes([len(p)]) + p.encode("ascii") for p in name.rstrip(".").split(".")) \
        + b"\0"


def _read_name(msg: bytes, i: int) -> tuple[str, int]:
    labels: list[str] = []
    end: int | None = None
    while True:
        n = msg[i]
        if n & 0xC0 == 0xC0:  # compression pointer
            if end is None:
                end = i + 2
            i = ((n & 0x3F) << 8) | msg[i + 1]
            continue
        if n == 0:
            return ".".join(labels), (end if end is not None else i + 1)
        labels.append(msg[i + 1:i + 1 + n].decode("latin-1"))
        i += 1 + n


class LoopbackDns:
    """Answers A/AAAA queries for ``zone`` (name → addresses) on ``127.0.0.1:port``; NXDOMAIN
    for every other name. ``queries`` lists the names asked, in order."""

    def __init__(self, zone: Mapping[str, Sequence[str]]) -> None:
        self.zone = {k.lower(): [ipaddress.ip_address(a) for a in v] for k, v in zone.items()}
        self.queries: list[str] = []
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.settimeout(0.2)
        self.port: int = self.sock.getsockname()[1]
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                msg, peer = self.sock.recvfrom(2048)
            except TimeoutError:
                continue
            except OSError:
                return
            name, end = _read_name(msg, 12)
            qtype = struct.unpack(">H", msg[end:end + 2])[0]
            self.queries.append(name)
            question = msg[12:end + 4]
            found = self.zone.get(name.lower())
            answers = [ip for ip in found or () if (ip.version == 4) == (qtype == A)]
            flags = 0x8180 if found is not None else 0x8183  # NOERROR / NXDOMAIN
            out = msg[:2] + struct.pack(">HHHHH", flags, 1, len(answers), 0, 0) + question
            for ip in answers:
                out += struct.pack(">HHHIH", 0xC00C, qtype, 1, 5, len(ip.packed)) + ip.packed
            self.sock.sendto(out, peer)

    def resolve(self, host: str, port: int) -> list[IPAddress]:
        """A ``Resolver``: ask this server for A then AAAA records; ``OSError`` when none."""
        found: list[IPAddress] = []
        for qtype in (A, AAAA):
            ident = secrets.randbits(16)
            query = struct.pack(">HHHHHH", ident, 0x0100, 1, 0, 0, 0) + _qname(host) \
                + struct.pack(">HH", qtype, 1)
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
                s.settimeout(2)
                s.sendto(query, ("127.0.0.1", self.port))
                msg = s.recv(2048)
            got_id, flags, _qd, ancount = struct.unpack(">HHHH", msg[:8])
            if got_id != ident or flags & 0x000F not in (0, 3):
                raise OSError(f"bad DNS answer for {host}")
            _, i = _read_name(msg, 12)
            i += 4
            for _ in range(ancount):
                _, i = _read_name(msg, i)
                rtype, _cls, _ttl, size = struct.unpack(">HHIH", msg[i:i + 10])
                i += 10
                if rtype in (A, AAAA):
                    found.append(ipaddress.ip_address(msg[i:i + size]))
                i += size
        if not found:
            raise socket.gaierror(socket.EAI_NONAME, f"{host} does not resolve")
        return found

    def __enter__(self) -> LoopbackDns:
        self._thread.start()
        return self

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None,
                 tb: TracebackType | None) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self.sock.close()
