"""The pygls server: publishes check/lint diagnostics as you type; formats, outlines, hovers,
goes to definitions and completes kinds and resource keywords in `.sbpolicy` buffers."""

from __future__ import annotations

from collections.abc import Sequence

from lsprotocol import types
from pygls.exceptions import JsonRpcInvalidParams
from pygls.lsp.server import LanguageServer
from pygls.uris import from_fs_path, to_fs_path

from policy_engine import __version__
from policy_engine.compiler.resources import ACCEPTS
from policy_engine.documents import is_test_file
from policy_engine.errors import Diagnostic, Severity, Span
from policy_engine.fmt.runner import format_source
from policy_engine.lsp import analysis, celhelp, scheduler, testfiles
from policy_engine.lsp.analysis import rows_of
from policy_engine.lsp.transport import (
    TOO_LARGE,
    BoundedProtocol,
    bound_document,
    document_text,
    serve_stdio,
    too_large_message,
)

server = LanguageServer("policy-engine", __version__, protocol_cls=BoundedProtocol)

_SEVERITY = {Severity.ERROR: types.DiagnosticSeverity.Error,
             Severity.WARNING: types.DiagnosticSeverity.Warning,
             Severity.NOTE: types.DiagnosticSeverity.Information}
_SYMBOL = {"policy": types.SymbolKind.Module, "import": types.SymbolKind.File,
           "rule": types.SymbolKind.Function, "profile": types.SymbolKind.Struct,
           "tool": types.SymbolKind.Class}
RESOURCES = tuple(sorted({r for names in ACCEPTS.values() for r in names}))
KEYWORDS = ("policy", "version", "import", "permit", "forbid", "mandatory", "profile", "tool",
            "limits", "defaults", "consent", "when", "args", "env")


def _path(uri: str) -> str:
    return to_fs_path(uri) or uri


def _utf16(row: str, index: int) -> int:
    """A character index in ``row`` as the UTF-16 offset LSP positions count in."""
    return len(row[:max(index, 0)].encode("utf-16-le")) // 2


def _char(row: str, utf16: int) -> int:
    """The inverse of :func:`_utf16`."""
    count = 0
    for i, ch in enumerate(row):
        if count >= utf16:
            return i
        count += 2 if ord(ch) > 0xFFFF else 1
    return len(row)


def _range(span: Span, rows: list[str]) -> types.Range:
    """The LSP range of an engine span (1-based, end optional: then the token at the start)."""
    line = max(span.line - 1, 0)
    row = rows[line] if line < len(rows) else ""
    start = max(span.column - 1, 0)
    if span.end_line is not None and span.end_column is not None:
        end_line = max(span.end_line - 1, 0)
        end_row = rows[end_line] if end_line < len(rows) else ""
        end = max(span.end_column - 1, 0)
    else:
        end_line, end_row, end = line, row, start
        while end < len(row) and not row[end].isspace():
            end += 1
        end = max(end, start + 1)
    return types.Range(types.Position(line, _utf16(row, start)),
                       types.Position(end_line, _utf16(end_row, end)))


def _to_lsp(diag: Diagnostic, rows: list[str]) -> types.Diagnostic:
    message = diag.message + (f"\nhelp: {diag.help}" if diag.help else "")
    span = diag.span or Span("", 1, 1)
    return types.Diagnostic(range=_range(span, rows), message=message, code=diag.id,
                            severity=_SEVERITY.get(diag.severity), source="policy-engine")


def _publish(ls: LanguageServer, uri: str) -> None:
    doc = ls.workspace.get_text_document(uri)
    text = document_text(ls, uri)
    rows = rows_of(text)
    found = [_to_lsp(d, rows) for d in analysis.diagnostics(text, _path(uri))]
    ls.text_document_publish_diagnostics(
        types.PublishDiagnosticsParams(uri=uri, diagnostics=found, version=doc.version))


def _read(uri: str) -> tuple[str, int | None, str] | None:
    """The open buffer's text, version and path (None once closed), for the scheduler."""
    doc = server.workspace.text_documents.get(uri)
    if doc is None or uri in TOO_LARGE:
        return None
    return doc.source, doc.version, _path(uri)


_converted: dict[tuple[Diagnostic, str, str], types.Diagnostic] = {}


def _row(rows: list[str], line: int | None) -> str:
    return rows[line - 1] if line is not None and 0 < line <= len(rows) else ""


def _send(uri: str, text: str, version: int | None, found: Sequence[Diagnostic]) -> None:
    """Publish ``found``; a diagnostic already converted for the same row is reused (a large
    buffer republishes hundreds of unchanged findings on every keystroke)."""
    rows = rows_of(text)
    out = []
    for d in found:
        span = d.span
        # the range depends on the rows it spans (UTF-16 columns, the token's end)
        key = (d, _row(rows, span.line if span else None), _row(rows, span.end_line if span
                                                               else None))
        lsp = _converted.get(key)
        if lsp is None:
            if len(_converted) > 50_000:
                _converted.clear()
            lsp = _converted[key] = _to_lsp(d, rows)
        out.append(lsp)
    server.text_document_publish_diagnostics(types.PublishDiagnosticsParams(
        uri=uri, diagnostics=out, version=version))


# debounced; large buffers analysed incrementally while typing, in full when idle
_scheduler = scheduler.default()


def _refuse_too_large(ls: LanguageServer, uri: str, version: int | None) -> None:
    """The one diagnostic of a document dropped for its size (and no analysis of it)."""
    _scheduler.closed(uri)
    ls.text_document_publish_diagnostics(types.PublishDiagnosticsParams(
        uri=uri, version=version, diagnostics=[types.Diagnostic(
            range=types.Range(types.Position(0, 0), types.Position(0, 0)),
            message=too_large_message(uri), severity=types.DiagnosticSeverity.Error,
            code="SBP106", source="policy-engine")]))


@server.feature(types.TEXT_DOCUMENT_DID_OPEN)
def did_open(ls: LanguageServer, params: types.DidOpenTextDocumentParams) -> None:
    uri = params.text_document.uri
    if bound_document(ls, uri, whole=True):
        _refuse_too_large(ls, uri, params.text_document.version)
        return
    _scheduler.changed(uri, _read, _send, wait=False)


@server.feature(types.TEXT_DOCUMENT_DID_CHANGE)
def did_change(ls: LanguageServer, params: types.DidChangeTextDocumentParams) -> None:
    uri = params.text_document.uri
    whole = any(isinstance(c, types.TextDocumentContentChangeWholeDocument)
                for c in params.content_changes)
    if bound_document(ls, uri, whole=whole):
        _refuse_too_large(ls, uri, params.text_document.version)
        return
    _scheduler.changed(uri, _read, _send)


@server.feature(types.TEXT_DOCUMENT_DID_SAVE)
def did_save(ls: LanguageServer, params: types.DidSaveTextDocumentParams) -> None:
    # an imported file may have changed on disk: a full analysis, without waiting
    _scheduler.changed(params.text_document.uri, _read, _send, wait=False)


@server.feature(types.TEXT_DOCUMENT_DID_CLOSE)
def did_close(ls: LanguageServer, params: types.DidCloseTextDocumentParams) -> None:
    TOO_LARGE.discard(params.text_document.uri)
    _scheduler.closed(params.text_document.uri)


@server.feature(types.TEXT_DOCUMENT_FORMATTING)
def formatting(ls: LanguageServer,
               params: types.DocumentFormattingParams) -> list[types.TextEdit] | None:
    """The whole buffer replaced by `fmt`'s output; nothing when it does not parse (the
    diagnostics say why) or is already formatted."""
    uri = params.text_document.uri
    text = document_text(ls, uri)
    path = _path(uri)
    result = format_source(text, path, real_path=path)
    if result.formatted is None or not result.changed:
        return None
    rows = rows_of(text)
    end = types.Position(len(rows) - 1, _utf16(rows[-1], len(rows[-1])))
    return [types.TextEdit(types.Range(types.Position(0, 0), end), result.formatted)]


def _symbol(sym: analysis.Symbol, rows: list[str]) -> types.DocumentSymbol:
    rng = _range(sym.span, rows)
    return types.DocumentSymbol(name=sym.name, detail=sym.detail, kind=_SYMBOL[sym.kind],
                                range=rng, selection_range=rng,
                                children=[_symbol(c, rows) for c in sym.children])


@server.feature(types.TEXT_DOCUMENT_DOCUMENT_SYMBOL)
def document_symbol(ls: LanguageServer,
                    params: types.DocumentSymbolParams) -> list[types.DocumentSymbol]:
    uri = params.text_document.uri
    text = document_text(ls, uri)
    rows = rows_of(text)
    return [_symbol(s, rows) for s in analysis.symbols(analysis.parsed(text, _path(uri)))]


def _at(ls: LanguageServer, uri: str, pos: types.Position) -> tuple[str, int, int]:
    text = document_text(ls, uri)
    rows = rows_of(text)
    row = rows[pos.line] if pos.line < len(rows) else ""
    return text, pos.line + 1, _char(row, pos.character) + 1


@server.feature(types.TEXT_DOCUMENT_HOVER)
def hover(ls: LanguageServer, params: types.HoverParams) -> types.Hover | None:
    uri = params.text_document.uri
    text, line, column = _at(ls, uri, params.position)
    rows = rows_of(text)
    row = rows[line - 1] if line <= len(rows) else ""
    cel = celhelp.hover(row, column - 1)
    if cel is not None:
        return types.Hover(contents=types.MarkupContent(types.MarkupKind.Markdown, cel))
    found = analysis.hover(analysis.parsed(text, _path(uri)), line, column)
    if found is None:
        return None
    body, span = found
    return types.Hover(contents=types.MarkupContent(types.MarkupKind.Markdown, body),
                       range=_range(span, rows_of(text)))


@server.feature(types.TEXT_DOCUMENT_DEFINITION)
def definition(ls: LanguageServer, params: types.DefinitionParams) -> types.Location | None:
    uri = params.text_document.uri
    path = _path(uri)
    text, line, column = _at(ls, uri, params.position)
    if is_test_file(path):
        span = testfiles.definition(text, path, line)
    else:
        span = analysis.definition(analysis.parsed(text, path), path, line, column)
    if span is None:
        return None
    target = from_fs_path(span.file) or span.file
    if target == uri:
        rows = rows_of(text)
    else:
        try:
            rows = rows_of(document_text(ls, target))
        except JsonRpcInvalidParams:  # an import outside the workspace: the span's own row
            rows = []
    return types.Location(uri=target, range=_range(span, rows))


@server.feature(types.TEXT_DOCUMENT_COMPLETION,
                types.CompletionOptions(trigger_characters=["."]))
def completion(ls: LanguageServer, params: types.CompletionParams) -> types.CompletionList:
    """In a CEL condition: the fields after `request.`, `grant.`... or the context variables;
    elsewhere capability kinds, resource keywords and the language's keywords."""
    text, line, column = _at(ls, params.text_document.uri, params.position)
    rows = rows_of(text)
    row = rows[line - 1] if line <= len(rows) else ""
    if celhelp.in_condition(row, column - 1):
        fields = celhelp.fields_before(row, column - 1)
        if fields is not None:
            return types.CompletionList(is_incomplete=False, items=[
                types.CompletionItem(label=f, kind=types.CompletionItemKind.Field,
                                     detail="CEL field") for f in fields[0]])
        return types.CompletionList(is_incomplete=False, items=[
            types.CompletionItem(label=v, kind=types.CompletionItemKind.Variable,
                                 detail="CEL context variable") for v in celhelp.variables()])
    items = [types.CompletionItem(label=k, kind=types.CompletionItemKind.EnumMember,
                                  detail="capability kind") for k in analysis.KINDS]
    items += [types.CompletionItem(label=r, kind=types.CompletionItemKind.Property,
                                   detail="resource") for r in RESOURCES]
    items += [types.CompletionItem(label=k, kind=types.CompletionItemKind.Keyword)
              for k in KEYWORDS]
    return types.CompletionList(is_incomplete=False, items=items)


def run() -> None:
    """Serve over standard input/output until the client exits (bounded reads)."""
    serve_stdio(server)
