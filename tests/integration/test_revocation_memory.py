"""The SQLite revocation list answered from memory stays exact: a grant revoked by another
process or connection is refused at the very next check; a list too long to hold is looked up
per call (issue 27)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from policy_engine.errors import ErrorCode, PolicyEngineError
from policy_engine.model import Grant
from policy_engine.orchestration import revocation
from policy_engine.orchestration.revocation import SqliteRevocationList

pytestmark = pytest.mark.integration


def _grant(call_id: str, fingerprint: str | None = None) -> Grant:
    extra = {"decision_key_fingerprint": fingerprint} if fingerprint else {}
    return Grant(tenant="acme", subject_id="agent:a", tool_name="reader", call_id=call_id,
                 expires_at=4102444800000, capabilities=[], **extra)


def _revoke_elsewhere(path: Path, key: str) -> None:
    code = ("import sys; from pathlib import Path; "
            "from policy_engine.orchestration.revocation import SqliteRevocationList as L; "
            "l = L(Path(sys.argv[1])); l.revoke(sys.argv[2]); l.close()")
    done = subprocess.run([sys.executable, "-c", code, str(path), key], capture_output=True,
                          text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr


def test_a_revocation_elsewhere_is_seen_at_the_next_check(tmp_path: Path) -> None:
    path = tmp_path / "revocations.sqlite"
    rl = SqliteRevocationList(path)
    for _ in range(3):  # read whole once, then answered from memory
        assert not rl.is_revoked(_grant("c-1"))
        assert not rl.is_revoked(_grant("c-2", "fp-1"))
    _revoke_elsewhere(path, "c-1")
    assert rl.is_revoked(_grant("c-1"))
    assert not rl.is_revoked(_grant("c-2", "fp-1"))
    _revoke_elsewhere(path, "fp-1")  # the authorization: every call under it
    assert rl.is_revoked(_grant("c-2", "fp-1"))
    assert rl.is_revoked(_grant("c-3", "fp-1"))
    # another connection of this process, and this connection's own write
    other = SqliteRevocationList(path)
    assert not rl.is_revoked(_grant("c-4"))
    other.revoke("c-4")
    assert rl.is_revoked(_grant("c-4"))
    assert not other.is_revoked(_grant("c-5"))
    other.revoke("c-5")
    assert other.is_revoked(_grant("c-5"))
    assert rl.is_revoked(_grant("c-5"))
    rl.close()
    other.close()


def test_a_list_too_long_to_hold_is_looked_up(tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(revocation, "MAX_REMEMBERED", 2)
    path = tmp_path / "revocations.sqlite"
    rl = SqliteRevocationList(path)
    for key in ("a", "b", "c"):
        rl.revoke(key)
    assert rl.is_revoked(_grant("c"))
    assert rl.is_revoked(_grant("a"))
    assert not rl.is_revoked(_grant("d"))
    _revoke_elsewhere(path, "d")
    assert rl.is_revoked(_grant("d"))
    rl.close()


def test_an_unreadable_list_still_fails_closed(tmp_path: Path) -> None:
    path = tmp_path / "revocations.sqlite"
    rl = SqliteRevocationList(path)
    assert not rl.is_revoked(_grant("c-1"))  # remembered
    rl.close()
    path.write_bytes(b"not a database" * 100)
    broken = SqliteRevocationList(path)
    with pytest.raises(PolicyEngineError) as caught:
        broken.is_revoked(_grant("c-1"))
    assert caught.value.code == ErrorCode.PROVIDER_UNAVAILABLE
    broken.close()
