"""Digest helpers: canonical JSON, redacted op views, capability strings — never raw content."""

from __future__ import annotations

import base64
import binascii
import json
from json.encoder import encode_basestring
from typing import Any

from pydantic import BaseModel

from policy_engine.evidence.redact import key_id, keyed_digest, redact_url, summarize_args
from policy_engine.model import (
    ArgSlot,
    BrowserNavOp,
    BrowserScreenshotOp,
    Decision,
    Digest,
    ExecOp,
    FsListOp,
    FsReadOp,
    FsWriteOp,
    NetHttpOp,
    ProcCapability,
    ProcExecOp,
    Profile,
    SideEffect,
    SideEffectRec,
    TmpAllocOp,
)

EMPTY_DIGEST = Digest.of(b"")


# what ``json.dumps`` with these options builds on every call (it holds only the options: one
# is shared by every thread; ≈ 1.5 µs a call, two calls per op; docs/benchmarks.md, "Twelfth
# pass")
_CANONICAL = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def canonical_json(value: Any) -> bytes:
    """Sorted keys, no whitespace, UTF-8: the same value always hashes the same.

    A lone surrogate (a host file name that is not UTF-8, decoded by ``os.fsdecode``; anything
    an executor puts in its output) is encoded as its own three bytes rather than refused: an
    executor's output never makes the evidence fail."""
    if isinstance(value, BaseModel):
        value = value.model_dump(mode="json")
    elif type(value) is dict and len(value) == 7 and value.keys() == _READ_KEYS:
        read = _read_json(value)
        if read is not None:
            return read.encode("utf-8", "surrogatepass")
    return _CANONICAL.encode(value).encode("utf-8", "surrogatepass")


# the fs executor's read result (``out``), the output digested on every fs.read: its sorted
# members written out, each value by the encoder's own step for its type (a string by
# ``encode_basestring``, an int by its repr), so the text is the encoder's to the byte, in
# ≈ 1.3 µs against ≈ 3 µs (the C encoder sets up and sorts per call); any other type, or a
# subclass, goes the encoder's way
_READ_KEYS = frozenset({"bytes_b64", "digest", "offset", "path", "preview_truncated",
                        "resolver", "size"})
_DIGEST_KEYS = frozenset({"algo", "b64", "size"})
_READ_JSON = ('{"bytes_b64":%s,"digest":{"algo":%s,"b64":%s,"size":%d},"offset":%d,'
              '"path":%s,"preview_truncated":%s,"resolver":%s,"size":%d}')


def _read_json(out: dict[str, Any]) -> str | None:
    digest = out["digest"]
    if type(digest) is not dict or digest.keys() != _DIGEST_KEYS:
        return None
    texts = (out["bytes_b64"], digest["algo"], digest["b64"], out["path"], out["resolver"])
    numbers = (digest["size"], out["offset"], out["size"])
    truncated = out["preview_truncated"]
    if set(map(type, texts)) != _STR or set(map(type, numbers)) != _INT or \
            type(truncated) is not bool:
        return None
    b64s, algo, b64, path, resolver = map(encode_basestring, texts)
    return _READ_JSON % (b64s, algo, b64, numbers[0], numbers[1], path,
                         "true" if truncated else "false", resolver, numbers[2])


_STR, _INT = {str}, {int}


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


def redacted_op(op: ExecOp, key: bytes | None = None) -> dict[str, Any]:
    """The op as evidence may see it: no payload, env value, header value, argument or URL
    secret in the clear.

    Payloads become their digest, env and headers their sorted names, each argument its size
    and keyed digest (``redact.summarize_args``), a URL its redacted form plus the keyed digest
    of the whole URL. Why keyed: a plain digest of a low-entropy value (a token in a query, a
    short argument) can be brute-forced; ``key=None`` (``explain``, no state) keeps sizes only.
    """
    data = op.model_dump(mode="json")
    if isinstance(op, FsWriteOp):
        data["bytes_b64"] = _b64_digest(op.bytes_b64)
    elif isinstance(op, NetHttpOp):
        data["body_b64"] = _b64_digest(op.body_b64)
        data["headers"] = sorted(op.headers)
        data.update(_url_view(op.url, key))
    elif isinstance(op, BrowserNavOp | BrowserScreenshotOp) and op.url is not None:
        data.update(_url_view(op.url, key))
    elif isinstance(op, ProcExecOp):
        data["args"] = summarize_args(op.args, key)
        data["env"] = sorted(op.env)
        data["stdin_b64"] = _b64_digest(op.stdin_b64)
    return data


def _url_view(url: str, key: bytes | None) -> dict[str, Any]:
    view: dict[str, Any] = {"url": redact_url(url)}
    if key is not None:
        view["url_hmac"] = keyed_digest(key, url)
    return view


# (op class, its fields, key) -> digest, for the ops whose fields are all plain values (a
# read or a listing: a path and numbers): agents read the same files again and again, and
# the digest of the same fields is the same digest (≈ 5 µs of every call; issue 27)
_PLAIN_OPS = (FsReadOp, FsListOp)
_INPUTS: dict[tuple[Any, ...], Digest] = {}
_INPUTS_MAX = 4096


def inputs_digest(op: ExecOp, key: bytes | None = None) -> Digest:
    """``inputs_digest`` of ``EvidenceBegin``: the digest of the canonical redacted op JSON."""
    if type(op) not in _PLAIN_OPS:
        return digest_json(redacted_op(op, key))
    # the fields by name and value: `str`, `int`, `None` (a frozen op; surrogates included)
    remembered = (type(op), tuple(op.__dict__.items()), key)
    found = _INPUTS.get(remembered)
    if found is None:
        found = digest_json(redacted_op(op, key))
        if len(_INPUTS) >= _INPUTS_MAX:
            _INPUTS.clear()  # a cache, not a limit
        _INPUTS[remembered] = found
    return found


def capability_string(op: ExecOp) -> str:
    """The ``capability`` field of ``EvidenceBegin`` (``"net.http:GET:https://example.com"``).

    Only the resource and action: user info, query strings and fragments are kept out because
    they often carry credentials and tokens; a process call names its tool only.
    """
    if isinstance(op, FsReadOp | FsWriteOp | FsListOp):
        return f"{op.kind}:{op.path}"
    if isinstance(op, NetHttpOp):
        return f"{op.kind}:{op.method.upper()}:{redact_url(op.url)}"
    if isinstance(op, BrowserNavOp):
        return f"{op.kind}:{redact_url(op.url)}"
    if isinstance(op, BrowserScreenshotOp):
        return f"{op.kind}:{redact_url(op.url) if op.url else ''}"
    if isinstance(op, ProcExecOp):
        return f"{op.kind}:{op.tool}"
    if isinstance(op, TmpAllocOp):
        return f"{op.kind}:{op.size_bytes}"
    raise TypeError(f"unknown op {type(op).__name__}")  # pragma: no cover - closed union


def request_summary(op: ExecOp, key: bytes | None = None,
                    template: tuple[ArgSlot, ...] | None = None) -> SideEffectRec | None:
    """Metadata the exec-record table needs (seed 002 §6) for process calls: the tool, argc,
    one summary per argument (``redact.summarize_args``: the template slot it matched and the
    literal, or its size and keyed digest), cwd and env keys — never an argument or env value.
    """
    if not isinstance(op, ProcExecOp):
        return None
    meta: dict[str, Any] = {"cmd": op.tool, "argc": len(op.args),
                            "args": summarize_args(op.args, key, template), "cwd": op.cwd,
                            "env_keys": sorted(op.env)}
    if key is not None:
        meta["hmac_key"] = key_id(key)
    return SideEffectRec(kind=SideEffect.PROCESS, meta=meta)


def allowing_template(profile: Profile | None, decision: Decision) -> tuple[ArgSlot, ...] | None:
    """The argument template of the capability that allowed a process call (``None`` for a
    denial or no template): arguments equal to one of its literals are recorded as that literal.
    """
    if profile is None or not decision.allowed or decision.rule is None:
        return None
    for cap in profile.capabilities:
        if cap.rule == decision.rule:
            for member in cap.all_of:
                if isinstance(member, ProcCapability) and member.args is not None:
                    return member.args
    return None
