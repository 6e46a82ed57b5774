"""Redacted forms for evidence and logs: URLs without secrets, argv as keyed digests, safe audits.

Why keyed digests (HMAC-SHA256) for arguments: an argument is often short and guessable (a PIN,
a port, a password from a list), and a plain SHA-256 of it is reversed by trying candidates. The
key lives in the state directory (``keys/evidence-hmac.key``, mode 0600), never in a record: a
reader of the evidence alone learns nothing about an argument, equal arguments still have equal
digests within one installation, and whoever holds the key can confirm a candidate value.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import hmac
import os
import re
import secrets
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from policy_engine.inputs.inputfile import MAX_KEY_BYTES, read_bounded
from policy_engine.model import ArgSlot
from policy_engine.patterns.argv import CompiledSlot, compile_slots

KEY_FILE = Path("keys") / "evidence-hmac.key"
_KEY_BYTES = 32
# audit keys whose values are the engine's own (codes, counters, ids, configured paths);
# anything else in an audit may echo a request value and is logged by size only
_SAFE_AUDIT = frozenset({"rule", "errno", "nlink", "exec_id", "artifacts_dir", "call_id",
                         "expires_at", "now", "backend", "exception", "layer", "field", "root",
                         "path", "status", "removed", "limit", "code"})
_URLISH = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^\s'\"`<>]*")


def load_or_create_key(state_dir: Path) -> bytes:
    """The installation's evidence key, created (0600, in a 0700 dir) on first use.

    Created as a private temporary file and hard-linked into place, so a concurrent engine
    process either wins or reads the complete key of the one that did, never a partial file.

    :raises ValueError: the key cannot be read or created, or is too short.
    """
    path = state_dir / KEY_FILE
    try:
        if not path.exists():
            _create_key(path)
        data = read_bounded(path, MAX_KEY_BYTES)  # a regular file: a pipe would hang the run
    except OSError as exc:
        raise ValueError(f"evidence key `{path}` cannot be created or read: "
                         f"{exc.strerror or exc}") from None
    if len(data) < _KEY_BYTES:
        raise ValueError(f"evidence key `{path}` is shorter than {_KEY_BYTES} bytes")
    return data


def _create_key(path: Path) -> None:
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(6)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(secrets.token_bytes(_KEY_BYTES))
            fh.flush()
            os.fsync(fh.fileno())
        # FileExistsError: another process created it first, and theirs is the key
        with contextlib.suppress(FileExistsError):
            os.link(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def key_id(key: bytes) -> str:
    """A short public name of the key, so a reader can tell which key digests were made with."""
    return hashlib.sha256(b"policy-engine evidence key id\0" + key).hexdigest()[:12]


def keyed_digest(key: bytes, value: str) -> str:
    """HMAC-SHA256 of ``value`` (UTF-8, surrogates escaped), base64."""
    raw = value.encode("utf-8", "surrogatepass")
    return base64.b64encode(hmac.new(key, raw, hashlib.sha256).digest()).decode()


def redact_url(url: str) -> str:
    """``scheme://host[:port]/path``: user info, query and fragment removed (they carry tokens)."""
    try:
        u = urlsplit(url)
        host = u.hostname or ""
        port = u.port
    except ValueError:
        return "<unparsed>"
    if not u.scheme:
        return "<unparsed>"
    if ":" in host:  # an IPv6 literal
        host = f"[{host}]"
    netloc = f"{host}:{port}" if port is not None else host
    return f"{u.scheme}://{netloc}{u.path}" if netloc else f"{u.scheme}:{u.path}"


def redact_text(text: str) -> str:
    """Every URL inside free text replaced by its redacted form."""
    return _URLISH.sub(lambda m: redact_url(m.group(0)), text)


def slot_assignment(slots: Sequence[CompiledSlot], args: Sequence[str]) -> list[int] | None:
    """Which template slot each argument matched (one assignment), or ``None`` if none fits."""
    n = len(slots)
    # reach[i]: slots j such that args[:i] can be consumed leaving slots[j:], with a parent link
    reach: list[dict[int, int | None]] = [{}]
    start = 0
    reach[0][0] = None
    while start < n and slots[start].repeat:  # leading repeats may match nothing
        start += 1
        reach[0][start] = None
    for i, arg in enumerate(args):
        nxt: dict[int, int | None] = {}
        for j in reach[i]:
            if j < n and slots[j].admits(arg):
                to = j if slots[j].repeat else j + 1
                nxt.setdefault(to, j)
                k = to
                while k < n and slots[k].repeat and k + 1 not in nxt:  # repeats may stop here
                    nxt.setdefault(k + 1, j)
                    k += 1
        if not nxt:
            return None
        reach.append(nxt)
    if n not in reach[len(args)]:
        return None
    out: list[int] = []
    j = n
    for i in range(len(args), 0, -1):
        used = reach[i][j]
        assert used is not None
        out.append(used)
        j = used
    out.reverse()
    return out


def summarize_args(args: Sequence[str], key: bytes | None,
                   template: tuple[ArgSlot, ...] | None = None) -> list[dict[str, Any]]:
    """One entry per argument: the template slot it matched, and either the literal the policy
    itself spells (public: the policy author wrote it) or the argument's size and keyed digest.
    """
    compiled = compile_slots(template) if template is not None else None
    matched = slot_assignment(compiled, args) if compiled is not None else None
    out: list[dict[str, Any]] = []
    for i, arg in enumerate(args):
        entry: dict[str, Any] = {}
        if matched is not None and compiled is not None:
            slot = matched[i]
            entry["slot"] = slot
            if arg in compiled[slot].literals:
                entry["literal"] = arg
                out.append(entry)
                continue
        entry["size"] = len(arg.encode("utf-8", "surrogatepass"))
        if key is not None:
            entry["hmac"] = keyed_digest(key, arg)
        out.append(entry)
    return out


def redact_audit(audit: Mapping[str, Any]) -> dict[str, Any]:
    """An error's audit detail as a log line may show it: engine-made values kept (URLs in
    them redacted), anything that may echo a request value reduced to its type and size.
    """
    out: dict[str, Any] = {}
    for k, v in audit.items():
        if k in _SAFE_AUDIT and isinstance(v, str):
            out[k] = redact_text(v)
        elif k in _SAFE_AUDIT and isinstance(v, int | float | bool) or v is None:
            out[k] = v
        elif k in _SAFE_AUDIT and isinstance(v, list | tuple):
            out[k] = [redact_text(x) if isinstance(x, str) else x for x in v[:20]]
        else:
            out[k] = f"<{type(v).__name__}, {len(str(v))} chars, redacted>"
    return out
