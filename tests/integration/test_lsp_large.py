"""The language server on a large buffer (1,000 rules), with a real LSP client over stdio: each
edit gets diagnostics for its own version (syntax errors of the edited statement at once, the
rest carried over), and once the typing stops the full analysis — checks and lint of the whole
policy — is published for the last version. No timing is asserted (benchmarks/bench_lsp.py)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
import pytest_lsp
from lsprotocol import types
from pytest_lsp import ClientServerConfig, LanguageClient

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from scale_policy import scale_policy  # noqa: E402

pytestmark = pytest.mark.integration

PUBLISH = types.TEXT_DOCUMENT_PUBLISH_DIAGNOSTICS


@pytest_lsp.fixture(config=ClientServerConfig(
    server_command=[sys.executable, "-m", "policy_engine.cli", "lsp"]))
async def client(lsp_client: LanguageClient):  # type: ignore[no-untyped-def]
    await lsp_client.initialize_session(types.InitializeParams(
        capabilities=types.ClientCapabilities()))
    yield
    await lsp_client.shutdown_session()


async def _published(client: LanguageClient, uri: str, version: int,
                     want: Any = None) -> list[types.Diagnostic]:
    """The next publish for ``uri`` at ``version`` (for which ``want`` holds, when given)."""
    while True:
        params = await client.wait_for_notification(PUBLISH)
        if params.uri == uri and params.version == version and (want is None
                                                                or want(params.diagnostics)):
            return list(params.diagnostics)


def _change(client: LanguageClient, uri: str, version: int, line: int, old: str,
            new: str) -> None:
    client.text_document_did_change(types.DidChangeTextDocumentParams(
        text_document=types.VersionedTextDocumentIdentifier(uri=uri, version=version),
        content_changes=[types.TextDocumentContentChangePartial(
            range=types.Range(types.Position(line, 0), types.Position(line, len(old))),
            text=new)]))


@pytest.mark.asyncio
async def test_a_large_buffer_gets_each_versions_diagnostics_then_the_full_analysis(
        client: LanguageClient, tmp_path: Path) -> None:
    text = scale_policy(1000).sbpolicy
    rows = text.split("\n")
    path = tmp_path / "scale.sbpolicy"
    path.write_text(text)
    uri = path.as_uri()
    client.text_document_did_open(types.DidOpenTextDocumentParams(types.TextDocumentItem(
        uri=uri, language_id="sbpolicy", version=1, text=text)))
    # the full analysis of the opened buffer: the generated policy's lint findings
    opened = await _published(client, uri, 1, lambda ds: any(d.code == "SBP312" for d in ds))
    lint_count = len(opened)

    # a syntax error in rule 500: reported for that very version at its statement
    line = 502
    row = rows[line]
    broken = row.replace("]", "", 1)
    assert broken != row
    _change(client, uri, 2, line, row, broken)
    found = await _published(client, uri, 2)
    syntax = [d for d in found if str(d.code).startswith("SBP1")]
    assert syntax, found
    assert syntax[0].range.start.line in (line, line + 1)
    assert syntax[0].severity == types.DiagnosticSeverity.Error

    # fixed, with an unknown capability kind instead: a check of the whole policy finds it
    # once the typing stops (the same version, published again)
    typo = row.replace(" fs.", " fs.xx", 1) if " fs." in row else row.replace(" net.", " ne.")
    assert typo != row
    _change(client, uri, 3, line, broken, typo)
    full = await _published(client, uri, 3, lambda ds: any(d.code == "SBP214" for d in ds))
    errors = [d for d in full if d.code == "SBP214"]
    assert [d.range.start.line for d in errors] == [line]

    # and back to the original text: the full analysis equals the one at open
    _change(client, uri, 4, line, typo, row)
    back = await _published(client, uri, 4, lambda ds: not any(d.code == "SBP214" for d in ds)
                            and len(ds) == lint_count)
    assert sorted((d.code, d.range.start.line) for d in back) == sorted(
        (d.code, d.range.start.line) for d in opened)
