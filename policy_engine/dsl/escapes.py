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
            code = int(body[i + 2:i + 6], 16)
            low = _low_surrogate(body, i + 6) if 0xD800 <= code <= 0xDBFF else None
            if low is not None:
                # A UTF-16 pair (as JSON writes characters above U+FFFF) is one character.
                out.append(chr(0x10000 + ((code - 0xD800) << 10) + (low - 0xDC00)))
                i += 12
            elif 0xD800 <= code <= 0xDFFF:
                # A lone surrogate is no character: no file, host or hash can carry it (UTF-8
                # refuses to encode it), so it is refused here, at the literal.
                bad.append((i, body[i + 1:i + 6]))
                i += 6
            else:
                out.append(chr(code))
                i += 6
        else:
            bad.append((i, esc))
            i += 2
    return "".join(out), bad


def _low_surrogate(body: str, i: int) -> int | None:
    """The low surrogate escaped at `body[i:]` (`\\uDC00`-`\\uDFFF`), if one is there."""
    if body[i:i + 2] != "\\u" or not _is_hex(body[i + 2:i + 6]):
        return None
    code = int(body[i + 2:i + 6], 16)
    return code if 0xDC00 <= code <= 0xDFFF else None


def is_surrogate_escape(esc: str) -> bool:
    """Whether a bad escape `unescape` reported is a lone surrogate (`uD800`-`uDFFF`)."""
    return len(esc) == 5 and esc[0] == "u"


def _is_hex(s: str) -> bool:
    return len(s) == 4 and all(ch in "0123456789abcdefABCDEF" for ch in s)
