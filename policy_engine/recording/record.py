"""The ``replay`` block of a begin record: what deciding the call again needs, minus secrets.

Kept in clear: what the guard decides on and the house already records in clear — op kind,
paths, tool, cwd, methods, scheme/host/port/path of URLs, sizes, header and environment
*names*, and the grant, manifest, settings and overrides (policy artifacts, not user data).

Withheld: URL user info, query and fragment (replaced by the placeholder ``redacted``, so a rule
that looks at their presence decides the same), header/env values (placeholders), payloads
(a zero-filled stand-in of the same size), and every process argument that is not a literal
some rule of the policy spells (those are public: the policy author wrote them). Context values
are withheld as well (names only).

Optionally (``options.replay.seal: true``) the withheld arguments, the full URL and the context
go into ``sealed``: AES-256-GCM under ``<state_dir>/keys/replay-seal.key``, bound to the
envelope id. Whoever holds that key can replay argument regexes and context conditions exactly;
a reader of the evidence alone learns nothing more.
"""

from __future__ import annotations

import base64
import binascii
import json
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from pydantic import BaseModel

from policy_engine.evidence.redact import _create_key
from policy_engine.inputs.inputfile import MAX_KEY_BYTES, read_bounded
from policy_engine.model import (
    BrowserNavOp,
    BrowserScreenshotOp,
    Capability,
    ExecOp,
    FsListOp,
    FsReadOp,
    FsWriteOp,
    Grant,
    Manifest,
    NetHttpOp,
    Overrides,
    ProcCapability,
    ProcExecOp,
    Profile,
    Settings,
)
from policy_engine.model.grant_json import grant_dump

SEAL_KEY_FILE = Path("keys") / "replay-seal.key"
PLACEHOLDER = "redacted"
_ARGS_UNKNOWN = None  # a withheld argument in the op view


def load_or_create_seal_key(state_dir: Path) -> bytes:
    """The installation's replay sealing key (32 bytes, 0600), created on first use.

    :raises ValueError: it cannot be created or read, or is too short.
    """
    path = state_dir / SEAL_KEY_FILE
    try:
        if not path.exists():
            _create_key(path)
        data = read_bounded(path, MAX_KEY_BYTES)  # a regular file: a pipe would hang the run
    except OSError as exc:
        raise ValueError(f"replay seal key `{path}` cannot be created or read: "
                         f"{exc.strerror or exc}") from None
    if len(data) < 32:
        raise ValueError(f"replay seal key `{path}` is shorter than 32 bytes")
    return data[:32]


def url_shape(url: str) -> tuple[str, bool]:
    """The URL with user info, query and fragment replaced by a placeholder, and whether
    anything was replaced (the raw URL is kept verbatim when there was nothing to withhold, so
    the guard parses exactly what it parsed then).
    """
    try:
        u = urlsplit(url)
    except ValueError:
        return "<unparsed>", True
    if "@" not in u.netloc and not u.query and not u.fragment and "?" not in url \
            and "#" not in url:
        return url, False
    netloc = (f"{PLACEHOLDER}@" + u.netloc.rsplit("@", 1)[1]) if "@" in u.netloc else u.netloc
    return urlunsplit((u.scheme, netloc, u.path, PLACEHOLDER if "?" in url else "",
                       PLACEHOLDER if "#" in url else "")), True


def _payload(data_b64: str | None) -> dict[str, Any] | None:
    if data_b64 is None:
        return None
    try:
        return {"size": len(base64.b64decode(data_b64, validate=True))}
    except (binascii.Error, ValueError):
        return {"invalid_base64": True}


def public_literals(profile: Profile | None) -> frozenset[str]:
    """Every argument literal a process template of this call's profile spells."""
    if profile is None:
        return frozenset()
    caps: list[Capability] = [*profile.granted, *profile.declared]
    for pc in profile.capabilities:
        caps.extend(pc.all_of)
    caps.extend(d.capability for d in profile.denies)
    out: set[str] = set()
    for cap in caps:
        if isinstance(cap, ProcCapability) and cap.args is not None:
            out.update(a.literal for slot in cap.args for a in slot.alternatives
                       if a.literal is not None)
    return frozenset(out)


def op_view(op: ExecOp, literals: Iterable[str]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The op as replay sees it, and what was withheld from it (for the sealed copy)."""
    data = _plain_fs(op)
    if data is not None:  # a read or listing: nothing to withhold
        return data, {}
    data = op.model_dump(mode="json")
    withheld: dict[str, Any] = {}
    if isinstance(op, FsWriteOp):
        data["bytes_b64"] = _payload(op.bytes_b64)
    elif isinstance(op, NetHttpOp | BrowserNavOp | BrowserScreenshotOp) and op.url is not None:
        data["url"], hidden = url_shape(op.url)
        if hidden:
            withheld["url"] = op.url
        if isinstance(op, NetHttpOp):
            data["headers"] = dict.fromkeys(sorted(op.headers), PLACEHOLDER)
            data["body_b64"] = _payload(op.body_b64)
    elif isinstance(op, ProcExecOp):
        public = frozenset(literals)
        data["args"] = [a if a in public else _ARGS_UNKNOWN for a in op.args]
        if any(a not in public for a in op.args):
            withheld["args"] = list(op.args)
        data["env"] = dict.fromkeys(sorted(op.env), PLACEHOLDER)
        data["stdin_b64"] = _payload(op.stdin_b64)
    return data, withheld


_NUMBERS = {FsReadOp: ("offset", "len"), FsListOp: ("depth",)}
_SCALARS = (int, type(None))


def _plain_fs(op: ExecOp) -> dict[str, Any] | None:
    """``op.model_dump(mode="json")`` of a read or listing whose fields hold exactly the
    validated types (str kind and path, int or None numbers): its fields, in order, are that
    dump; ``None`` for any other op."""
    numbers = _NUMBERS.get(type(op))
    if numbers is None:
        return None
    fields = op.__dict__
    if type(fields["kind"]) is not str or type(fields["path"]) is not str:
        return None
    for name in numbers:
        if type(fields[name]) not in _SCALARS:
            return None
    return dict(fields)


def seal(key: bytes, envelope_id: str, payload: Mapping[str, Any]) -> str:
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM

    nonce = os.urandom(12)
    blob = AESGCM(key).encrypt(nonce, json.dumps(payload).encode(), envelope_id.encode())
    return base64.b64encode(nonce + blob).decode()


def unseal(key: bytes, envelope_id: str, sealed: str) -> dict[str, Any]:
    """:raises ValueError: wrong key, another record's blob, or damaged."""
    from cryptography.exceptions import InvalidTag
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM

    try:
        raw = base64.b64decode(sealed, validate=True)
        plain = AESGCM(key).decrypt(raw[:12], raw[12:], envelope_id.encode())
    except (InvalidTag, binascii.Error, ValueError):
        raise ValueError("the sealed copy does not open with this key") from None
    value = json.loads(plain)
    if not isinstance(value, dict):
        raise ValueError("the sealed copy is not an object")
    return value


_DUMPED: dict[int, tuple[BaseModel, dict[str, Any]]] = {}
_DUMPED_MAX = 256


def _dumped(model: BaseModel) -> dict[str, Any]:
    """``model``'s JSON form, remembered by identity: a service answers every call of a tool
    with the same manifest and settings objects (issue 27). The models are frozen, and the
    entry holds the object, so its id cannot be reused while remembered. The dict is shared:
    the records only serialise it."""
    key = id(model)
    hit = _DUMPED.get(key)
    if hit is not None and hit[0] is model:
        return hit[1]
    data = model.model_dump(mode="json", exclude_none=True)
    if len(_DUMPED) >= _DUMPED_MAX:
        _DUMPED.clear()  # a cache, not a limit
    _DUMPED[key] = (model, data)
    return data


def replay_block(envelope_id: str, op: ExecOp, grant: Grant, manifest: Manifest,
                 profile: Profile | None, *, settings: Settings | None,
                 overrides: Overrides | None, context: Mapping[str, object] | None,
                 now_ms: int, seal_key: bytes | None) -> dict[str, Any]:
    """The ``replay`` member of ``EvidenceBegin`` (see the module docstring)."""
    # only a process call's arguments are matched against the policy's literals
    view, withheld = op_view(op, public_literals(profile) if isinstance(op, ProcExecOp)
                             else ())
    if context:
        withheld["context"] = dict(context)
    block: dict[str, Any] = {
        "v": 1, "op": view, "now_ms": now_ms,
        "grant": grant_dump(grant),
        "manifest": _dumped(manifest),
        "settings": _dumped(settings) if settings else None,
        "overrides": _dumped(overrides) if overrides else None,
        "context_keys": sorted(context) if context else [],
        "withheld": sorted(withheld),
    }
    if withheld and seal_key is not None:
        block["sealed"] = seal(seal_key, envelope_id, withheld)
    return block


class ReplayRecorder:
    """Builds replay blocks as ``options.replay`` asks: ``record`` (default true) and ``seal``
    (default false; true creates/loads the sealing key at start-up).

    :raises ValueError: an unknown option, a non-boolean value, or an unusable seal key.
    """

    def __init__(self, options: Mapping[str, Any], state_dir: Path) -> None:
        unknown = sorted(set(options) - {"record", "seal"})
        if unknown:
            raise ValueError(f"replay: unknown option `{unknown[0]}`")
        for name in ("record", "seal"):
            if not isinstance(options.get(name, False), bool):
                raise ValueError(f"replay: `{name}` must be true or false")
        self.enabled = bool(options.get("record", True))
        wants_seal = self.enabled and bool(options.get("seal", False))
        self.seal_key = load_or_create_seal_key(state_dir) if wants_seal else None

    def block(self, envelope_id: str, op: ExecOp, grant: Grant, manifest: Manifest,
              profile: Profile | None, *, settings: Settings | None,
              overrides: Overrides | None, context: Mapping[str, object] | None,
              now_ms: int) -> dict[str, Any] | None:
        if not self.enabled:
            return None
        return replay_block(envelope_id, op, grant, manifest, profile, settings=settings,
                            overrides=overrides, context=context, now_ms=now_ms,
                            seal_key=self.seal_key)
