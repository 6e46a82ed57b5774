"""A hand-written reader of the `.sbpolicy` grammar (compiler, fmt, lint): same AST, ~5x faster.

``fmt --check`` and ``lint`` over a large repository are dominated by parsing, and the Lark parser
(:mod:`policy_engine.dsl.parser`) costs ~40 µs per line. This module reads the same grammar
(``dsl/sbpolicy.lark``: the same terminal regexes, the same spans from the first to the last
token of each production) with one regex scan and a recursive descent. It only ever accepts:
any input it does not fully understand — a syntax error, an invalid string escape, a NUL, a
construct the contextual lexer resolves differently — raises :class:`Unsupported`, and
:func:`parse` then defers to the official parser, which also produces the diagnostics. Tests
check that both build the identical AST (spans included) on the examples, the goldens and
generated policies.
"""

from __future__ import annotations

import re
import threading
from collections import OrderedDict
from collections.abc import Iterator
from itertools import islice
from typing import Literal

from policy_engine.dsl import ast
from policy_engine.dsl.escapes import unescape
from policy_engine.dsl.source import read_source
from policy_engine.errors import Diagnostic, Span

# The grammar's terminals (dsl/sbpolicy.lark), one alternation. Keywords are NAME tokens told
# apart by the parser; COMMENT/REGEX cannot both match at one offset (a regex needs a non-`/`).
_TOKEN = re.compile(r"""
  (?P<WS>[ \t\f\r\n]+)
| (?P<COMMENT>(?:\#|//)[^\n]*)
| (?P<STRING>"(?:[^"\\\n]|\\.)*")
| (?P<CEL>`[^`]*`)
| (?P<REGEX>/(?:[^/\\\n]|\\.)+/)
| (?P<KIND>[a-z][a-z_]*\.[a-z][a-z_]*)
| (?P<NAME>[A-Za-z_][A-Za-z0-9_]*(?:-[A-Za-z0-9_]+)*)
| (?P<QUANTITY>[0-9]+(?:\.[0-9]+)?(?:x[0-9]+|[A-Za-z]+)?)
| (?P<PUNCT>\.\.\.|[\[\]{},|])
""", re.VERBOSE)
# TOOL_BLOCK.2 of the grammar: `tool` opens a manifest block only when this lookahead holds.
_TOOL_BLOCK = re.compile(r'tool(?=\s+"(?:[^"\\\n]|\\.)*"\s+version\b)')
_RESOURCES = frozenset({"paths", "hosts", "ports", "schemes", "methods", "mime", "scopes"})
_SCALARS = frozenset({"max_bytes", "class"})
_END = ("$END", "", 0, 0, 0, 0)
_CHUNK = 4096

# (type, text, line, column, end_line, end_column); type is a terminal name or the punctuation
Tok = tuple[str, str, int, int, int, int]


class Unsupported(Exception):
    """The fast reader does not accept this input; the official parser decides."""


def parse(text: str, file: str) -> tuple[ast.PolicyFile, list[Diagnostic]]:
    """Parse like :func:`policy_engine.dsl.parser.parse_source`, fast when the input is valid.

    Results are remembered like the parser's (same file name and text: the same immutable
    nodes, fresh lists), so compiling one policy again (a reload, a test run) skips the read.
    """
    key = (file, text)
    with _parsed_lock:
        hit = _parsed.get(key)
        if hit is not None:
            _parsed.move_to_end(key)
    if hit is None:
        try:
            hit = (_Reader(text, file).read(), [])
        except Unsupported:
            from policy_engine.dsl.parser import parse_source  # Lark: only when needed

            return parse_source(text, file)  # the parser remembers its own results
        with _parsed_lock:
            _parsed[key] = hit
            if len(_parsed) > _PARSED_MAX:
                _parsed.popitem(last=False)
    pf, diags = hit
    return ast.PolicyFile(pf.file, pf.source, list(pf.items), list(pf.comments)), list(diags)


_PARSED_MAX = 512
_parsed: OrderedDict[tuple[str, str], tuple[ast.PolicyFile, list[Diagnostic]]] = OrderedDict()
_parsed_lock = threading.Lock()


def parse_file(
    path: str, display: str | None = None,
) -> tuple[ast.PolicyFile | None, list[Diagnostic]]:
    """Like :func:`policy_engine.dsl.parser.parse_file`, through the fast reader."""
    shown = display if display is not None else path
    text = read_source(path, shown)
    if isinstance(text, Diagnostic):
        return None, [text]
    return parse(text, shown)


def _tokens(text: str, file: str, comments: list[ast.Comment]) -> Iterator[Tok]:
    """The tokens of ``text``, lazily: garbage (a megabyte of `{`) is refused at its first
    tokens instead of after a list of a million of them is built (the Lark fallback then
    reports it)."""
    if "\x00" in text:
        raise Unsupported
    line, line_start, pos, size = 1, 0, 0, len(text)
    match = _TOKEN.match
    while pos < size:
        m = match(text, pos)
        if m is None:
            raise Unsupported
        kind = m.lastgroup or ""
        value = m.group()
        end = m.end()
        col = pos - line_start + 1
        if kind == "WS" or kind == "CEL":
            newlines = value.count("\n")
            if newlines:
                start_line = line
                line += newlines
                line_start = pos + value.rindex("\n") + 1
                if kind == "CEL":
                    yield ("CEL", value, start_line, col, line, end - line_start + 1)
            elif kind == "CEL":
                yield (("CEL", value, line, col, line, col + len(value)))
        elif kind == "COMMENT":
            comments.append(ast.Comment(value.rstrip("\r"),
                                        Span(file, line, col, line, col + len(value))))
        else:
            if kind == "PUNCT":
                kind = value
            elif kind == "NAME" and value == "tool" and _TOOL_BLOCK.match(text, pos):
                kind = "TOOL_BLOCK"
            yield ((kind, value, line, col, line, col + len(value)))
        pos = end
    yield _END


class _Reader:
    """Recursive descent over the token list; every production mirrors one grammar rule."""

    def __init__(self, text: str, file: str) -> None:
        self.text = text
        self.file = file
        self.comments: list[ast.Comment] = []
        self.stream = _tokens(text, file, self.comments)
        self.toks: list[Tok] = []
        self.i = 0

    def _tok(self) -> Tok:
        """The token at ``self.i``, tokenizing the next chunk when it is not read yet."""
        try:
            return self.toks[self.i]
        except IndexError:
            self.toks.extend(islice(self.stream, _CHUNK))
            if self.i >= len(self.toks):
                raise Unsupported from None  # read past $END: cannot happen on valid input
            return self.toks[self.i]

    # ---- token helpers ---------------------------------------------------------------------

    def peek(self) -> Tok:
        return self._tok()

    def next(self) -> Tok:
        tok = self._tok()
        self.i += 1
        return tok

    def expect(self, kind: str) -> Tok:
        tok = self._tok()
        if tok[0] != kind:
            raise Unsupported
        self.i += 1
        return tok

    def keyword(self, word: str) -> Tok:
        tok = self._tok()
        if tok[0] != "NAME" or tok[1] != word:
            raise Unsupported
        self.i += 1
        return tok

    def at_keyword(self, *words: str) -> bool:
        tok = self._tok()
        return tok[0] == "NAME" and tok[1] in words

    def tspan(self, tok: Tok) -> Span:
        return Span(self.file, tok[2], tok[3], tok[4], tok[5])

    def span(self, first: Tok, last: Tok) -> Span:
        return Span(self.file, first[2], first[3], last[4], last[5])

    def last(self) -> Tok:
        return self.toks[self.i - 1]

    def string(self, tok: Tok) -> ast.Str:
        return ast.Str(_unescape(tok[1][1:-1]), self.tspan(tok))

    def value(self, tok: Tok) -> ast.Value:
        if tok[0] == "STRING":
            return self.string(tok)
        if tok[0] == "QUANTITY":
            return ast.Quantity(tok[1], self.tspan(tok))
        if tok[0] == "NAME":
            return ast.Word(tok[1], self.tspan(tok))
        raise Unsupported

    def word(self) -> ast.Word:
        tok = self.expect("NAME")
        return ast.Word(tok[1], self.tspan(tok))

    # ---- top level -------------------------------------------------------------------------

    def read(self) -> ast.PolicyFile:
        items: list[ast.Item] = []
        while self.peek()[0] != "$END":
            items.append(self.item())
        return ast.PolicyFile(self.file, self.text, items, self.comments)

    def item(self) -> ast.Item:
        tok = self.peek()
        if tok[0] == "TOOL_BLOCK":
            return self.tool()
        if tok[0] != "NAME":
            raise Unsupported
        word = tok[1]
        if word == "policy":
            self.next()
            name = self.string(self.expect("STRING"))
            self.keyword("version")
            version = self.string(self.expect("STRING"))
            return ast.Header(name, version, self.span(tok, self.last()))
        if word == "import":
            self.next()
            path = self.string(self.expect("STRING"))
            return ast.Import(path, self.span(tok, self.last()))
        if word == "defaults":
            return self.defaults()
        if word in ("permit", "forbid"):
            return self.rule(in_tool=False)
        if word == "require":
            self.next()
            self.keyword("consent")
            cond = None
            if self.at_keyword("when"):
                self.next()
                cel = self.expect("CEL")
                cond = ast.Cel(cel[1][1:-1], self.tspan(cel))
            return ast.Consent(cond, self.span(tok, self.last()))
        if word == "profile":
            return self.profile()
        raise Unsupported

    def defaults(self) -> ast.Defaults:
        first = self.next()
        self.expect("{")
        settings: list[ast.Setting] = []
        limits: list[ast.LimitsBlock] = []
        while self.peek()[0] != "}":
            if self.at_keyword("timeout", "network"):
                settings.append(self.setting())
            elif self.at_keyword("limits"):
                limits.append(self.limits())
            else:
                raise Unsupported
        self.next()
        return ast.Defaults(tuple(settings), tuple(limits), self.span(first, self.last()))

    def setting(self) -> ast.Setting:
        """``timeout QUANTITY``, ``network WORD``, ``fs WORD``, ``isolation WORD``,
        ``safety WORD``."""
        key = self.next()
        want = "QUANTITY" if key[1] == "timeout" else "NAME"
        value = self.value(self.expect(want))
        return ast.Setting(key[1], value, self.span(key, self.last()))

    def limits(self) -> ast.LimitsBlock:
        first = self.next()
        self.expect("{")
        items: list[ast.Limit] = []
        while self.peek()[0] != "}":
            name = self.expect("NAME")
            qty = self.expect("QUANTITY")
            items.append(ast.Limit(ast.Word(name[1], self.tspan(name)),
                                   ast.Quantity(qty[1], self.tspan(qty)), self.span(name, qty)))
        self.next()
        return ast.LimitsBlock(tuple(items), self.span(first, self.last()))

    def values(self) -> tuple[ast.Value, ...]:
        self.expect("[")
        out: list[ast.Value] = []
        while self.peek()[0] != "]":
            out.append(self.value(self.next()))
            if self.peek()[0] == ",":
                self.next()
            elif self.peek()[0] != "]":
                raise Unsupported
        self.next()
        return tuple(out)

    # ---- rules -----------------------------------------------------------------------------

    def rule(self, *, in_tool: bool) -> ast.Rule:
        first = self.next()
        effect: Literal["permit", "forbid"] = "permit" if first[1] == "permit" else "forbid"
        if in_tool and effect != "permit":
            raise Unsupported
        mandatory = False
        if not in_tool and self.at_keyword("mandatory"):
            self.next()
            mandatory = True
        name = self.string(self.next()) if self.peek()[0] == "STRING" else None
        kinds = [self.expect("KIND")]
        while self.peek()[0] == ",":
            self.next()
            kinds.append(self.expect("KIND"))
        clauses: list[ast.Clause] = []
        while True:
            clause = self.clause(in_tool=in_tool)
            if clause is None:
                break
            clauses.append(clause)
        return ast.Rule(effect, mandatory, name,
                        tuple(ast.Word(k[1], self.tspan(k)) for k in kinds),
                        tuple(clauses), self.span(first, self.last()))

    def clause(self, *, in_tool: bool) -> ast.Clause | None:
        tok = self.peek()
        if tok[0] == "TOOL_BLOCK" and in_tool:
            raise Unsupported  # the contextual lexer reads TOOL here; let Lark decide
        if tok[0] != "NAME":
            return None
        word = tok[1]
        if word in _RESOURCES:
            self.next()
            values = self.values()
            return ast.Resource(word, values, self.span(tok, self.last()))
        if word == "tool":
            return self.tool_clause()
        if word == "env":
            return self.env_clause()
        if word in _SCALARS:
            self.next()
            value_tok = self.next()
            if value_tok[0] not in ("QUANTITY", "STRING", "NAME"):
                raise Unsupported
            return ast.Scalar(word, self.value(value_tok), self.span(tok, value_tok))
        if in_tool:
            return None  # limits/timeout/... are tool items, not clauses of a tool permit
        if word == "limits":
            return self.limits()
        if word == "when":
            self.next()
            cel = self.expect("CEL")
            return ast.Cel(cel[1][1:-1], self.tspan(cel))
        return None

    def tool_clause(self) -> ast.ToolClause:
        first = self.next()
        tool = self.string(self.expect("STRING"))
        args: tuple[ast.ArgSlotNode, ...] | None = None
        if self.at_keyword("args"):
            self.next()
            self.expect("[")
            slots: list[ast.ArgSlotNode] = []
            while self.peek()[0] != "]":
                slots.append(self.slot())
                if self.peek()[0] == ",":
                    self.next()
                elif self.peek()[0] != "]":
                    raise Unsupported
            self.next()
            args = tuple(slots)
        return ast.ToolClause(tool, args, self.span(first, self.last()))

    def env_clause(self) -> ast.EnvClause:
        first = self.next()
        self.expect("[")
        names: list[ast.ArgAlt] = []
        while self.peek()[0] != "]":
            names.append(self.alt())
            if self.peek()[0] == ",":
                self.next()
            elif self.peek()[0] != "]":
                raise Unsupported
        self.next()
        return ast.EnvClause(tuple(names), self.span(first, self.last()))

    def slot(self) -> ast.ArgSlotNode:
        first = self.peek()
        alts = [self.alt()]
        while self.peek()[0] == "|":
            self.next()
            alts.append(self.alt())
        repeat = self.peek()[0] == "..."
        if repeat:
            self.next()
        return ast.ArgSlotNode(tuple(alts), repeat, self.span(first, self.last()))

    def alt(self) -> ast.ArgAlt:
        tok = self.next()
        if tok[0] == "STRING":
            return ast.ArgAlt(_unescape(tok[1][1:-1]), None, self.tspan(tok))
        if tok[0] == "REGEX":
            return ast.ArgAlt(None, tok[1][1:-1].replace("\\/", "/"), self.tspan(tok))
        raise Unsupported

    # ---- profiles and tools ----------------------------------------------------------------

    def profile(self) -> ast.ProfileDef:
        first = self.next()
        name = self.string(self.expect("STRING"))
        self.expect("{")
        settings: list[ast.Setting | ast.ListSetting] = []
        limits: list[ast.LimitsBlock] = []
        while self.peek()[0] != "}":
            if self.at_keyword("network", "timeout", "fs", "isolation"):
                settings.append(self.setting())
            elif self.at_keyword("writable"):
                key = self.next()
                values = self.values()
                settings.append(ast.ListSetting("writable", values, self.span(key, self.last())))
            elif self.at_keyword("limits"):
                limits.append(self.limits())
            else:
                raise Unsupported
        self.next()
        return ast.ProfileDef(name, tuple(settings), tuple(limits), self.span(first, self.last()))

    def tool(self) -> ast.ToolDef:
        first = self.next()
        name = self.string(self.expect("STRING"))
        self.keyword("version")
        version = self.string(self.expect("STRING"))
        self.expect("{")
        permits: list[ast.Rule] = []
        settings: list[ast.Setting | ast.ListSetting] = []
        limits: list[ast.LimitsBlock] = []
        while self.peek()[0] != "}":
            tok = self.peek()
            word = tok[1] if tok[0] == "NAME" else ""
            if word == "permit":
                permits.append(self.rule(in_tool=True))
            elif word in ("network", "timeout", "safety"):
                settings.append(self.setting())
            elif word == "description":
                self.next()
                text = self.string(self.expect("STRING"))
                settings.append(ast.Setting("description", text, self.span(tok, self.last())))
            elif word == "profile":
                self.next()
                prof = self.string(self.expect("STRING"))
                settings.append(ast.Setting("profile", prof, self.span(tok, self.last())))
            elif word == "side_effects":
                self.next()
                values = self.values()
                settings.append(ast.ListSetting("side_effects", values,
                                                self.span(tok, self.last())))
            elif word == "limits":
                limits.append(self.limits())
            else:
                raise Unsupported
        self.next()
        return ast.ToolDef(name, version, tuple(permits), tuple(settings), tuple(limits),
                           self.span(first, self.last()))


def _unescape(body: str) -> str:
    """The AST builder's unescaping; an escape it would report (SBP104) is Unsupported here."""
    text, bad = unescape(body)
    if bad:
        raise Unsupported
    return text
