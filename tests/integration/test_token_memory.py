"""Tokens answered from memory stay exact: a token revoked by another process or connection is
refused at the very next check, in the default journal mode and in WAL mode (issue 27)."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from policy_engine.tokens import TokenStore

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("wal", [False, True])
def test_a_revocation_elsewhere_is_seen_at_the_next_check(tmp_path: Path, wal: bool) -> None:
    path = tmp_path / "tokens.sqlite"
    if wal:
        with sqlite3.connect(path) as conn:
            conn.execute("PRAGMA journal_mode=WAL")
    store = TokenStore(path)
    token, info = store.add("acme", "agent:a")
    other, _ = store.add("acme", "agent:b")
    for _ in range(3):  # answered from memory after the first
        who = store.authenticate(token)
        assert who is not None
        assert who.subject == "agent:a"
    done = subprocess.run([sys.executable, "-m", "policy_engine.cli", "tokens", "revoke",
                           info.token_id, "--state-dir", str(tmp_path)],
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    assert store.authenticate(token) is None
    assert store.authenticate(other) is not None
    # another connection of this process, too
    again = TokenStore(path)
    assert again.authenticate(other) is not None
    assert again.revoke(store.authenticate(other).token_id)  # type: ignore[union-attr]
    assert store.authenticate(other) is None
    assert again.authenticate(other) is None
    # a wrong secret for a remembered token id is still refused
    assert store.authenticate(token[:-1] + ("A" if token[-1] != "A" else "B")) is None
    store.close()
    again.close()
