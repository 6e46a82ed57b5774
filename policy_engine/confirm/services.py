"""Confirmation services: ``deny`` (default), ``auto`` (development), ``interactive``, ``webhook``.

Each answers one :class:`ConsentRequest` with a :class:`ConsentAnswer`; any failure to get a
clear yes is a no.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import sys
import time
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, TextIO

if TYPE_CHECKING:
    from policy_engine.confirm.deadline_http import Answer

log = logging.getLogger(__name__)
DEFAULT_VALID_MS = 5 * 60 * 1000
MAX_VALID_MS = 24 * 60 * 60 * 1000


@dataclass(frozen=True, slots=True)
class ConsentRequest:
    """What an approver is asked: the call, redacted as evidence is (``op``), and ``review``,
    the op as a person reviews it (full argv and code, a write's digest and first bytes, the
    URL without userinfo: confirm/review.py). It goes to the approver only, never to evidence."""

    request_id: str
    tenant: str
    subject_id: str
    tool_name: str
    call_id: str
    capability: str
    op: dict[str, Any]
    reason: str
    requested_at_ms: int
    review: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True, slots=True)
class ConsentAnswer:
    """An approver's answer: who, when, and for how long a yes stays valid."""

    approved: bool
    approver: str
    decided_at_ms: int
    valid_for_ms: int
    mode: str
    detail: str = ""
    # true when the approver's answer was not complete within the timeout (a no)
    timed_out: bool = False

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


class ConfirmationService(Protocol):
    mode: str

    def confirm(self, request: ConsentRequest) -> ConsentAnswer: ...


def _now() -> int:
    return int(time.time() * 1000)


class DenyConfirmation:
    """Nobody stands in for a missing consent: the call stays denied (the default)."""

    mode = "deny"

    def confirm(self, request: ConsentRequest) -> ConsentAnswer:
        return ConsentAnswer(False, "policy-engine:deny", _now(), 0, self.mode,
                             "no confirmation service is configured")


class AutoConfirmation:
    """Approves everything — development only; every approval is logged as a warning and
    recorded with approver ``auto`` so it stands out in the evidence."""

    mode = "auto"

    def __init__(self, valid_for_ms: int = DEFAULT_VALID_MS) -> None:
        self.valid_for_ms = valid_for_ms

    def confirm(self, request: ConsentRequest) -> ConsentAnswer:
        log.warning("AUTO-APPROVED consent (development mode): %s for %s/%s call %s",
                    request.capability, request.tenant, request.subject_id, request.call_id)
        return ConsentAnswer(True, "auto", _now(), self.valid_for_ms, self.mode,
                             "auto-approved: development mode")


class InteractiveConfirmation:
    """Asks on a terminal (the CLI); without a terminal the answer is no."""

    mode = "interactive"

    def __init__(self, stdin: TextIO | None = None, stdout: TextIO | None = None,
                 who: str = "terminal", valid_for_ms: int = DEFAULT_VALID_MS) -> None:
        self.stdin = stdin or sys.stdin
        self.stdout = stdout or sys.stderr
        self.who = who
        self.valid_for_ms = valid_for_ms

    def confirm(self, request: ConsentRequest) -> ConsentAnswer:
        if not self.stdin.isatty():
            return ConsentAnswer(False, self.who, _now(), 0, self.mode, "no terminal to ask")
        # what would run; ASCII-escaped so a program cannot rewrite the prompt (ANSI, bidi)
        review = json.dumps(request.review, indent=2)
        self.stdout.write(f"consent needed: {request.capability} for {request.tenant}/"
                          f"{request.subject_id} (tool {request.tool_name}, call "
                          f"{request.call_id}): {request.reason}\n{review}\nallow? [y/N] ")
        self.stdout.flush()
        line = self.stdin.readline().strip().lower()
        ok = line in ("y", "yes")
        return ConsentAnswer(ok, self.who, _now(), self.valid_for_ms if ok else 0, self.mode,
                             "approved at the terminal" if ok else "refused at the terminal")


def sign(secret: bytes, timestamp: str, body: bytes) -> str:
    """HMAC-SHA256 over ``<timestamp>.<body>``, hex."""
    return hmac.new(secret, timestamp.encode() + b"." + body, hashlib.sha256).hexdigest()


class _DuplicateKey(ValueError):
    def __init__(self, key: str) -> None:
        super().__init__(key)
        self.key = key[:64]


def _no_duplicate_keys(pairs: list[tuple[str, object]]) -> dict[str, object]:
    """A JSON object whose keys are all distinct, else :class:`_DuplicateKey` (issue 32 L3)."""
    out: dict[str, object] = {}
    for key, value in pairs:
        if key in out:
            raise _DuplicateKey(key)
        out[key] = value
    return out


class WebhookConfirmation:
    """POSTs the signed request to an approver URL and waits up to ``timeout_s`` for a signed
    answer. Headers: ``X-PE-Timestamp`` (ms) and ``X-PE-Signature`` (HMAC-SHA256 of
    ``<timestamp>.<body>`` with the shared secret). The answer is JSON ``{"request_id",
    "approved", "approver", "valid_for_ms"}`` signed the same way; an unsigned, mis-signed,
    stale, mismatched or late answer — or none — is a no."""

    mode = "webhook"

    def __init__(self, url: str, secret: bytes, *, timeout_s: float = 30.0,
                 max_skew_ms: int = 60_000) -> None:
        if len(secret) < 16:
            raise ValueError("the webhook secret must be at least 16 bytes")
        self.url = url
        self.secret = secret
        self.timeout_s = timeout_s
        self.max_skew_ms = max_skew_ms

    def confirm(self, request: ConsentRequest) -> ConsentAnswer:
        # the timeout bounds the whole exchange, not each read (issue 32 item 7): an approver
        # trickling a signed yes a byte at a time is a no at the timeout, and the connection
        # is dropped then rather than holding the caller's thread
        from policy_engine.confirm.deadline_http import DeadlineExceeded, post

        body = json.dumps(request.to_json(), sort_keys=True).encode()
        ts = str(_now())
        headers = {"content-type": "application/json", "x-pe-timestamp": ts,
                   "x-pe-signature": sign(self.secret, ts, body)}
        try:
            resp = post(self.url, body, headers, self.timeout_s)
        except DeadlineExceeded:
            return self._no(f"timed_out: no complete answer within {self.timeout_s:g} s",
                            timed_out=True)
        except (OSError, ValueError) as exc:
            return self._no(f"approver unreachable or broken: {type(exc).__name__}")
        return self._read(request, resp)

    def _no(self, why: str, *, timed_out: bool = False) -> ConsentAnswer:
        log.info("webhook confirmation refused: %s", why)
        return ConsentAnswer(False, "webhook", _now(), 0, self.mode, why, timed_out)

    def _read(self, request: ConsentRequest, resp: Answer) -> ConsentAnswer:
        if resp.status_code != 200:
            return self._no(f"approver answered HTTP {resp.status_code}")
        ts = resp.headers.get("x-pe-timestamp", "")
        given = resp.headers.get("x-pe-signature", "")
        if not hmac.compare_digest(given, sign(self.secret, ts, resp.content)):
            return self._no("the answer is not signed with the shared secret")
        if not ts.isdigit() or abs(_now() - int(ts)) > self.max_skew_ms:
            return self._no("the answer's timestamp is stale")
        try:
            data = json.loads(resp.content, object_pairs_hook=_no_duplicate_keys)
        except _DuplicateKey as exc:
            # readers disagree on which of two equal keys wins: the answer means nothing
            return self._no(f"the answer is garbage: duplicate key `{exc.key}`")
        except ValueError:
            return self._no("the answer is not JSON")
        if not isinstance(data, dict) or data.get("request_id") != request.request_id:
            return self._no("the answer is for another request")
        approver = data.get("approver")
        valid = data.get("valid_for_ms", DEFAULT_VALID_MS)
        if data.get("approved") is not True or not isinstance(approver, str) or not approver \
                or not isinstance(valid, int) or not 0 < valid <= MAX_VALID_MS:
            return ConsentAnswer(False, str(approver or "webhook"), _now(), 0, self.mode,
                                 "refused by the approver")
        return ConsentAnswer(True, approver, _now(), valid, self.mode, "approved by webhook")
