"""The ``net.http`` executor: guard-vetted hops over pinned addresses, limits while streaming.

Each hop (the request, then every redirect) is decided by the guard, its host resolved once, every
address vetted, and the vetted address dialed; MIME and byte limits are enforced while the body
streams, and the result carries a digest and the first bytes, never the whole body.
"""

from __future__ import annotations

import base64
import binascii
import ssl
import time
from collections.abc import Iterator
from contextlib import closing
from typing import TYPE_CHECKING

from plugins.executor_http.redirects import NextHop, next_hop
from policy_engine.errors import ErrorCode, PolicyEngineError
from policy_engine.executor import Decider, ExecContext, ExecutorCapabilities
from policy_engine.guard.guard import Guard
from policy_engine.lazy import lazy_module
from policy_engine.model import (
    ExecOp,
    ExecResult,
    NetHttpOp,
    NetworkMode,
    OpKind,
    Profile,
    SideEffect,
    SideEffectRec,
)
from policy_engine.netproxy.body import SELECTED_HEADERS, check_mime, read_bounded
from policy_engine.netproxy.headers import clean_request_headers, redacted_url
from policy_engine.netproxy.resolve import (
    Resolver,
    Vetted,
    addresses_text,
    bounded,
    guard_for,
    pin,
    system_resolver,
    vet,
)
from policy_engine.netproxy.transport import PinnedTransport

if TYPE_CHECKING:
    import httpx
else:  # with httpcore on the first request: a start that makes none does not import them
    httpx = lazy_module("httpx")

DEFAULT_HEAD_BYTES = 4096
DEFAULT_MAX_DEPTH = 3

def _target(path: str, query: str | None) -> str:
    if not query:
        return path or "/"
    return f"{path or '/'}{query if query.startswith('?') else '?' + query}"


def _transport_error(exc: httpx.HTTPError, where: str) -> PolicyEngineError:
    name = type(exc).__name__
    if isinstance(exc, httpx.TimeoutException):
        return PolicyEngineError(ErrorCode.TIMEOUT, f"`{where}` did not answer in time",
                                 audit={"error": name})
    return PolicyEngineError(ErrorCode.PROVIDER_UNAVAILABLE, f"`{where}` is unreachable",
                             audit={"error": name})


class HttpExecutor:
    """Serves ``net.http`` operations with httpx over a pinned transport.

    :param guard: decides the request and every redirect hop when the call's context carries no
        guard (``ExecContext.guard``, the orchestrator's policy-aware guard, always wins). It must
        hold the policy set whose conditions the profile's rules carry. Without either, a
        ``Guard()`` with no policy set is used: rules with a condition then never allow, and no
        private address is named by a policy rule (fail closed).
    :param resolver: name resolution, called once per hop (tests inject a stand-in for DNS).
    :param verify: TLS verification (see ``PinnedTransport``).
    :param head_bytes: how many leading body bytes a result carries (base64).
    """

    name = "http"
    capabilities = ExecutorCapabilities(
        op_kinds=frozenset({OpKind.NET_HTTP}),
        # every hop is guard-vetted and pinned on the host: as strict as `restricted` asks
        network_modes=frozenset({NetworkMode.ON, NetworkMode.RESTRICTED}),
        streaming_output=True,
    )
    charges_at_start = True  # ctx.started() before the first connection

    def __init__(
        self, guard: Decider | None = None, *, resolver: Resolver = system_resolver,
        verify: ssl.SSLContext | bool = True, head_bytes: int = DEFAULT_HEAD_BYTES,
    ) -> None:
        if head_bytes < 0:
            raise ValueError("head_bytes must be >= 0")
        self.guard: Decider = guard if guard is not None else Guard()
        self._resolver = resolver
        self._head = head_bytes
        self._transport = PinnedTransport(verify=verify)

    def close(self) -> None:
        self._transport.close()

    def execute(self, ctx: ExecContext, op: ExecOp) -> ExecResult:
        """Run ``op``: decided again by the guard (defence in depth), then every redirect hop."""
        if not isinstance(op, NetHttpOp):
            raise PolicyEngineError(ErrorCode.SCHEMA_VALIDATION_FAILED,
                                    f"the http executor does not serve `{op.kind}`")
        profile = ctx.profile
        guard = guard_for(ctx, self.guard)
        vetted = first = bounded(vet(guard, profile, op), ctx.limits)
        deadline = ctx.deadline
        if first.timeout_ms:
            deadline = min(deadline, time.monotonic() + first.timeout_ms / 1000)
        body = _decode_body(op.body_b64)
        if first.max_bytes_out is not None and len(body) > first.max_bytes_out:
            raise PolicyEngineError(
                ErrorCode.CAPABILITY_BLOCKED,
                f"request body of {len(body)} bytes exceeds max_bytes_out "
                f"({first.max_bytes_out} bytes)")
        max_depth = DEFAULT_MAX_DEPTH if first.max_depth is None else first.max_depth
        hop = NextHop(vetted.method, vetted.url.url, body, clean_request_headers(op.headers))
        hops = 0
        while True:
            u = vetted.url
            where = redacted_url(u.scheme, u.host, u.port, u.path)
            meta: dict[str, object] = {"method": hop.method, "url": where, "hop": hops}
            try:
                outcome = self._send(ctx, hop, vetted, first, where, meta, deadline, hops)
            except PolicyEngineError as exc:
                meta["refused"] = exc.code.value
                ctx.record_side_effect(SideEffectRec(kind=SideEffect.NETWORK, meta=meta))
                raise
            ctx.record_side_effect(SideEffectRec(kind=SideEffect.NETWORK, meta=meta))
            if isinstance(outcome, ExecResult):
                return outcome
            hops += 1
            try:
                if hops > max_depth:
                    raise PolicyEngineError(ErrorCode.CAPABILITY_BLOCKED,
                                            f"more than {max_depth} redirects (max_depth)")
                vetted = self._check_hop(guard, profile, outcome)
            except PolicyEngineError as exc:
                ctx.record_side_effect(SideEffectRec(kind=SideEffect.NETWORK, meta={
                    "method": outcome.method, "url": _redacted_text(outcome.url), "hop": hops,
                    "refused": exc.code.value}))
                raise
            hop = NextHop(outcome.method, vetted.url.url, outcome.body, outcome.headers)

    def _check_hop(self, guard: Decider, profile: Profile, hop: NextHop) -> Vetted:
        """Decide the next hop with the call's guard, exactly like a first request."""
        op = NetHttpOp(method=hop.method, url=hop.url, headers=dict(hop.headers),
                       body_b64=base64.b64encode(hop.body).decode() if hop.body else None)
        try:
            return vet(guard, profile, op)  # _send keeps each hop within ``first``
        except PolicyEngineError as exc:
            raise PolicyEngineError(
                exc.code, f"redirect to `{_redacted_text(hop.url)}` refused: {exc.reason}",
                audit=exc.audit) from None

    def _send(
        self, ctx: ExecContext, hop: NextHop, vetted: Vetted, first: Vetted, where: str,
        meta: dict[str, object], deadline: float, hops: int,
    ) -> ExecResult | NextHop:
        """One hop: pin, send, then either the next hop or the bounded read of the answer."""
        url = vetted.url
        max_in = _min(first.max_bytes_in, vetted.max_bytes_in)
        max_out = _min(first.max_bytes_out, vetted.max_bytes_out)
        pinned = pin(url.host, url.port, url.ip, vetted.hosts, self._resolver)
        meta["addresses"] = addresses_text(pinned.addresses)
        if max_out is not None and ctx.usage.bytes_out + len(hop.body) > max_out:
            raise PolicyEngineError(ErrorCode.CAPABILITY_BLOCKED,
                                    f"request bodies exceed max_bytes_out ({max_out} bytes)")
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise PolicyEngineError(ErrorCode.TIMEOUT, "deadline passed before sending")
        ctx.started()  # the first connection: a refused or unresolvable target cost nothing
        if hop.body:
            ctx.consume("bytes_out", len(hop.body))
        try:
            response, address = self._transport.open(
                hop.method, url.scheme, url.host, url.port, _target(url.path, url.query),
                pinned.addresses, hop.headers, hop.body, remaining)
        except httpx.HTTPError as exc:
            raise _transport_error(exc, where) from exc
        ctx.usage.bytes_out += len(hop.body)
        meta.update(address=str(address), bytes_out=len(hop.body))
        with closing(response):
            status = response.status_code
            meta["status"] = status
            following = next_hop(status, response.headers.get("location"), hop.method, url.url,
                                 hop.body, hop.headers)
            if following is not None:
                return following
            check_mime(vetted.mime, response.headers.get("content-type"))
            declared = response.headers.get("content-length", "")
            if hop.method == "HEAD" or status in (204, 304):
                declared = ""  # INVARIANT: no body follows, whatever the length header says
            if (max_in is not None and declared.isdigit()
                    and ctx.usage.bytes_in + int(declared) > max_in):
                raise PolicyEngineError(
                    ErrorCode.CAPABILITY_BLOCKED,
                    f"declared body of {declared} bytes exceeds max_bytes_in ({max_in} bytes)")
            before = ctx.usage.bytes_in
            try:
                summary = read_bounded(
                    _charged(ctx, response.iter_raw()), max_bytes=max_in, head_bytes=self._head,
                    deadline=deadline, cancel=ctx.cancel, already=before)
            except httpx.HTTPError as exc:
                raise _transport_error(exc, where) from exc
            finally:
                meta["bytes_in"] = ctx.usage.bytes_in - before
            selected = {k: response.headers[k] for k in SELECTED_HEADERS if k in response.headers}
        out = {
            "status": status,
            "url": where,
            "redirects": hops,
            "headers": selected,
            "body": {
                "digest": summary.digest.model_dump(mode="json"),
                "head_b64": base64.b64encode(summary.head).decode(),
                "truncated": summary.size > len(summary.head),
            },
        }
        return ExecResult(ok=True, out=out, used=ctx.usage.model_copy(update={"calls": 1}))


def _min(a: int | None, b: int | None) -> int | None:
    return b if a is None else a if b is None else min(a, b)


def _charged(ctx: ExecContext, chunks: Iterator[bytes]) -> Iterator[bytes]:
    """Count every chunk into the call's usage and budget as it arrives."""
    for chunk in chunks:
        ctx.usage.bytes_in += len(chunk)
        ctx.consume("bytes_in", len(chunk))
        yield chunk


def _decode_body(body_b64: str | None) -> bytes:
    if not body_b64:
        return b""
    try:
        return base64.b64decode(body_b64, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise PolicyEngineError(ErrorCode.SCHEMA_VALIDATION_FAILED,
                                "`body_b64` is not valid base64") from exc


def _redacted_text(url: str) -> str:
    try:
        u = httpx.URL(url)
    except (httpx.InvalidURL, ValueError):
        return "<unparseable>"
    port = u.port or {"http": 80, "https": 443}.get(u.scheme, 0)
    return redacted_url(u.scheme, u.host, port, u.path)
