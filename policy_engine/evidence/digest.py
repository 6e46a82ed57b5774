"""Digest helpers: canonical JSON, redacted op views, capability strings — never raw content."""

from __future__ import annotations

import base64
import binascii
import json
from typing import Any

from pydantic import BaseModel

from policy_engine.model import (
    BrowserNavOp,
    BrowserScreenshotOp,
    Digest,
    ExecOp,
    FsListOp,
    FsReadOp,
    FsWriteOp,
    NetHttpOp,
    ProcExecOp,
    SideEffect,
    SideEffectRec,
    TmpAllocOp,
)

EMPTY_DIGEST = Digest.of(b"")


def canonical_json(value: Any) -> bytes:
    """Sorted keys, no whitespace, UTF-8: the same value always hashes the same."""
    if isinstance(value, BaseModel):
        value = value.model_dump(mode="json")
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def digest_json(value: Any) -> Digest:
    return Digest.of(canonical_json(value))


def _b64_digest(data_b64: str | None) -> dict[str, Any] | None:
    if data_b64 is None:
        return None
    try:
        raw = base64.b64decode(data_b64, validate=True)
    except (binascii.Error, ValueError):
        raw = data_b64.encode()
    return Digest.of(raw).model_dump(mode="json")


def redacted_op(op: ExecOp) -> dict[str, Any]:
    """The op as evidence may see it: payloads replaced by their digest, env values dropped.

    Why not hash the raw op: a digest of a low-entropy secret (an env token, a short file) can be
    brute-forced, so the inputs digest binds only the payloads' own digests and the env keys.
    """
    data = op.model_dump(mode="json")
    if isinstance(op, FsWriteOp):
        data["bytes_b64"] = _b64_digest(op.bytes_b64)
    elif isinstance(op, NetHttpOp):
        data["body_b64"] = _b64_digest(op.body_b64)
        data["headers"] = sorted(op.headers)
    elif isinstance(op, ProcExecOp):
        data["env"] = sorted(op.env)
        data["stdin_b64"] = _b64_digest(op.stdin_b64)
    return data


def inputs_digest(op: ExecOp) -> Digest:
    """``inputs_digest`` of ``EvidenceBegin``: the digest of the canonical redacted op JSON."""
    return digest_json(redacted_op(op))


def capability_string(op: ExecOp) -> str:
    """The ``capability`` field of ``EvidenceBegin`` (``"net.http:GET:https://example.com"``).

    Only the resource and action: query strings are kept out because they often carry tokens.
    """
    if isinstance(op, FsReadOp | FsWriteOp | FsListOp):
        return f"{op.kind}:{op.path}"
    if isinstance(op, NetHttpOp):
        return f"{op.kind}:{op.method.upper()}:{op.url.split('?', 1)[0]}"
    if isinstance(op, BrowserNavOp):
        return f"{op.kind}:{op.url.split('?', 1)[0]}"
    if isinstance(op, BrowserScreenshotOp):
        return f"{op.kind}:{(op.url or '').split('?', 1)[0]}"
    if isinstance(op, ProcExecOp):
        return f"{op.kind}:{op.tool}"
    if isinstance(op, TmpAllocOp):
        return f"{op.kind}:{op.size_bytes}"
    raise TypeError(f"unknown op {type(op).__name__}")  # pragma: no cover - closed union


def request_summary(op: ExecOp) -> SideEffectRec | None:
    """Metadata the exec-record table needs (seed 002 §6) for process calls: env keys only."""
    if not isinstance(op, ProcExecOp):
        return None
    return SideEffectRec(
        kind=SideEffect.PROCESS,
        meta={"cmd": op.tool, "args": list(op.args), "cwd": op.cwd, "env_keys": sorted(op.env)},
    )
