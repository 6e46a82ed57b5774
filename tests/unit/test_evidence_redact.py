"""Redacted forms for evidence: URLs, per-argument summaries, keyed digests, log audits."""

from __future__ import annotations

import base64
import hashlib
import hmac
import stat
from pathlib import Path

import pytest

from policy_engine.evidence import (
    capability_string,
    inputs_digest,
    load_or_create_key,
    redact_audit,
    redact_url,
    request_summary,
    summarize_args,
)
from policy_engine.evidence.redact import key_id, keyed_digest, slot_assignment
from policy_engine.model import ArgAlternative, ArgSlot, BrowserNavOp, NetHttpOp, ProcExecOp
from policy_engine.patterns.argv import compile_slots


@pytest.mark.parametrize(("url", "shown"), [
    ("http://user:pw@127.0.0.1:8080/a/b?token=x#frag", "http://127.0.0.1:8080/a/b"),
    ("https://example.com/p?q=1", "https://example.com/p"),
    ("https://[::1]:443/x#t", "https://[::1]:443/x"),
    ("HTTPS://Example.COM", "https://example.com"),
    ("no scheme here", "<unparsed>"),
    ("http://[::1/", "<unparsed>"),
])
def test_redact_url_drops_user_info_query_and_fragment(url: str, shown: str) -> None:
    assert redact_url(url) == shown


def test_capability_string_keeps_no_url_secret() -> None:
    op = NetHttpOp(method="post", url="http://u:SECRET@h.example/x?k=TOKEN#FRAG")
    assert capability_string(op) == "net.http:POST:http://h.example/x"
    assert capability_string(BrowserNavOp(url="http://h.example/?t=TOKEN#x")) == \
        "browser.nav:http://h.example/"


def _slots(*spec: tuple[tuple[str, ...], bool]) -> tuple[ArgSlot, ...]:
    out = []
    for alts, repeat in spec:
        out.append(ArgSlot(alternatives=tuple(
            ArgAlternative(regex=a[1:-1]) if a.startswith("/") else ArgAlternative(literal=a)
            for a in alts), repeat=repeat))
    return tuple(out)


def test_slot_assignment_follows_repeats_and_backtracks() -> None:
    tmpl = _slots((("-m",), False), ((r"/-.*/",), True), (("pytest",), False),
                  ((r"/[a-z]+/",), True))
    slots = compile_slots(tmpl)
    assert slot_assignment(slots, ("-m", "pytest")) == [0, 2]
    assert slot_assignment(slots, ("-m", "-q", "-x", "pytest", "tests", "more")) == \
        [0, 1, 1, 2, 3, 3]
    assert slot_assignment(slots, ("-m",)) is None
    assert slot_assignment(slots, ("pytest",)) is None
    assert slot_assignment(compile_slots(()), ()) == []


def test_summaries_show_template_literals_and_digest_everything_else(tmp_path: Path) -> None:
    key = load_or_create_key(tmp_path)
    tmpl = _slots((("-c",), False), ((r"/.*/",), True))
    got = summarize_args(("-c", "print(1)", "--token=SECRET"), key, tmpl)
    assert got[0] == {"slot": 0, "literal": "-c"}
    assert got[1] == {"slot": 1, "size": 8, "hmac": keyed_digest(key, "print(1)")}
    assert got[2]["slot"] == 1
    assert "SECRET" not in repr(got)
    # no template (a denied call): no literal is trusted, every argument is digested
    assert summarize_args(("-c",), key) == [{"size": 2, "hmac": keyed_digest(key, "-c")}]
    # without a key (explain): sizes only
    assert summarize_args(("--token=SECRET",), None) == [{"size": 14}]
    meta = request_summary(ProcExecOp(tool="python3", args=("-c", "x"), env={"K": "V"}), key,
                           tmpl)
    assert meta is not None
    assert meta.meta["argc"] == 2
    assert meta.meta["env_keys"] == ["K"]
    assert meta.meta["hmac_key"] == key_id(key)


def test_key_is_created_once_private_and_is_a_real_hmac_key(tmp_path: Path) -> None:
    key = load_or_create_key(tmp_path)
    path = tmp_path / "keys" / "evidence-hmac.key"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert load_or_create_key(tmp_path) == key
    expected = hmac.new(key, b"x", hashlib.sha256).digest()
    assert keyed_digest(key, "x") == base64.b64encode(expected).decode()
    # the keyed digest differs from a plain one (which anyone could brute-force)
    assert keyed_digest(key, "x") != keyed_digest(b"\0" * 32, "x")
    path.write_bytes(b"short")
    with pytest.raises(ValueError, match="shorter"):
        load_or_create_key(tmp_path)


def test_inputs_digest_depends_on_arguments_but_holds_none(tmp_path: Path) -> None:
    key = load_or_create_key(tmp_path)
    a = inputs_digest(ProcExecOp(tool="t", args=("one",)), key)
    b = inputs_digest(ProcExecOp(tool="t", args=("two",)), key)
    assert a != b
    assert inputs_digest(NetHttpOp(url="http://h/?t=1"), key) != \
        inputs_digest(NetHttpOp(url="http://h/?t=2"), key)


def test_redact_audit_keeps_engine_values_and_sizes_the_rest() -> None:
    got = redact_audit({"errno": 2, "path": "/w/x", "rule": "r1",
                        "url": "http://u:p@h/x?t=SECRET", "message": "boom SECRET",
                        "removed": ["a", "http://h/?k=SECRET"]})
    assert got["errno"] == 2
    assert got["path"] == "/w/x"
    assert got["removed"] == ["a", "http://h/"]
    assert "SECRET" not in repr(got)
    assert got["message"].startswith("<str, 11 chars")


def test_a_state_dir_that_cannot_hold_the_key_is_a_clear_error(tmp_path: Path) -> None:
    blocker = tmp_path / "state"
    blocker.write_text("a file where the state directory should be")
    with pytest.raises(ValueError, match="evidence key .* cannot be created or read"):
        load_or_create_key(blocker)
