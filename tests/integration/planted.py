"""A throw-away workspace with secrets planted where a sandbox must not read them."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def planted_world(prefix: str) -> Iterator[Path]:
    """A workspace under /tmp the sandbox uid can traverse: a writable `out/`, a HOME whose
    `~/.ssh` key and a `.env` are world-readable on the host (only the sandbox stops them)."""
    r = Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))
    r.chmod(0o755)
    (r / "out").mkdir(mode=0o777)
    (r / "home" / ".ssh").mkdir(parents=True)
    (r / "home" / ".ssh" / "id_ed25519").write_text("ssh-private-key-marker")
    (r / ".env").write_text("TOKEN=env-secret-marker")
    for p in (r / "home", r / "home" / ".ssh"):
        p.chmod(0o755)
    for p in (r / "home" / ".ssh" / "id_ed25519", r / ".env"):
        p.chmod(0o644)
    try:
        yield r
    finally:
        shutil.rmtree(r, ignore_errors=True)
