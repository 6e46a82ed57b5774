"""Lay out a parsed file in the canonical style (docs/fmt.md), keeping every comment.

Comments are placed by position: a comment on the line where a statement, clause, list item
or block entry ends is a trailing comment of it; any other comment between two of them leads
the next one (or, after the last, stays before the closing bracket). A comment inside a
construct that the canonical layout keeps on one line (between ``permit`` and the rule name,
between the alternatives of an argument slot, ...) moves to its own line just before that
construct. Nothing is ever dropped: the comment-preservation test counts them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from policy_engine.dsl import ast
from policy_engine.errors import Span
from policy_engine.fmt import layout
from policy_engine.fmt.layout import BLANK, INDENT, SEP, WIDTH, Line, Lines, attach, own

Pos = tuple[int, int]
Render = Callable[[list[ast.Comment], int], Lines]


def format_ast(pf: ast.PolicyFile) -> str:
    """The canonical text of ``pf`` (parsed without errors), ending in one newline."""
    blank = {i for i, ln in enumerate(pf.source.split("\n"), 1) if not ln.strip(" \t\f\r")}
    printer = _Printer(sorted(pf.comments, key=_pos), blank)
    entries = [(_span_of(item), printer.item_renderer(item)) for item in pf.items]
    opener, lines = printer.vertical(entries, printer.comments, 0, open_line=None)
    assert not opener  # INVARIANT: with no opener line, every comment becomes a line
    return layout.render(lines)


def _pos(c: ast.Comment) -> Pos:
    return (c.span.line, c.span.column)


def _start(span: Span) -> Pos:
    return (span.line, span.column)


def _end(span: Span) -> Pos:
    return (span.end_line or span.line, span.end_column or span.column)


def _end_line(span: Span) -> int:
    return span.end_line or span.line


def _span_of(node: ast.Item | ast.Clause | ast.Setting | ast.ListSetting | ast.Limit
             | ast.ArgSlotNode | ast.Value) -> Span:
    return node.span


@dataclass(slots=True)
class _Slot:
    """The comments around one child of a construct."""

    leading: list[ast.Comment] = field(default_factory=list)
    inner: list[ast.Comment] = field(default_factory=list)
    trailing: list[ast.Comment] = field(default_factory=list)


def split(comments: Sequence[ast.Comment], spans: Sequence[Span], open_line: int | None,
          ) -> tuple[list[ast.Comment], list[_Slot], list[ast.Comment]]:
    """Share ``comments`` (sorted) among children: (on the opener's line, per child, after all).

    :param open_line: the line of the construct's opening token; a comment on it before the
        first child trails the opener. ``None`` at the top level of a file.
    """
    opener: list[ast.Comment] = []
    slots = [_Slot() for _ in spans]
    dangling: list[ast.Comment] = []
    k = 0
    for i, span in enumerate(spans):
        start, end = _start(span), _end(span)
        while k < len(comments) and _pos(comments[k]) < start:
            c = comments[k]
            if i > 0 and c.span.line == _end_line(spans[i - 1]):
                slots[i - 1].trailing.append(c)
            elif i == 0 and c.span.line == open_line:
                opener.append(c)
            else:
                slots[i].leading.append(c)
            k += 1
        while k < len(comments) and _pos(comments[k]) < end:
            slots[i].inner.append(comments[k])
            k += 1
    for c in comments[k:]:
        if spans and c.span.line == _end_line(spans[-1]):
            slots[-1].trailing.append(c)
        elif not spans and c.span.line == open_line:
            opener.append(c)
        else:
            dangling.append(c)
    return opener, slots, dangling


@dataclass(slots=True)
class _Piece:
    """A rule clause: its one-line form if it has one, else its multi-line form."""

    flat: str | None
    broken: Callable[[int], Lines]
    hoisted: list[ast.Comment]
    own_line: bool = False


class _Printer:
    def __init__(self, comments: list[ast.Comment], blank: set[int]) -> None:
        self.comments = comments
        self.blank = blank  # the source's whitespace-only lines

    # ---- vertical sequences: file items, block entries, list items -------------------------

    def vertical(self, entries: Sequence[tuple[Span, Render]], comments: list[ast.Comment],
                 indent: int, open_line: int | None,
                 ) -> tuple[list[ast.Comment], Lines]:
        """Entries one per line at ``indent`` with their comments; one blank line where the
        source has one or more between two of them (never first or last)."""
        opener, slots, dangling = split(comments, [s for s, _ in entries], open_line)
        out: Lines = []
        prev_end: int | None = None

        def gap(start: int) -> None:
            if prev_end is not None and any(n in self.blank for n in range(prev_end + 1, start)):
                out.append(BLANK)

        for (span, render), slot in zip(entries, slots, strict=True):
            for c in slot.leading:
                gap(c.span.line)
                out.append(own(c, indent))
                prev_end = c.span.line
            gap(span.line)
            out.extend(render(slot.inner, indent))
            for c in slot.trailing:
                attach(out, c)
            prev_end = _end_line(span)
        for c in dangling:
            gap(c.span.line)
            out.append(own(c, indent))
            prev_end = c.span.line
        return opener, out

    def block(self, head: str, span: Span, entries: Sequence[tuple[Span, Render]],
              comments: list[ast.Comment], indent: int, *, inline_ok: bool) -> Lines:
        """``head { entries }``: on one line when allowed and it fits, else one entry a line."""
        if not comments and inline_ok:
            parts = [_flat(r, indent) for _, r in entries]
            if all(p is not None for p in parts):
                inner = SEP.join(p for p in parts if p)
                text = f"{head} {{ {inner} }}" if parts else f"{head} {{}}"
                if indent + len(text) <= WIDTH:
                    return [Line(indent, text)]
        opener, body = self.vertical(entries, comments, indent + INDENT, span.line)
        if not body and not opener:
            return [Line(indent, f"{head} {{}}")]
        first: Lines = [Line(indent, f"{head} {{")]
        for c in opener:
            attach(first, c)
        return [*first, *body, Line(indent, "}")]

    # ---- items -----------------------------------------------------------------------------

    def item_renderer(self, item: ast.Item) -> Render:
        if isinstance(item, ast.Header):
            name, version = layout.quote(item.name.value), layout.quote(item.version.value)
            return _atom(f"policy {name} version {version}")
        if isinstance(item, ast.Import):
            return _atom(f"import {layout.quote(item.path.value)}")
        if isinstance(item, ast.Rule):
            return lambda cs, ind: self.rule(item, cs, ind)
        if isinstance(item, ast.Consent):
            return lambda cs, ind: self.consent(item, cs, ind)
        if isinstance(item, ast.Defaults):
            entries = self.entries([*item.settings, *item.limits])
            return lambda cs, ind: self.block("defaults", item.span, entries, cs, ind,
                                              inline_ok=not item.limits)
        if isinstance(item, ast.ProfileDef):
            entries = self.entries([*item.settings, *item.limits])
            head = f"profile {layout.quote(item.name.value)}"
            return lambda cs, ind: self.block(head, item.span, entries, cs, ind,
                                              inline_ok=not item.limits)
        entries = self.entries([*item.permits, *item.settings, *item.limits])
        head = (f"tool {layout.quote(item.name.value)} "
                f"version {layout.quote(item.version.value)}")
        return lambda cs, ind: self.block(head, item.span, entries, cs, ind, inline_ok=False)

    def entries(self, nodes: Sequence[ast.Rule | ast.Setting | ast.ListSetting
                                      | ast.LimitsBlock]) -> list[tuple[Span, Render]]:
        """Block entries in source order (the AST groups them by kind)."""
        out: list[tuple[Span, Render]] = []
        for node in sorted(nodes, key=lambda n: _start(n.span)):
            out.append((node.span, self.entry_renderer(node)))
        return out

    def entry_renderer(self, node: ast.Rule | ast.Setting | ast.ListSetting
                       | ast.LimitsBlock) -> Render:
        if isinstance(node, ast.Rule):
            return lambda cs, ind: self.rule(node, cs, ind)
        if isinstance(node, ast.Setting):
            return _atom(f"{node.key} {layout.value(node.value)}")
        if isinstance(node, ast.ListSetting):
            return self.fitted(lambda cs: self.values_piece(node.key, node.span,
                                                            node.values, cs))
        return self.fitted(lambda cs: self.limits_piece(node, cs))

    def fitted(self, make: Callable[[list[ast.Comment]], _Piece]) -> Render:
        """A block entry from a clause-like piece: one line if it fits, else broken."""
        def render(cs: list[ast.Comment], ind: int) -> Lines:
            piece = make(cs)
            lines: Lines = [own(c, ind) for c in piece.hoisted]
            if piece.flat is not None and ind + len(piece.flat) <= WIDTH:
                return [*lines, Line(ind, piece.flat)]
            return [*lines, *piece.broken(ind)]
        return render

    def consent(self, node: ast.Consent, cs: list[ast.Comment], ind: int) -> Lines:
        lines: Lines = [own(c, ind) for c in cs]
        if node.condition is None:
            return [*lines, Line(ind, "require consent")]
        head = "require consent when "
        return [*lines, Line(ind, head + layout.cel(node.condition, ind + len(head) + 1))]

    # ---- rules -----------------------------------------------------------------------------

    def rule(self, node: ast.Rule, cs: list[ast.Comment], ind: int) -> Lines:
        """One line when it fits; else the head, then the clauses filling continuation lines
        (``limits``, ``when`` and multi-line clauses each on a line of their own)."""
        parts: list[str] = [node.effect]
        if node.mandatory:
            parts.append("mandatory")
        if node.name is not None:
            parts.append(layout.quote(node.name.value))
        parts.append(", ".join(k.value for k in node.kinds))
        head = " ".join(parts)
        head_end = _end(node.kinds[-1].span)
        hoisted = [c for c in cs if _pos(c) < head_end]
        opener, slots, dangling = split([c for c in cs if _pos(c) >= head_end],
                                        [c.span for c in node.clauses], head_end[0])
        pieces = [self.clause_piece(c, slot.inner)
                  for c, slot in zip(node.clauses, slots, strict=True)]
        for piece, slot in zip(pieces, slots, strict=True):
            slot.leading = sorted(slot.leading + piece.hoisted, key=_pos)
        out: Lines = [own(c, ind) for c in hoisted]
        interior = opener or dangling or any(s.leading or s.trailing for s in slots)
        if not interior and all(p.flat is not None for p in pieces):
            text = head + "".join(SEP + (p.flat or "") for p in pieces)
            if ind + len(text) <= WIDTH:
                return [*out, Line(ind, text)]
        fill = _Fill(out, Line(ind, head), ind + INDENT)
        for c in opener:
            fill.trail(c)
        for piece, slot in zip(pieces, slots, strict=True):
            fill.add(piece, slot)
        fill.finish()
        out.extend(own(c, ind + INDENT) for c in dangling)
        return out

    def clause_piece(self, clause: ast.Clause, cs: list[ast.Comment]) -> _Piece:
        if isinstance(clause, ast.Resource):
            return self.values_piece(clause.name, clause.span, clause.values, cs)
        if isinstance(clause, ast.ToolClause):
            return self.tool_piece(clause, cs)
        if isinstance(clause, ast.EnvClause):
            return self.env_piece(clause, cs)
        if isinstance(clause, ast.LimitsBlock):
            piece = self.limits_piece(clause, cs)
            piece.own_line = True
            return piece
        if isinstance(clause, ast.Scalar):
            text = f"{clause.name} {layout.value(clause.value)}"
            return _Piece(text, lambda ind: [Line(ind, text)], list(cs))
        cel = clause

        def broken(ind: int) -> Lines:
            return [Line(ind, "when " + layout.cel(cel, ind + len("when ") + 1))]
        flat = None if "\n" in cel.source.strip(layout.CEL_SPACE) else layout.cel(cel, 0)
        return _Piece(flat and "when " + flat, broken, list(cs), own_line=True)

    def values_piece(self, name: str, span: Span, values: Sequence[ast.Value],
                     cs: list[ast.Comment]) -> _Piece:
        """``name [a, b]``, or one value a line with a trailing comma."""
        texts = [layout.value(v) for v in values]
        flat = None if cs else f"{name} [{', '.join(texts)}]"
        entries = [(v.span, _atom(t + ",")) for v, t in zip(values, texts, strict=True)]
        return _Piece(flat, lambda ind: self.bracketed(f"{name} [", "]", span, entries, cs, ind),
                      [])

    def tool_piece(self, clause: ast.ToolClause, cs: list[ast.Comment]) -> _Piece:
        head = f"tool {layout.quote(clause.tool.value)}"
        if clause.args is None:
            return _Piece(head, lambda ind: [Line(ind, head)], list(cs))
        slots = [_slot_text(s) for s in clause.args]
        flat = None if cs else f"{head}{SEP}args [{', '.join(slots)}]"
        entries = [(s.span, self.slot_renderer(t)) for s, t in zip(clause.args, slots,
                                                                   strict=True)]
        return _Piece(flat, lambda ind: self.bracketed(f"{head}{SEP}args [", "]", clause.span,
                                                       entries, cs, ind), [])

    def env_piece(self, clause: ast.EnvClause, cs: list[ast.Comment]) -> _Piece:
        """``env ["LANG", /^LC_/]``, or one name a line with a trailing comma."""
        texts = [_alt_text(a) for a in clause.names]
        flat = None if cs else f"env [{', '.join(texts)}]"
        entries = [(a.span, _atom(t + ",")) for a, t in zip(clause.names, texts, strict=True)]
        return _Piece(flat, lambda ind: self.bracketed("env [", "]", clause.span, entries, cs,
                                                       ind), [])

    def slot_renderer(self, text: str) -> Render:
        def render(cs: list[ast.Comment], ind: int) -> Lines:
            return [*(own(c, ind) for c in cs), Line(ind, text + ",")]
        return render

    def limits_piece(self, node: ast.LimitsBlock, cs: list[ast.Comment]) -> _Piece:
        """``limits { a 1  b 2 }``, or one limit a line."""
        texts = [f"{lim.name.value} {lim.value.text}" for lim in node.items]
        flat = None if cs else (f"limits {{ {SEP.join(texts)} }}" if texts else "limits {}")
        entries = [(lim.span, _atom(t)) for lim, t in zip(node.items, texts, strict=True)]
        return _Piece(flat, lambda ind: self.block("limits", node.span, entries, cs, ind,
                                                   inline_ok=False), [])

    def bracketed(self, head: str, close: str, span: Span, entries: Sequence[tuple[Span, Render]],
                  cs: list[ast.Comment], ind: int) -> Lines:
        opener, body = self.vertical(entries, cs, ind + INDENT, span.line)
        first: Lines = [Line(ind, head)]
        for c in opener:
            attach(first, c)
        return [*first, *body, Line(ind, close)]


class _Fill:
    """The continuation lines of a broken rule, filled clause by clause."""

    def __init__(self, out: Lines, head: Line, cont: int) -> None:
        self.out = out
        self.current = head
        self.is_open = True  # may the next clause join the current line?
        self.cont = cont

    def trail(self, comment: ast.Comment) -> None:
        """A comment after the current line's last clause: it ends that line."""
        tail: Lines = [self.current]
        attach(tail, comment)
        self.out.extend(tail[:-1])
        last = tail[-1]
        assert last is not None  # INVARIANT: attach only appends lines
        self.current = last
        self.is_open = False

    def add(self, piece: _Piece, slot: _Slot) -> None:
        if slot.leading:
            self.out.append(self.current)
            self.out.extend(own(c, self.cont) for c in slot.leading)
            self.current = Line(self.cont, "")  # placeholder: replaced below
            self.is_open = False
        flat = piece.flat
        cur = self.current
        if (self.is_open and flat is not None and not piece.own_line
                and cur.indent + len(cur.code) + len(SEP) + len(flat) <= WIDTH):
            cur.code += SEP + flat
        else:
            if cur.code:
                self.out.append(cur)
            if flat is not None and self.cont + len(flat) <= WIDTH:
                self.current, self.is_open = Line(self.cont, flat), not piece.own_line
            else:
                broken = piece.broken(self.cont)
                self.out.extend(broken[:-1])
                last = broken[-1]
                assert last is not None  # INVARIANT: a broken piece ends with code
                self.current, self.is_open = last, False
        for c in slot.trailing:
            self.trail(c)

    def finish(self) -> None:
        if self.current.code:
            self.out.append(self.current)


def _atom(text: str) -> Render:
    """A one-line construct; comments inside it move to the lines before it."""
    def render(cs: list[ast.Comment], ind: int) -> Lines:
        return [*(own(c, ind) for c in cs), Line(ind, text)]
    return render


def _flat(render: Render, ind: int) -> str | None:
    """The one-line text of a comment-free block entry, if it has one."""
    lines = render([], ind)
    if len(lines) == 1 and lines[0] is not None and "\n" not in lines[0].code:
        return lines[0].code
    return None


def _alt_text(alt: ast.ArgAlt) -> str:
    return layout.quote(alt.literal) if alt.literal is not None else layout.regex(alt.regex or "")


def _slot_text(slot: ast.ArgSlotNode) -> str:
    return " | ".join(_alt_text(a) for a in slot.alternatives) + (" ..." if slot.repeat else "")
