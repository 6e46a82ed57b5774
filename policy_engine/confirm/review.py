"""The reviewable form of an op: what a human approver sees before saying yes (docs/consent.md).

Evidence keeps digests and shapes only; an approver cannot approve code it cannot read, so the
consent request carries the op as a person reviews it — full argv (run_code's code included),
the path, digest and first bytes of a write, the URL without its userinfo — bounded in size and
with a SHA-256 digest of the whole so a truncated form still names exactly what runs. The
approval request is sent to the configured approver only; it is never written to evidence.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from policy_engine.model import (
    BrowserNavOp,
    BrowserScreenshotOp,
    ExecOp,
    FsWriteOp,
    NetHttpOp,
    ProcExecOp,
)

MAX_ARG_CHARS = 64 * 1024  # one argv element (a run_code program) shown up to this many chars
MAX_ARGV_CHARS = 256 * 1024  # the whole argv shown
FIRST_BYTES = 512  # the head of a write's content shown to the approver


def _sha256(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def _decoded(b64: str | None) -> bytes:
    if not b64:
        return b""
    try:
        return base64.b64decode(b64, validate=True)
    except (binascii.Error, ValueError):
        return b64.encode("utf-8", "surrogatepass")  # shown as given; the guard refuses it


def _head(data: bytes) -> dict[str, Any]:
    head = data[:FIRST_BYTES]
    try:
        shown: dict[str, Any] = {"first_text": head.decode("utf-8")}
    except UnicodeDecodeError:
        shown = {"first_b64": base64.b64encode(head).decode("ascii")}
    return {"size": len(data), "digest": _sha256(data), "truncated": len(data) > len(head),
            **shown}


def public_url(url: str) -> str:
    """``url`` without its userinfo (``user:password@``): the approver needs the host, never a
    credential."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return "<unparseable url>"
    host = parts.netloc.rpartition("@")[2]
    return urlunsplit((parts.scheme, host, parts.path, parts.query, parts.fragment))


def _argv(op: ProcExecOp) -> dict[str, Any]:
    argv = [op.tool, *op.args]
    whole = json.dumps(argv, ensure_ascii=False).encode("utf-8", "surrogatepass")
    shown: list[str] = []
    budget = MAX_ARGV_CHARS
    truncated = False
    for arg in argv:
        part = arg[:min(MAX_ARG_CHARS, max(budget, 0))]
        truncated = truncated or len(part) < len(arg)
        shown.append(part)
        budget -= len(part)
    form: dict[str, Any] = {"argv": shown, "argv_digest": _sha256(whole),
                            "truncated": truncated, "cwd": op.cwd,
                            "env_names": sorted(op.env)}
    if op.stdin_b64:
        form["stdin"] = _head(_decoded(op.stdin_b64))
    return form


def reviewable(op: ExecOp) -> dict[str, Any]:
    """The op as an approver reviews it (bounded: at most ~260 KiB whatever the op's size)."""
    form: dict[str, Any] = {"kind": str(op.kind)}
    if isinstance(op, ProcExecOp):
        form.update(_argv(op))
    elif isinstance(op, FsWriteOp):
        form.update({"path": op.path, "overwrite": op.overwrite,
                     "content": _head(_decoded(op.bytes_b64))})
    elif isinstance(op, NetHttpOp):
        form.update({"method": op.method, "url": public_url(op.url),
                     "header_names": sorted(op.headers)})
        if op.body_b64:
            form["body"] = _head(_decoded(op.body_b64))
    elif isinstance(op, BrowserNavOp):
        form.update({"url": public_url(op.url), "extract": op.extract})
    elif isinstance(op, BrowserScreenshotOp):
        form.update({"url": public_url(op.url) if op.url else None, "selector": op.selector})
    else:  # fs.read, fs.list, tmp.alloc: their fields are what they are
        form.update(op.model_dump(mode="json", exclude={"kind"}))
    return form
