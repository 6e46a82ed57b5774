"""MCP file skills give the model text when the bytes are UTF-8 (issue 28 item 7): whole
files, previews cut inside a character, and bytes that are not UTF-8 (base64 only)."""

from __future__ import annotations

import base64

from policy_engine.mcp.session_tools import with_text as _with_text


def _out(data: bytes, **extra: object) -> dict[str, object]:
    return {"bytes_b64": base64.b64encode(data).decode(), "size": len(data), **extra}


def test_utf8_bytes_come_back_as_text_beside_the_base64() -> None:
    out = _with_text(_out("héllo wörld\n".encode()))
    assert out["text"] == "héllo wörld\n"
    assert base64.b64decode(str(out["bytes_b64"])) == "héllo wörld\n".encode()


def test_a_preview_cut_inside_a_character_is_still_text() -> None:
    whole = ("ab" + "é" * 10).encode()  # 22 bytes; the preview cuts the 6th é in two
    out = _with_text(_out(whole[:13], size=len(whole), preview_truncated=True))
    assert out["text"] == "abééééé\n[… truncated: 22 bytes in all]"


def test_bytes_that_are_not_utf8_stay_base64_only() -> None:
    for data in (b"\x80\x81binary", b"ok\xff\xfe", "é".encode()[:1]):
        out = _with_text(_out(data))
        assert "text" not in out, data
    # an incomplete character at the end of a *whole* file is not text either
    assert "text" not in _with_text(_out(b"abc\xc3", preview_truncated=False))
