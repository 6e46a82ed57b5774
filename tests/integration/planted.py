"""A throw-away workspace with secrets planted where a sandbox must not read them."""

from __future__ import annotations

import shutil
import tempfile
import threading
import uuid
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


@contextmanager
def coming_and_going(tree: Path, seconds: float) -> Iterator[None]:
    """A `.env` in a fresh directory of ``tree`` that lives ``seconds``, then is gone as long,
    over and over until the block ends (a masked path that vanishes between a plan and the
    sandbox's start)."""
    stop = threading.Event()

    def run() -> None:
        while not stop.is_set():
            where = tree / f"d-{uuid.uuid4().hex[:10]}"
            where.mkdir()
            try:
                (where / ".env").write_text("X=1\n")
                stop.wait(seconds)
            finally:
                shutil.rmtree(where, ignore_errors=True)
            stop.wait(seconds)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    try:
        yield
    finally:
        stop.set()
        t.join(timeout=10)
