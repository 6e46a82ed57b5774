"""The proxy's wire rules: bounded request heads, refusals with their HTTP status, the byte meter.

Every byte the sandboxed client and the proxy exchange for a request the proxy lets through
counts: the request line, headers and body the client sent (``bytes_out``) and the status line,
headers and body the proxy relays back (``bytes_in``), tunnels included. A refused request costs
nothing: none of it reached the server.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from io import BufferedIOBase

from policy_engine.errors import REGISTRY, ErrorCode, PolicyEngineError

MAX_LINE = 8192
"""Longest request line or header line, terminator included (Apache's and nginx's order)."""
MAX_HEAD = 32768
"""Longest request head: request line, header lines and the blank line together."""
MAX_HEADERS = 100


class Refused(Exception):
    """A refusal answered to the client: ``error``'s code, and ``status`` when the registry's
    does not say enough (431 or 414 for an oversized head)."""

    def __init__(self, error: PolicyEngineError, status: int | None = None) -> None:
        super().__init__(error.reason)
        self.error = error
        self.status = status if status is not None else REGISTRY[error.code].http_status


@dataclass(frozen=True, slots=True)
class Head:
    """A parsed request head and ``size``, the bytes it took on the wire."""

    method: str
    target: str
    headers: list[tuple[str, str]]
    size: int


def read_head(rfile: BufferedIOBase) -> Head:
    """Read one request head, refusing (``SCHEMA.VALIDATION_FAILED``) one that is malformed,
    has a request line over ``MAX_LINE`` (414), or header lines over ``MAX_LINE``, over
    ``MAX_HEAD`` in all or more than ``MAX_HEADERS`` of them (431)."""
    line = rfile.readline(MAX_LINE + 1)
    if len(line) > MAX_LINE:
        raise Refused(PolicyEngineError(
            ErrorCode.SCHEMA_VALIDATION_FAILED,
            f"proxy request line longer than {MAX_LINE} bytes: send large data in a body"), 414)
    parts = line.decode("latin-1").split()
    if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
        raise Refused(PolicyEngineError(ErrorCode.SCHEMA_VALIDATION_FAILED,
                                        "malformed proxy request line"))
    size = len(line)
    headers: list[tuple[str, str]] = []
    while True:
        raw = rfile.readline(MAX_LINE + 1)
        size += len(raw)
        if len(raw) > MAX_LINE or size > MAX_HEAD or len(headers) >= MAX_HEADERS and raw.strip():
            raise Refused(PolicyEngineError(
                ErrorCode.SCHEMA_VALIDATION_FAILED,
                f"proxy request headers too large (at most {MAX_HEADERS} lines of "
                f"{MAX_LINE} bytes, {MAX_HEAD} bytes in all): send large data in a body"), 431)
        if raw in (b"\r\n", b"\n", b""):
            break
        name, sep, value = raw.decode("latin-1").partition(":")
        if not sep:
            raise Refused(PolicyEngineError(ErrorCode.SCHEMA_VALIDATION_FAILED,
                                            "malformed proxy request header"))
        headers.append((name.strip(), value.strip()))
    return Head(parts[0].upper(), parts[1], headers, size)


class Meter:
    """The bytes the whole run moved through the proxy, each way: one call's ``bytes_in`` and
    ``bytes_out`` are totals over all its requests and tunnels, not per connection.

    :param consume: the call's budget charge (``ExecContext.consume``), called for every chunk
        let through, so the call's usage and its grant's budget count proxied traffic too.
    """

    def __init__(self, consume: Callable[[str, int], None] | None = None) -> None:
        self.bytes_in = 0
        self.bytes_out = 0
        self._consume = consume
        self._lock = threading.Lock()

    def charge(self, direction: str, amount: int, limit: int | None,
               what: str) -> PolicyEngineError | None:
        """Charge ``amount`` bytes ``"in"`` or ``"out"``; or, charging nothing, the refusal:
        ``SANDBOX.CAPABILITY_BLOCKED`` past ``limit`` (``what`` names the bytes in its
        message), the budget's own refusal."""
        with self._lock:
            used = self.bytes_in if direction == "in" else self.bytes_out
            if limit is not None and used + amount > limit:
                return PolicyEngineError(
                    ErrorCode.CAPABILITY_BLOCKED,
                    f"{what} of {amount} bytes exceeds what is left of max_bytes_{direction} "
                    f"({max(limit - used, 0)} bytes)")
            if self._consume is not None and amount:
                try:
                    self._consume(f"bytes_{direction}", amount)
                except PolicyEngineError as exc:
                    return exc
            if direction == "in":
                self.bytes_in += amount
            else:
                self.bytes_out += amount
            return None

    def take(self, direction: str, amount: int, limit: int | None) -> bool:
        """``charge`` as a yes or no (a tunnel's chunks: a refusal closes the tunnel)."""
        return self.charge(direction, amount, limit, "chunk") is None

    def left(self, direction: str, limit: int | None) -> int | None:
        """What remains of ``limit`` in ``direction`` (``None``: unlimited)."""
        with self._lock:
            used = self.bytes_in if direction == "in" else self.bytes_out
        return None if limit is None else max(limit - used, 0)


def reason_phrase(status: int) -> str:
    """The reason phrase of the statuses the proxy answers with itself."""
    return {403: "Forbidden", 414: "URI Too Long", 422: "Unprocessable Content",
            429: "Too Many Requests", 431: "Request Header Fields Too Large",
            500: "Internal Server Error", 503: "Service Unavailable",
            504: "Gateway Timeout"}.get(status, "Error")
