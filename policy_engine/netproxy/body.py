"""Response bodies: MIME allow-lists, and reading under a byte limit and a deadline, bounded."""

from __future__ import annotations

import base64
import hashlib
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from policy_engine.errors import ErrorCode, PolicyEngineError
from policy_engine.executor import CancelToken
from policy_engine.model import Digest

SELECTED_HEADERS: tuple[str, ...] = (
    "content-type", "content-length", "content-encoding", "content-language", "etag",
    "last-modified", "cache-control", "expires", "date", "age", "vary", "retry-after",
)
"""Response headers echoed in a result; never ``Set-Cookie``, ``Authorization`` or the like."""


def mime_essence(content_type: str | None) -> str | None:
    """``text/HTML; charset=x`` → ``text/html``; ``None`` when absent or not ``type/subtype``."""
    if not content_type:
        return None
    essence = content_type.split(";", 1)[0].strip().lower()
    return essence if essence.count("/") == 1 and all(essence.split("/")) else None


def _mime_matches(allowed: str, essence: str) -> bool:
    a = allowed.split(";", 1)[0].strip().lower()
    if a in ("*", "*/*"):
        return True
    if a.endswith("/*"):
        return essence.split("/", 1)[0] == a[:-2]
    return a == essence


def check_mime(allow_lists: Sequence[Sequence[str]], content_type: str | None) -> None:
    """Refuse a response whose type one of ``allow_lists`` does not admit.

    An empty list means "unconstrained" (see ``NetHttpCapability``); a missing or malformed
    ``Content-Type`` passes only where nothing constrains the type.

    :raises PolicyEngineError: ``SANDBOX.CAPABILITY_BLOCKED``.
    """
    essence = mime_essence(content_type)
    for allowed in allow_lists:
        if allowed and (essence is None or not any(_mime_matches(a, essence) for a in allowed)):
            shown = essence or "none"
            raise PolicyEngineError(
                ErrorCode.CAPABILITY_BLOCKED, f"response content type `{shown}` is not allowed",
                audit={"content_type": shown, "allowed": list(allowed)},
            )


@dataclass(slots=True)
class BodySummary:
    """What is kept of a body: its digest, its first bytes, and how many bytes came in."""

    digest: Digest
    head: bytes
    size: int


def read_bounded(
    chunks: Iterator[bytes], *, max_bytes: int | None, head_bytes: int, deadline: float,
    cancel: CancelToken | None = None, already: int = 0,
) -> BodySummary:
    """Consume ``chunks`` keeping only a SHA-256 and the first ``head_bytes`` bytes.

    Stops (and raises) the moment the total passes ``max_bytes``, the deadline passes or the call
    is cancelled, so memory stays bounded whatever the peer sends; the caller closes the stream,
    which closes the connection of a response not read to its end.

    :param already: bytes already counted against ``max_bytes`` (earlier hops).
    :raises PolicyEngineError: ``SANDBOX.CAPABILITY_BLOCKED`` over the limit, ``LLM.TIMEOUT`` past
        the deadline or when cancelled.
    """
    sha = hashlib.sha256()
    head = bytearray()
    size = 0
    for chunk in chunks:
        size += len(chunk)
        if max_bytes is not None and already + size > max_bytes:
            raise PolicyEngineError(
                ErrorCode.CAPABILITY_BLOCKED,
                f"response body exceeds max_bytes_in ({max_bytes} bytes)",
                audit={"read": already + size, "limit": max_bytes},
            )
        sha.update(chunk)
        if len(head) < head_bytes:
            head += chunk[: head_bytes - len(head)]
        if time.monotonic() > deadline:
            raise PolicyEngineError(
                ErrorCode.TIMEOUT, "response body not received before the deadline",
                audit={"read": size},
            )
        if cancel is not None and cancel.cancelled:
            raise PolicyEngineError(ErrorCode.TIMEOUT, f"cancelled: {cancel.reason}")
    digest = Digest(b64=base64.b64encode(sha.digest()).decode(), size=size)
    return BodySummary(digest=digest, head=bytes(head), size=size)
