"""Service tokens are stored hashed, map to one tenant and subject, and can be revoked."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

from policy_engine.service.errors import ServiceError
from policy_engine.service.workspace import normalize_input_path
from policy_engine.tokens import TokenStore


def test_token_round_trip_and_revocation(tmp_path: Path) -> None:
    store = TokenStore(tmp_path / "tokens.sqlite")
    token, info = store.add("acme", "agent:a", "ci")
    who = store.authenticate(token)
    assert who is not None
    assert (who.tenant, who.subject, who.token_id) == ("acme", "agent:a", info.token_id)
    secret = token.split(".", 1)[1]
    raw = (tmp_path / "tokens.sqlite").read_bytes()
    assert secret.encode() not in raw  # only the hash is on disk
    assert store.authenticate(token[:-1] + ("A" if token[-1] != "A" else "B")) is None
    assert store.revoke(info.token_id) is True
    assert store.revoke(info.token_id) is False
    assert store.authenticate(token) is None
    store.close()


@pytest.mark.parametrize("bearer", ["", "pet_", "pet_zz.abc", "Bearer x", "pet_" + "0" * 16 +
                                    "." + "A" * 43, "pet_" + "0" * 16 + "." + "A" * 44])
def test_malformed_or_unknown_tokens_authenticate_nobody(tmp_path: Path, bearer: str) -> None:
    store = TokenStore(tmp_path / "tokens.sqlite")
    assert store.authenticate(bearer) is None
    store.close()


@pytest.mark.parametrize("tenant", ["", ".", "..", "../x", "a/b", "-x", "a" * 65, "a\x00"])
def test_tenants_must_be_safe_directory_names(tmp_path: Path, tenant: str) -> None:
    store = TokenStore(tmp_path / "tokens.sqlite")
    with pytest.raises(ValueError, match="tenant"):
        store.add(tenant, "s")
    assert sqlite3.connect(tmp_path / "tokens.sqlite").execute(
        "SELECT COUNT(*) FROM service_tokens").fetchone() == (0,)
    store.close()


@pytest.mark.parametrize(("raw", "norm"), [("a.txt", "a.txt"), ("x/./y.py", "x/y.py"),
                                           ("x//y", "x/y")])
def test_input_paths_are_normalized(raw: str, norm: str) -> None:
    assert normalize_input_path(raw) == norm


@pytest.mark.parametrize("raw", ["../a", "/abs", "a/../../b", "a/..", ".", "a\\b", "a\x00b"])
def test_input_paths_leaving_inputs_are_refused(raw: str) -> None:
    with pytest.raises(ServiceError) as info:
        normalize_input_path(raw)
    assert info.value.http_status == 400
    assert info.value.code == "SERVICE.BAD_REQUEST"


def test_tokens_cli_exit_codes(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from policy_engine.cli.tokens import command

    runner = CliRunner()
    state = ["--state-dir", str(tmp_path)]
    bad = runner.invoke(command, ["add", "--tenant", "../evil", "--subject", "s", *state])
    assert bad.exit_code == 2
    assert "tenant" in bad.output
    assert "Traceback" not in bad.output
    added = runner.invoke(command, ["add", "--tenant", "acme", "--subject", "s", "--format",
                                    "json", *state])
    assert added.exit_code == 0, added.output
    token_id = json.loads(added.stdout)["token_id"]
    listed = runner.invoke(command, ["list", *state])
    assert f"{token_id}  live" in listed.output
    assert runner.invoke(command, ["revoke", token_id, *state]).exit_code == 0
    assert runner.invoke(command, ["revoke", token_id, *state]).exit_code == 1
    assert f"{token_id}  revoked" in runner.invoke(command, ["list", *state]).output
