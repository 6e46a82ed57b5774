"""`policy-engine lsp` end to end: a real LSP client (pytest-lsp) talks to the server over stdio."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import pytest_lsp
from lsprotocol import types
from pytest_lsp import ClientServerConfig, LanguageClient

from policy_engine.fmt.runner import format_source

pytestmark = pytest.mark.integration

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "policies"
BROKEN_KIND = 'permit "github-api" net.htp'


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("lsp")
    for name in ("org.sbpolicy", "secrets.sbpolicy", "network.sbpolicy"):
        shutil.copy(EXAMPLES / name, root / name)
    return root


@pytest_lsp.fixture(scope="module", config=ClientServerConfig(
    server_command=[sys.executable, "-m", "policy_engine.cli", "lsp"]))
async def client(lsp_client: LanguageClient):  # type: ignore[no-untyped-def]
    await lsp_client.initialize_session(types.InitializeParams(
        capabilities=types.ClientCapabilities()))
    yield
    await lsp_client.shutdown_session()


def _open(client: LanguageClient, path: Path, text: str, version: int = 1) -> str:
    uri = path.as_uri()
    client.text_document_did_open(types.DidOpenTextDocumentParams(
        types.TextDocumentItem(uri=uri, language_id="sbpolicy", version=version, text=text)))
    return uri


async def _diagnostics(client: LanguageClient, uri: str) -> list[types.Diagnostic]:
    client.diagnostics.pop(uri, None)
    while uri not in client.diagnostics:
        await client.wait_for_notification(types.TEXT_DOCUMENT_PUBLISH_DIAGNOSTICS)
    return list(client.diagnostics[uri])


@pytest.mark.asyncio(loop_scope="module")
async def test_error_as_you_type_then_fixed(client: LanguageClient, workdir: Path) -> None:
    path = workdir / "network.sbpolicy"
    good = path.read_text()
    bad = good.replace('permit "github-api" net.http', BROKEN_KIND)
    client.diagnostics.pop(path.as_uri(), None)
    uri = _open(client, path, bad)
    found = await _diagnostics(client, uri)
    errors = [d for d in found if d.severity == types.DiagnosticSeverity.Error]
    assert [d.code for d in errors] == ["SBP214"]
    line = bad.splitlines().index(next(r for r in bad.splitlines() if BROKEN_KIND in r))
    start = bad.splitlines()[line].index("net.htp")
    assert errors[0].range == types.Range(types.Position(line, start),
                                          types.Position(line, start + len("net.htp")))
    assert "unknown capability" in errors[0].message

    client.text_document_did_change(types.DidChangeTextDocumentParams(
        types.VersionedTextDocumentIdentifier(uri=uri, version=2),
        [types.TextDocumentContentChangeWholeDocument(text=good)]))
    found = await _diagnostics(client, uri)
    assert not [d for d in found if d.severity == types.DiagnosticSeverity.Error]
    # the lint's findings come once it compiles (SBP330: no timeout), as `lint` reports them
    assert any(d.code == "SBP330" and d.severity == types.DiagnosticSeverity.Warning
               for d in found)
    client.text_document_did_close(types.DidCloseTextDocumentParams(
        types.TextDocumentIdentifier(uri=uri)))


@pytest.mark.asyncio(loop_scope="module")
async def test_formatting_returns_fmt_output(client: LanguageClient, workdir: Path) -> None:
    path = workdir / "messy.sbpolicy"
    messy = 'policy "acme/messy"   version "1.0.0"\npermit  "r"  fs.read   paths ["/w/**"]\n'
    path.write_text(messy)
    uri = _open(client, path, messy)
    edits = await client.text_document_formatting_async(types.DocumentFormattingParams(
        types.TextDocumentIdentifier(uri=uri), types.FormattingOptions(2, True)))
    expected = format_source(messy, str(path), real_path=str(path)).formatted
    assert expected is not None
    assert expected != messy
    assert edits is not None
    assert len(edits) == 1
    assert edits[0].new_text == expected
    assert edits[0].range.start == types.Position(0, 0)
    assert edits[0].range.end == types.Position(2, 0)  # the whole buffer, trailing newline too


@pytest.mark.asyncio(loop_scope="module")
async def test_symbols_hover_definition(client: LanguageClient, workdir: Path) -> None:
    path = workdir / "org.sbpolicy"
    text = path.read_text()
    uri = _open(client, path, text)
    symbols = await client.text_document_document_symbol_async(types.DocumentSymbolParams(
        types.TextDocumentIdentifier(uri=uri)))
    assert symbols is not None
    names = {(s.name, s.kind) for s in symbols if isinstance(s, types.DocumentSymbol)}
    assert ("acme/agents", types.SymbolKind.Module) in names
    assert ("network.sbpolicy", types.SymbolKind.File) in names
    assert any(kind == types.SymbolKind.Function for _, kind in names)

    rows = text.splitlines()
    rule_line = next(i for i, r in enumerate(rows) if r.startswith("permit "))
    hover = await client.text_document_hover_async(types.HoverParams(
        types.TextDocumentIdentifier(uri=uri), types.Position(rule_line, 2)))
    assert hover is not None
    assert isinstance(hover.contents, types.MarkupContent)
    rule_name = rows[rule_line].split('"')[1]
    assert f"**permit** rule `{rule_name}`" in hover.contents.value
    assert "kinds: `" in hover.contents.value

    import_line = next(i for i, r in enumerate(rows) if r.startswith('import "network'))
    location = await client.text_document_definition_async(types.DefinitionParams(
        types.TextDocumentIdentifier(uri=uri), types.Position(import_line, 10)))
    assert isinstance(location, types.Location)
    assert location.uri == (workdir / "network.sbpolicy").as_uri()
    assert location.range.start == types.Position(0, 0)


@pytest.mark.asyncio(loop_scope="module")
async def test_completion_offers_kinds_and_resources(client: LanguageClient,
                                                     workdir: Path) -> None:
    uri = _open(client, workdir / "new.sbpolicy", 'policy "a/b" version "1"\npermit "x" ')
    result = await client.text_document_completion_async(types.CompletionParams(
        types.TextDocumentIdentifier(uri=uri), types.Position(1, 11)))
    assert isinstance(result, types.CompletionList)
    labels = {item.label for item in result.items}
    assert {"fs.read", "net.http", "proc.exec", "hosts", "paths", "methods"} <= labels


@pytest.mark.asyncio(loop_scope="module")
async def test_ranges_count_utf16_and_imported_errors_land_on_the_import(
        client: LanguageClient, workdir: Path) -> None:
    # a character outside the BMP is two UTF-16 units: the range must count it so
    text = 'policy "a/b" version "1.0.0"\npermit "\U0001f600" net.htp hosts ["a.example"]\n'
    uri = _open(client, workdir / "emoji.sbpolicy", text)
    found = await _diagnostics(client, uri)
    errors = [d for d in found if d.code == "SBP214"]
    assert len(errors) == 1
    start = text.splitlines()[1].index("net.htp") + 1  # +1: the emoji takes two units
    assert errors[0].range.start == types.Position(1, start)
    assert errors[0].range.end == types.Position(1, start + len("net.htp"))

    (workdir / "lib.sbpolicy").write_text(
        'policy "a/lib" version "1.0.0"\npermit "bad" fs.raed paths ["/w/**"]\n')
    main = 'policy "a/main" version "1.0.0"\nimport "lib.sbpolicy"\n'
    uri = _open(client, workdir / "main.sbpolicy", main)
    found = await _diagnostics(client, uri)
    assert [d.code for d in found] == ["SBP214"]
    assert found[0].range.start.line == 1
    assert "lib.sbpolicy:2:" in found[0].message


@pytest.mark.asyncio(loop_scope="module")
async def test_definition_of_a_profile_name(client: LanguageClient, workdir: Path) -> None:
    text = ('policy "a/p" version "1.0.0"\n'
            'profile "ci" {\n  network off\n}\n'
            'tool "t" version "1.0" {\n  permit fs.read paths ["/w/**"]\n  profile "ci"\n}\n')
    uri = _open(client, workdir / "profiles.sbpolicy", text)
    location = await client.text_document_definition_async(types.DefinitionParams(
        types.TextDocumentIdentifier(uri=uri), types.Position(6, 12)))
    assert isinstance(location, types.Location)
    assert location.uri == uri
    assert location.range.start == types.Position(1, 0)


@pytest.mark.asyncio(loop_scope="module")
async def test_cel_hover_and_field_completion(client: LanguageClient, workdir: Path) -> None:
    text = ('policy "a/c" version "1.0.0"\n'
            'permit "r" fs.read paths ["/w/**"]\n'
            '  when `grant.subject_id.startsWith("agent:") && grant.budget.`\n')
    uri = _open(client, workdir / "cel.sbpolicy", text)
    row = text.splitlines()[2]
    hover = await client.text_document_hover_async(types.HoverParams(
        types.TextDocumentIdentifier(uri=uri), types.Position(2, row.index("grant") + 1)))
    assert hover is not None
    assert isinstance(hover.contents, types.MarkupContent)
    assert "`grant`: `map(string, dyn)`" in hover.contents.value
    assert "`subject_id`" in hover.contents.value

    after = row.index("grant.budget.") + len("grant.budget.")
    result = await client.text_document_completion_async(types.CompletionParams(
        types.TextDocumentIdentifier(uri=uri), types.Position(2, after)))
    assert isinstance(result, types.CompletionList)
    labels = {item.label for item in result.items}
    assert "calls" in labels
    assert "fs.read" not in labels  # inside a condition: CEL fields, not capability kinds


def test_without_pygls_the_command_says_what_to_install() -> None:
    # pygls made unimportable in a real CLI process: one clear line and exit 2, no traceback
    code = ("import sys\nsys.modules['pygls'] = None\n"
            "sys.argv = ['policy-engine', 'lsp']\n"
            "from policy_engine.cli.main import main\nmain()")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60, stdin=subprocess.DEVNULL, check=False)
    assert done.returncode == 2
    assert "pip install 'policy-engine[lsp]'" in done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.asyncio(loop_scope="module")
async def test_manifests_and_json_documents(client: LanguageClient, workdir: Path) -> None:
    tool = (EXAMPLES.parent / "manifests" / "file-editor.sbpolicy").read_text()
    two = tool + "\n" + tool.replace('tool "', 'tool "other-', 1)
    uri = _open(client, workdir / "two-tools.sbpolicy", two)
    found = await _diagnostics(client, uri)
    assert [d.code for d in found] == ["SBP105"]  # as `check` says it
    assert found[0].range.start.line == two.splitlines().index(
        next(r for r in two.splitlines() if r.startswith('tool "other-')))

    grant = json.loads((EXAMPLES.parent / "grants" / "editor-agent.json").read_text())
    grant["subjectid"] = "agent:x"
    path = workdir / "grant.json"
    text = json.dumps(grant, indent=2)
    path.write_text(text)
    uri = _open(client, path, text)
    found = await _diagnostics(client, uri)
    assert [d.code for d in found] == ["SBP105"]
    assert "subjectid" in found[0].message
    line = text.splitlines().index(next(r for r in text.splitlines() if '"subjectid"' in r))
    assert found[0].range.start.line == line


@pytest.mark.asyncio(loop_scope="module")
async def test_lines_count_as_lsp_counts_them(client: LanguageClient, workdir: Path) -> None:
    # CRLF endings and a U+2028 inside a comment: str.splitlines would see one line more
    text = ('policy "a/b" version "1.0.0"\r\n# a\u2028b\r\n'
            'permit "r" fs.raed paths ["/w/**"]\r\n')
    uri = _open(client, workdir / "crlf.sbpolicy", text)
    found = await _diagnostics(client, uri)
    assert [d.code for d in found] == ["SBP214"]
    assert found[0].range.start == types.Position(2, len('permit "r" '))


@pytest.mark.asyncio(loop_scope="module")
async def test_definition_from_a_policy_test(client: LanguageClient, workdir: Path) -> None:
    # `want_rule: ID` in a *.sbtest.yaml goes to that rule, found through the policy's imports
    text = (EXAMPLES / "org.sbtest.yaml").read_text()
    path = workdir / "org.sbtest.yaml"
    path.write_text(text)
    uri = _open(client, path, text)
    rows = text.splitlines()
    line = next(i for i, r in enumerate(rows) if r.strip() == "want_rule: github-api")
    location = await client.text_document_definition_async(types.DefinitionParams(
        types.TextDocumentIdentifier(uri=uri), types.Position(line, rows[line].index("github"))))
    assert isinstance(location, types.Location)
    assert location.uri == (workdir / "network.sbpolicy").as_uri()
    network = (workdir / "network.sbpolicy").read_text().splitlines()
    assert network[location.range.start.line].startswith('permit "github-api"')

    line = next(i for i, r in enumerate(rows) if r.startswith("policy:"))
    location = await client.text_document_definition_async(types.DefinitionParams(
        types.TextDocumentIdentifier(uri=uri), types.Position(line, 10)))
    assert isinstance(location, types.Location)
    assert location.uri == (workdir / "org.sbpolicy").as_uri()
