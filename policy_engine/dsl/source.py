"""Reading a `.sbpolicy` file's text: size limit, regular files only, UTF-8; no parser needed.

Kept apart from :mod:`policy_engine.dsl.parser` so the fast reader (``fastparse``) and the
commands that only compile policies never import Lark.
"""

from __future__ import annotations

import os

from policy_engine.errors import Diagnostic, Span
from policy_engine.inputs.inputfile import REGULAR_ONLY_HELP, NotRegularFile, read_limited

MAX_POLICY_BYTES = 1024 * 1024
"""The largest `.sbpolicy` file any command reads (docs/operations.md, "Input limits")."""


def read_source(
    path: str | os.PathLike[str], display: str | None = None, *, max_bytes: int | None = None,
) -> str | Diagnostic:
    """Read ``path`` as UTF-8 text, or return the diagnostic saying why it cannot be: SBP100
    (unreadable, not UTF-8) or SBP106 (more than ``max_bytes``, default
    :data:`MAX_POLICY_BYTES`; only that much plus one byte is ever read)."""
    shown = display if display is not None else os.fspath(path)
    limit = MAX_POLICY_BYTES if max_bytes is None else max_bytes
    try:
        data = read_limited(path, limit)
    except NotRegularFile as exc:
        if exc.kind == "a directory":
            return Diagnostic.make("SBP100", f"`{shown}` is a directory, not a file",
                                   Span(shown, 1, 1))
        return Diagnostic.make(
            "SBP100", f"`{_printable(shown)}` is {exc.kind}, not a regular file",
            Span(shown, 1, 1), help=REGULAR_ONLY_HELP)
    except FileNotFoundError:
        return Diagnostic.make("SBP100", f"`{shown}` does not exist", None)
    except OSError as exc:
        return Diagnostic.make("SBP100", f"cannot read `{shown}`: {exc.strerror or exc}", None)
    except ValueError:  # open() refuses a NUL in the path before the OS sees it
        return Diagnostic.make("SBP100", f"cannot read `{_printable(shown)}`: the path contains "
                               "a NUL byte", None)
    if len(data) > limit:
        return too_large(shown, limit)
    return decode_source(data, shown)


def too_large(shown: str, limit: int) -> Diagnostic:
    """SBP106 for an input over ``limit`` bytes."""
    policy = limit == MAX_POLICY_BYTES
    return Diagnostic.make(
        "SBP106", f"`{_printable(shown)}` is larger than {limit:,} bytes, the limit for "
        f"{'policy files' if policy else 'JSON/YAML documents'}",
        Span(shown, 1, 1),
        help="split the policy into files joined with `import`" if policy else None,
    )


def _printable(text: str) -> str:
    return text.replace("\x00", "\\0")


def policy_too_large(text: str, file: str) -> Diagnostic | None:
    """SBP106 when policy ``text`` is over :data:`MAX_POLICY_BYTES` in UTF-8 (checked before any
    parser allocates per-token memory)."""
    if len(text) * 4 <= MAX_POLICY_BYTES:  # a character is at most four bytes
        return None
    if len(text.encode("utf-8", errors="surrogatepass")) <= MAX_POLICY_BYTES:
        return None
    return too_large(file, MAX_POLICY_BYTES)


def decode_source(data: bytes, shown: str) -> str | Diagnostic:
    """``data`` as UTF-8 text, or the SBP100 diagnostic at the first invalid byte."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        col = exc.start - (data.rfind(b"\n", 0, exc.start) + 1) + 1
        return Diagnostic.make(
            "SBP100", f"`{shown}` is not UTF-8 text (invalid byte 0x{data[exc.start]:02x})",
            Span(shown, line, col), help="save the file as UTF-8",
        )
