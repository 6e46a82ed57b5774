"""What the language server says about one buffer: diagnostics, symbols, hover, definitions."""

from __future__ import annotations

import os
from dataclasses import dataclass

from policy_engine.documents import is_document
from policy_engine.dsl import ast
from policy_engine.dsl.fastparse import parse
from policy_engine.dsl.parser import policy_too_large
from policy_engine.errors import Diagnostic, Severity, Span
from policy_engine.lint.engine import lint_paths, lint_text
from policy_engine.model.enums import CapabilityKind

KINDS = tuple(k.value for k in CapabilityKind)


@dataclass(frozen=True, slots=True)
class Symbol:
    """One outline entry: what it is (``policy``, ``import``, ``rule``, ``profile``, ``tool``)."""

    kind: str
    name: str
    detail: str
    span: Span
    children: tuple[Symbol, ...] = ()


def diagnostics(text: str, path: str) -> list[Diagnostic]:
    """What `check` and `lint` report for ``text`` saved as ``path`` (suppressed findings left
    out, as `lint` hides them); an error in an imported file is shown on the import line that
    leads to it, since the editor may not have that file open."""
    if is_document(path):
        return _saved_document(text, path)
    too_large = policy_too_large(text, path)
    if too_large is not None:
        return [too_large]
    out: list[Diagnostic] = []
    imports: list[ast.Import] | None = None
    pf, parse_errors = parse(text, path)
    if not parse_errors:
        out.extend(_manifest_count(pf))
    for f in lint_text(text, path):
        diag = f.diagnostic
        if f.suppressed is not None:
            continue
        if diag.span is None or diag.span.file == path:
            out.append(diag)
            continue
        if diag.severity is not Severity.ERROR:
            continue  # the imported file's own warnings belong to its own buffer
        if imports is None:
            imports = parsed(text, path).imports
        if imports:
            out.append(_on_import(diag, diag.span, imports, path))
    return out


def _manifest_count(pf: ast.PolicyFile) -> list[Diagnostic]:
    """SBP105 as `check` says it (``documents.check_policy_file``): a header-less file of tool
    blocks is one manifest, and `load_manifest` refuses more than one block."""
    tools = [i for i in pf.items if isinstance(i, ast.ToolDef)]
    if pf.headers or len(tools) < 2 or len(tools) != len(pf.items):
        return []
    names = ", ".join(f"`{t.name.value}`" for t in tools)
    return [Diagnostic.make("SBP105", f"a tool manifest holds exactly one `tool` block, found "
                            f"{names}", tools[1].span, help="put each tool manifest in its own "
                            "file")]


def _saved_document(text: str, path: str) -> list[Diagnostic]:
    """A JSON/YAML document (manifest, grant, request, settings, config, test) is checked and
    linted as saved: only while the buffer matches the file, so the positions are right."""
    try:
        with open(path, encoding="utf-8") as handle:
            if handle.read() != text:
                return []
    except (OSError, UnicodeDecodeError):
        return []
    result = lint_paths([path], jobs=1)
    return [f.diagnostic for f in result.active()
            if f.span is not None and os.path.realpath(f.span.file) == os.path.realpath(path)]


def _on_import(diag: Diagnostic, span: Span, imports: list[ast.Import], path: str) -> Diagnostic:
    """``diag`` of an imported file moved onto the import naming that file (else the first)."""
    target = os.path.realpath(span.file)
    base = os.path.dirname(path)
    via = next((i for i in imports
                if os.path.realpath(os.path.join(base, i.path.value)) == target), imports[0])
    return Diagnostic.make(diag.id, f"in imported `{span}`: {diag.message}", via.span,
                           help=diag.help, severity=diag.severity)


def rows_of(text: str) -> list[str]:
    """The lines of ``text`` as LSP and the engine count them (``\n``, ``\r\n``; not the other
    separators ``str.splitlines`` knows)."""
    return [row[:-1] if row.endswith("\r") else row for row in text.split("\n")]


def parsed(text: str, path: str) -> ast.PolicyFile:
    """The parse of ``text`` (partial when it has a syntax error)."""
    return parse(text, path)[0]


def _name(node: ast.Rule) -> str:
    return node.name.value if node.name is not None else "(unnamed)"


def _rule_symbol(rule: ast.Rule) -> Symbol:
    kinds = ", ".join(k.value for k in rule.kinds)
    effect = ("mandatory " if rule.mandatory else "") + rule.effect
    return Symbol("rule", _name(rule), f"{effect} {kinds}", rule.span)


def symbols(pf: ast.PolicyFile) -> list[Symbol]:
    """The outline: policy header, imports, rules, profiles and tool blocks (their permits)."""
    out: list[Symbol] = []
    for item in pf.items:
        if isinstance(item, ast.Header):
            out.append(Symbol("policy", item.name.value, f"version {item.version.value}",
                              item.span))
        elif isinstance(item, ast.Import):
            out.append(Symbol("import", item.path.value, "import", item.span))
        elif isinstance(item, ast.Rule):
            out.append(_rule_symbol(item))
        elif isinstance(item, ast.ProfileDef):
            out.append(Symbol("profile", item.name.value, "profile", item.span))
        elif isinstance(item, ast.ToolDef):
            out.append(Symbol("tool", item.name.value, f"tool version {item.version.value}",
                              item.span, tuple(_rule_symbol(r) for r in item.permits)))
    return out


def contains(span: Span, line: int, column: int) -> bool:
    """Whether the 1-based ``line``/``column`` falls inside ``span`` (a span without an end
    covers the rest of its line)."""
    end_line = span.end_line if span.end_line is not None else span.line
    if not span.line <= line <= end_line:
        return False
    if line == span.line and column < span.column:
        return False
    return not (line == end_line and span.end_column is not None and column > span.end_column)


def _value(v: ast.Value) -> str:
    if isinstance(v, ast.Str):
        return f'"{v.value}"'
    return v.value if isinstance(v, ast.Word) else v.text


def _limits(blocks: tuple[ast.LimitsBlock, ...]) -> list[str]:
    return [f"- limit `{lim.name.value}` {_value(lim.value)}"
            for block in blocks for lim in block.items]


def _clause(clause: ast.Clause) -> list[str]:
    if isinstance(clause, ast.Resource):
        return [f"- {clause.name} [{', '.join(_value(v) for v in clause.values)}]"]
    if isinstance(clause, ast.ToolClause):
        return [f'- tool "{clause.tool.value}"' + ("" if clause.args is None else " args [...]")]
    if isinstance(clause, ast.LimitsBlock):
        return _limits((clause,))
    if isinstance(clause, ast.Cel):
        return [f"- when `{clause.source.strip()}`"]
    if isinstance(clause, ast.Scalar):
        return [f"- {clause.name} {_value(clause.value)}"]
    return []


def _rule_hover(rule: ast.Rule) -> str:
    effect = ("mandatory " if rule.mandatory else "") + rule.effect
    kinds = ", ".join(f"`{k.value}`" for k in rule.kinds) or "(none)"
    lines = [f"**{effect}** rule `{_name(rule)}`", "", f"kinds: {kinds}", ""]
    for clause in rule.clauses:
        lines += _clause(clause)
    return "\n".join(lines).rstrip()


def _items(pf: ast.PolicyFile) -> list[ast.Item]:
    out: list[ast.Item] = []
    for item in pf.items:
        out.append(item)
        if isinstance(item, ast.ToolDef):
            out.extend(item.permits)
    return out


def hover(pf: ast.PolicyFile, line: int, column: int) -> tuple[str, Span] | None:
    """Markdown for the innermost rule, profile or tool block at 1-based ``line``/``column``."""
    found: tuple[str, Span] | None = None
    for item in _items(pf):
        if not contains(item.span, line, column):
            continue
        if isinstance(item, ast.Rule):
            found = (_rule_hover(item), item.span)
        elif isinstance(item, ast.ProfileDef):
            body = [f"**profile** `{item.name.value}`", ""]
            body += [f"- {s.key} {_value(s.value) if isinstance(s, ast.Setting) else '[...]'}"
                     for s in item.settings] + _limits(item.limits)
            found = ("\n".join(body).rstrip(), item.span)
        elif isinstance(item, ast.ToolDef):
            body = [f"**tool** `{item.name.value}` version {item.version.value}",
                    "", f"{len(item.permits)} permit(s)"] + _limits(item.limits)
            found = ("\n".join(body).rstrip(), item.span)
    return found


def definition(pf: ast.PolicyFile, path: str, line: int, column: int) -> Span | None:
    """Where the import path, rule id or profile name at ``line``/``column`` is defined: an
    import's target file, or the rule/profile of that name in this file or its imports."""
    for imp in pf.imports:
        if contains(imp.span, line, column):
            target = os.path.join(os.path.dirname(path), imp.path.value)
            return Span(target, 1, 1) if os.path.isfile(target) else None
    word = _quoted_at(pf.source, line, column)
    if word is None:
        return None
    for file in [pf, *_imported(pf, path)]:
        for item in _items(file):
            named = getattr(item, "name", None)
            if isinstance(named, ast.Str) and named.value == word \
                    and isinstance(item, ast.Rule | ast.ProfileDef | ast.ToolDef):
                return item.span
    return None


def _imported(pf: ast.PolicyFile, path: str) -> list[ast.PolicyFile]:
    from policy_engine.dsl.fastparse import parse_file

    out = []
    for imp in pf.imports:
        target = os.path.join(os.path.dirname(path), imp.path.value)
        other, _ = parse_file(target)
        if other is not None:
            out.append(other)
    return out


def _quoted_at(source: str, line: int, column: int) -> str | None:
    """The string literal around 1-based ``line``/``column``, if the cursor is inside one."""
    rows = rows_of(source)
    if not 1 <= line <= len(rows):
        return None
    row, index = rows[line - 1], column - 1
    quotes = [i for i, ch in enumerate(row) if ch == '"']
    for start, end in zip(quotes[::2], quotes[1::2], strict=False):
        if start <= index <= end:
            return row[start + 1:end]
    return None
