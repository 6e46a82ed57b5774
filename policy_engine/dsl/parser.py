"""Read and parse one `.sbpolicy` file into an AST; every failure becomes a Diagnostic."""

from __future__ import annotations

import os
import re
import threading
from collections import OrderedDict

from lark import Token
from lark.exceptions import (
    LarkError,
    UnexpectedCharacters,
    UnexpectedEOF,
    UnexpectedInput,
    UnexpectedToken,
    VisitError,
)

from policy_engine.dsl import ast
from policy_engine.dsl.grammar import comment_sink, describe_terminal, get_parser
from policy_engine.dsl.source import MAX_POLICY_BYTES as MAX_POLICY_BYTES  # re-exported:
from policy_engine.dsl.source import decode_source as decode_source  # the names' old home
from policy_engine.dsl.source import policy_too_large as policy_too_large
from policy_engine.dsl.source import read_source as read_source
from policy_engine.dsl.source import too_large as too_large
from policy_engine.dsl.transform import ToAst
from policy_engine.errors import Diagnostic, Span

_MAX_EXPECTED = 10
_OPENERS = {'"': "string literal", "`": "CEL condition", "/": "regex literal"}


_PARSED_MAX = 512
# (display name, text) -> result. Policies import the same shared files again and again (`test`
# and `lint` compile hundreds of roots importing a few fragments); the AST nodes are immutable,
# so a result can be shared, and callers get fresh lists.
_parsed: OrderedDict[tuple[str, str], tuple[ast.PolicyFile, list[Diagnostic]]] = OrderedDict()
_parsed_lock = threading.Lock()


def parse_source(text: str, file: str) -> tuple[ast.PolicyFile, list[Diagnostic]]:
    """Parse ``text`` (shown as ``file`` in spans). On a syntax error the file has no items."""
    key = (file, text)
    with _parsed_lock:
        hit = _parsed.get(key)
        if hit is not None:
            _parsed.move_to_end(key)
    if hit is None:
        hit = _parse_uncached(text, file)
        with _parsed_lock:
            _parsed[key] = hit
            if len(_parsed) > _PARSED_MAX:
                _parsed.popitem(last=False)
    pf, diags = hit
    return ast.PolicyFile(pf.file, pf.source, list(pf.items), list(pf.comments)), list(diags)


def _parse_uncached(text: str, file: str) -> tuple[ast.PolicyFile, list[Diagnostic]]:
    pf = ast.PolicyFile(file=file, source=text)
    large = policy_too_large(text, file)
    if large is not None:
        return pf, [large]
    if "\x00" in text:
        line = text.count("\n", 0, text.index("\x00")) + 1
        return pf, [Diagnostic.make("SBP102", "unexpected NUL character", Span(file, line, 1))]
    collected: list[Token] = []
    reset = comment_sink.set(collected)
    try:
        tree = get_parser().parse(text)
    except UnexpectedInput as exc:
        return pf, [_syntax_diagnostic(exc, text, file)]
    except LarkError as exc:  # pragma: no cover - lark raises UnexpectedInput for bad input
        return pf, [Diagnostic.make("SBP101", f"cannot parse: {exc}", Span(file, 1, 1))]
    finally:
        comment_sink.reset(reset)
    pf.comments = [
        ast.Comment(str(tok).rstrip("\r"), Span(file, tok.line or 1, tok.column or 1,
                                                tok.end_line, tok.end_column))
        for tok in collected
    ]
    transformer = ToAst(file)
    try:
        pf.items = transformer.transform(tree)
    except VisitError as exc:  # pragma: no cover - the transformer only builds dataclasses
        return pf, [Diagnostic.make("SBP101", f"cannot parse: {exc.orig_exc}", Span(file, 1, 1))]
    return pf, transformer.diagnostics


def parse_file(
    path: str | os.PathLike[str], display: str | None = None,
) -> tuple[ast.PolicyFile | None, list[Diagnostic]]:
    """Read and parse ``path``; ``None`` when the file cannot be read."""
    shown = display if display is not None else os.fspath(path)
    text = read_source(path, shown)
    if isinstance(text, Diagnostic):
        return None, [text]
    return parse_source(text, shown)


def _eof_span(text: str, file: str) -> Span:
    lines = text.split("\n")
    return Span(file, len(lines), len(lines[-1]) + 1)


def _expected(names: set[str] | frozenset[str] | None) -> str:
    if not names:
        return ""
    described = sorted({describe_terminal(n) for n in names})
    if len(described) > _MAX_EXPECTED:
        described = [*described[:_MAX_EXPECTED], f"or {len(described) - _MAX_EXPECTED} more"]
    return "; expected " + ", ".join(described)


def _accepted(exc: UnexpectedToken) -> set[str]:
    """The terminals the parser really accepts here (LALR lookahead sets are merged, so the
    state's raw ``expected`` can name tokens that would fail one reduction later)."""
    parser = getattr(exc, "interactive_parser", None)
    if parser is not None:
        try:
            return set(parser.accepts())
        except LarkError:  # pragma: no cover - fall back to the state's lookahead set
            pass
    return set(exc.expected)


_REGEX_OPEN = re.compile(r"(?:^|[\[,|\s])/")


def regex_slash_help(text: str, line: int, column: int) -> str | None:
    """When the error sits right after a regex literal's closing ``/`` (``/src/.*/``: the regex
    ended at the second slash), say to escape the slash, with the literal rewritten."""
    lines = text.split("\n")
    if not 1 <= line <= len(lines) or column < 2:
        return None
    row = lines[line - 1]
    closing = column - 2  # 0-based index of the character before the error
    if closing >= len(row) or row[closing] != "/":
        return None
    opens = [m.end() - 1 for m in _REGEX_OPEN.finditer(row, 0, closing)]
    if not opens:
        return None
    start = opens[-1]
    end = _literal_end(row, closing + 1)
    body = re.sub(r"(?<!\\)/", r"\\/", row[start + 1:end])
    return (f"a `/` ends a regex literal: write `\\/` for a slash inside it "
            f"(`/{body}/`)")


def _literal_end(row: str, index: int) -> int:
    """Where the regex the author meant ends: the last `/` before a list delimiter."""
    end = index - 1
    for i in range(index, len(row)):
        if row[i] in ",]|" or row[i].isspace():
            break
        if row[i] == "/" and row[i - 1] != "\\":
            end = i
    return end


def _syntax_diagnostic(exc: UnexpectedInput, text: str, file: str) -> Diagnostic:
    if isinstance(exc, UnexpectedCharacters):
        span = Span(file, exc.line, exc.column)
        char = exc.char
        if char in _OPENERS and (char != "/" or "REGEX" in (exc.allowed or ())):
            return Diagnostic.make("SBP104", f"unterminated {_OPENERS[char]}", span)
        shown = repr(char)[1:-1] if not char.isprintable() or char == "`" else char
        if char == "`":
            shown = "\\`"
        return Diagnostic.make(
            "SBP102", f"unexpected character `{shown}`{_expected(exc.allowed)}", span,
            help=regex_slash_help(text, exc.line, exc.column),
        )
    if isinstance(exc, UnexpectedToken):
        tok = exc.token
        expected = _accepted(exc)
        if tok.type == "$END":
            return Diagnostic.make(
                "SBP103", f"unexpected end of file{_expected(expected)}",
                _eof_span(text, file),
            )
        span = Span(file, tok.line or 1, tok.column or 1, tok.end_line, tok.end_column)
        shown = str(tok).replace("\n", " ")
        if len(shown) > 40:
            shown = shown[:37] + "..."
        return Diagnostic.make(
            "SBP101", f"unexpected `{shown}`{_expected(expected)}", span,
            help=regex_slash_help(text, tok.line or 1, tok.column or 1),
        )
    if isinstance(exc, UnexpectedEOF):
        return Diagnostic.make(
            "SBP103", f"unexpected end of file{_expected(set(exc.expected))}",
            _eof_span(text, file),
        )
    return Diagnostic.make(  # pragma: no cover - the three cases above are exhaustive
        "SBP101", "syntax error", Span(file, exc.line or 1, exc.column or 1),
    )
