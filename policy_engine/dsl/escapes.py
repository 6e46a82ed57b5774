"""String literal escapes of the `.sbpolicy` language, shared by the AST builder and the fast
reader (Lark-free, so the fast reader never imports the parser)."""

from __future__ import annotations

_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", '"': '"', "\\": "\\", "/": "/", "0": "\0"}


def unescape(body: str) -> tuple[str, list[tuple[int, str]]]:
    """A string literal's body unescaped, with the offset and letter of every invalid escape
    (dropped from the text). Shared by the AST builder and the fast reader."""
    if "\\" not in body:
        return body, []
    out: list[str] = []
    bad: list[tuple[int, str]] = []
    i = 0
    while i < len(body):
        ch = body[i]
        if ch != "\\":
            out.append(ch)
            i += 1
            continue
        esc = body[i + 1] if i + 1 < len(body) else ""
        if esc in _ESCAPES:
            out.append(_ESCAPES[esc])
            i += 2
        elif esc == "u" and _is_hex(body[i + 2:i + 6]):
            out.append(chr(int(body[i + 2:i + 6], 16)))
            i += 6
        else:
            bad.append((i, esc))
            i += 2
    return "".join(out), bad


def _is_hex(s: str) -> bool:
    return len(s) == 4 and all(ch in "0123456789abcdefABCDEF" for ch in s)
