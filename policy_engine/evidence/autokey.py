"""The default install's checkpoint signing key: created at first start beside the evidence.

Without a key, `evidence verify` cannot tell an edit of the last record or a cut tail (issue
32 item 10). So when a sink's options name no ``signing_key``, the key is
``<evidence dir>/evidence-signing.pem`` (Ed25519, PKCS#8 PEM, mode 0600), created on first
start with its public half beside it (``….pem.pub``, 0644). Several processes starting at
once (service workers, CLI runs) agree on one key: each writes a complete candidate to a
private temporary file and ``link``s it into place; ``link`` never replaces, so the first one
wins and every process loads that one. An existing key that group or others may read, or that
is not a regular file owned by this user, is refused rather than used.
"""

from __future__ import annotations

import contextlib
import logging
import os
import stat
import tempfile
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

log = logging.getLogger(__name__)
DEFAULT_KEY_NAME = "evidence-signing.pem"


def default_key_path(evidence_dir: Path) -> Path:
    return evidence_dir / DEFAULT_KEY_NAME


def _check_private(path: Path) -> None:
    st = os.lstat(path)
    if not stat.S_ISREG(st.st_mode):
        raise ValueError(f"evidence signing key `{path}` is not a regular file")
    if st.st_uid != os.geteuid():
        raise ValueError(f"evidence signing key `{path}` belongs to uid {st.st_uid}, not to "
                         "the user running the engine")
    if st.st_mode & 0o077:
        raise ValueError(f"evidence signing key `{path}` may be read by others (mode "
                         f"{stat.S_IMODE(st.st_mode):04o}): `chmod 0600` it, or replace it")


def _write_public(path: Path, key: Ed25519PrivateKey) -> None:
    """``path`` + ``.pub`` holds the key's public half (rewritten when missing or not it)."""
    pub = path.with_name(path.name + ".pub")
    data = key.public_key().public_bytes(serialization.Encoding.PEM,
                                         serialization.PublicFormat.SubjectPublicKeyInfo)
    with contextlib.suppress(OSError):
        if pub.read_bytes() == data:
            return
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".pub-")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        os.chmod(tmp, 0o644)
        os.replace(tmp, pub)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def ensure_default_key(evidence_dir: Path) -> Ed25519PrivateKey:
    """The default signing key of ``evidence_dir``, created (0600) when there is none.

    :raises ValueError: the key exists but is unsafe or unreadable, or cannot be created
        (the message names the file).
    """
    from policy_engine.evidence.chain import load_signing_key

    path = default_key_path(evidence_dir)
    try:
        evidence_dir.mkdir(parents=True, exist_ok=True)
        if not os.path.lexists(path):
            candidate = Ed25519PrivateKey.generate()
            pem = candidate.private_bytes(serialization.Encoding.PEM,
                                          serialization.PrivateFormat.PKCS8,
                                          serialization.NoEncryption())
            fd, tmp = tempfile.mkstemp(dir=evidence_dir, prefix=".key-")  # created 0600
            try:
                with os.fdopen(fd, "wb") as fh:
                    fh.write(pem)
                    fh.flush()
                    os.fsync(fh.fileno())
                try:
                    os.link(tmp, path)  # never replaces: the first process to start wins
                    log.warning("created the evidence signing key `%s` (public key `%s.pub`): "
                                "keep a copy of the public key where the log's writer cannot "
                                "change it, and verify with `evidence verify --public-key`",
                                path, path)
                except FileExistsError:
                    pass
            finally:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
        _check_private(path)
    except OSError as exc:
        raise ValueError(f"evidence signing key `{path}` cannot be created or read: "
                         f"{exc.strerror or exc}") from None
    key = load_signing_key(path)
    try:
        _write_public(path, key)
    except OSError as exc:  # the key signs all the same; the operator is told
        log.error("evidence public key `%s.pub` cannot be written: %s", path,
                  exc.strerror or exc)
    return key
