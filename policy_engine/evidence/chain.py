"""Hash-chained evidence records and Ed25519-signed checkpoints (tamper evidence, issue 14).

Every stored record gets a ``chain`` member: ``{"seq": N, "prev": H}`` where ``seq`` counts
the records of that log from 0 and ``H`` is the SHA-256 (hex) of the exact bytes of the
previous stored record (its JSON line without the newline; :data:`GENESIS` for the first).
Editing, deleting, inserting or reordering a record breaks the link of the record after it or
the sequence. A writer must compute ``seq``/``prev`` and append under one exclusive lock of
the log (the JSONL sink's ``flock``, SQLite's write transaction), so concurrent writers never
fork the chain.

A chain alone does not stop someone who rewrites every record after their edit; a signed
checkpoint does: ``{"type": "checkpoint", "covers_seq": N, "head": H, "key_id", "sig"}`` where
``H`` is the hash of record ``N`` and ``sig`` the Ed25519 signature of
``checkpoint_message(N, H)`` under the operator's key. Rewriting anything up to ``N`` then
needs the private key.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
from pathlib import Path
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from policy_engine.evidence.jsonline import load_line
from policy_engine.inputs.inputfile import MAX_KEY_BYTES, cannot_read, read_bounded

GENESIS = "0" * 64
_CONTEXT = b"policy-engine evidence checkpoint v1\0"


def line_hash(raw: bytes) -> str:
    """SHA-256 (hex) of one stored record, exactly as stored (no trailing newline)."""
    return hashlib.sha256(raw).hexdigest()


def chained(record_json: bytes, seq: int, prev: str) -> bytes:
    """``record_json`` (a JSON object) with its ``chain`` member appended; no newline."""
    body = record_json.rstrip()
    if not body.endswith(b"}") or body == b"{}":
        raise ValueError("a chained record must be a non-empty JSON object")
    if type(seq) is int and prev.isascii() and prev.isalnum():
        # the usual link (a hex digest): nothing to escape, the bytes json.dumps would make
        link = b'{"seq":%d,"prev":"%s"}' % (seq, prev.encode())
    else:
        link = json.dumps({"seq": seq, "prev": prev}, separators=(",", ":")).encode()
    return body[:-1] + b',"chain":' + link + b"}"


def link_of(raw: bytes) -> tuple[int, str] | None:
    """The ``(seq, hash)`` a record chained after ``raw`` continues from, or ``None`` when
    ``raw`` carries no chain (a log written before chaining): the chain then starts at 0.
    """
    try:
        record = load_line(raw)
    except ValueError:
        return None
    chain = record.get("chain") if isinstance(record, dict) else None
    if not isinstance(chain, dict) or not isinstance(chain.get("seq"), int):
        return None
    return int(chain["seq"]), line_hash(raw)


def next_link(last: bytes | None) -> tuple[int, str]:
    """``(seq, prev)`` for the record appended after the stored record ``last``."""
    if last is None:
        return 0, GENESIS
    found = link_of(last)
    return (found[0] + 1, found[1]) if found is not None else (0, line_hash(last))


def strip_chain(record: dict[str, Any]) -> dict[str, Any]:
    """A stored record without its ``chain`` member (what the sink was given)."""
    return {k: v for k, v in record.items() if k != "chain"}


# -- signing ---------------------------------------------------------------------------------


def checkpoint_message(covers_seq: int, head: str) -> bytes:
    return _CONTEXT + f"{covers_seq}:{head}".encode()


def key_id(public: Ed25519PublicKey) -> str:
    raw = public.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return hashlib.sha256(raw).hexdigest()[:16]


def load_signing_key(path: Path) -> Ed25519PrivateKey:
    """An Ed25519 private key from a PEM file (``policy-engine evidence keygen`` writes one).

    :raises ValueError: unreadable, not PEM, or not an Ed25519 key (the message names the file).
    """
    try:
        key = serialization.load_pem_private_key(read_bounded(path, MAX_KEY_BYTES),
                                                 password=None)
    except OSError as exc:
        raise ValueError(cannot_read("evidence signing key", path, exc)
                         .removeprefix("error: ")) from None
    except (ValueError, TypeError) as exc:
        raise ValueError(f"evidence signing key `{path}` is not an unencrypted PEM private "
                         f"key: {exc}") from None
    if not isinstance(key, Ed25519PrivateKey):
        raise ValueError(f"evidence signing key `{path}` is not an Ed25519 key")
    return key


def load_public_key(path: Path) -> Ed25519PublicKey:
    """An Ed25519 public key from PEM (or the private key's PEM, whose public half is used).

    :raises ValueError: unreadable or not an Ed25519 key.
    """
    try:
        data = read_bounded(path, MAX_KEY_BYTES)
    except OSError as exc:
        raise ValueError(cannot_read("public key", path, exc).removeprefix("error: ")) from None
    if b"PRIVATE KEY" in data:
        return load_signing_key(path).public_key()
    try:
        key = serialization.load_pem_public_key(data)
    except (ValueError, TypeError) as exc:
        raise ValueError(f"public key `{path}` is not a PEM public key: {exc}") from None
    if not isinstance(key, Ed25519PublicKey):
        raise ValueError(f"public key `{path}` is not an Ed25519 key")
    return key


def checkpoint(key: Ed25519PrivateKey, covers_seq: int, head: str) -> bytes:
    """The JSON of a checkpoint record over record ``covers_seq`` whose hash is ``head``."""
    sig = key.sign(checkpoint_message(covers_seq, head))
    return json.dumps({"type": "checkpoint", "covers_seq": covers_seq, "head": head,
                       "key_id": key_id(key.public_key()),
                       "sig": base64.b64encode(sig).decode()}, separators=(",", ":")).encode()


CHECKPOINT_FIELDS = ("type", "covers_seq", "head", "key_id", "sig")


def checkpoint_form_problem(record: dict[str, Any], raw: bytes | None) -> str | None:
    """Why ``record`` is not a checkpoint exactly as a writer stores it, or ``None``.

    The signature covers ``covers_seq`` and ``head`` only, and the last checkpoint of a log
    has no record after it whose link would break (issue 32 attack L5): so a field outside
    :data:`CHECKPOINT_FIELDS` (and ``chain`` for a chain member) is an edit, and a chain
    member's ``raw`` line must be byte for byte the one :func:`checkpoint` and
    :func:`chained` write.
    """
    extra = sorted(set(record) - set(CHECKPOINT_FIELDS) - ({"chain"} if raw is not None
                                                           else set()))
    if extra:
        return ("carries field(s) no signature covers: "
                + ", ".join(f"`{k[:64]}`" for k in extra[:8]) + (", ..." if extra[8:] else ""))
    if raw is None:
        return None
    chain = record.get("chain")
    try:
        body = json.dumps({k: record[k] for k in CHECKPOINT_FIELDS}, separators=(",", ":"))
        assert isinstance(chain, dict)
        canonical = chained(body.encode(), chain["seq"], chain["prev"])
    except (KeyError, TypeError, ValueError, AssertionError):
        return "is not a complete checkpoint"
    if raw != canonical:
        return "is not byte for byte the line its writer wrote (spacing, order or members)"
    return None


def signature_ok(public: Ed25519PublicKey, record: dict[str, Any]) -> bool:
    try:
        sig = base64.b64decode(str(record.get("sig", "")), validate=True)
        public.verify(sig, checkpoint_message(int(record["covers_seq"]), str(record["head"])))
    except (InvalidSignature, ValueError, KeyError, TypeError):
        return False
    return True


def generate_key(private_path: Path, public_path: Path) -> str:
    """Write a new Ed25519 key pair (private 0600, refusing to overwrite); returns its key id."""
    key = Ed25519PrivateKey.generate()
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                            serialization.NoEncryption())
    fd = os.open(private_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as fh:
        fh.write(pem)
    public_path.write_bytes(key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))
    return key_id(key.public_key())


def signing_options(config: Any, plugin: str, evidence_dir: Path | None = None
                    ) -> tuple[Ed25519PrivateKey | None, int]:
    """``signing_key`` and ``checkpoint_every`` (records, default 1000) of a sink's options,
    validated. ``signing_key``: a PEM path; ``false`` (or ``null``) for the keyless mode;
    absent: the default key beside the evidence in ``evidence_dir``, created at first start
    (:mod:`policy_engine.evidence.autokey`); a sink given no ``evidence_dir`` stays keyless.

    :raises ValueError: a bad value or an unusable key (names the option and the file).
    """
    options = config.plugin_options(plugin)
    every = options.get("checkpoint_every", 1000)
    if not isinstance(every, int) or isinstance(every, bool) or not 1 <= every <= 1_000_000:
        raise ValueError(f"{plugin}: `checkpoint_every` must be an integer from 1 to 1000000")
    if "signing_key" not in options:
        if evidence_dir is None:
            return None, every
        from policy_engine.evidence.autokey import ensure_default_key

        return ensure_default_key(evidence_dir), every
    raw = options["signing_key"]
    if raw is None or raw is False:  # the documented keyless mode, chosen
        return None, every
    if not isinstance(raw, str) or not raw:
        raise ValueError(f"{plugin}: `signing_key` must be the path of a PEM Ed25519 key, or "
                         "false for no signed checkpoints")
    return load_signing_key(Path(raw)), every
