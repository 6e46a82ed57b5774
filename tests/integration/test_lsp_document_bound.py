"""Attack round 32, L1: an open document grown by incremental `didChange` edits (each message
under the 16 MiB frame bound) is capped at 16 MiB: the edit that passes it is not kept, the
document is marked too large (a diagnostic says so; requests on it are refused; nothing is
analysed) and the server's memory stays bounded (twelve 15 MiB inserts reached 1.95 GiB).
A real LSP client over stdio (pytest-lsp)."""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

import pytest
import pytest_lsp
from lsprotocol import types
from pygls.exceptions import JsonRpcException
from pytest_lsp import ClientServerConfig, LanguageClient

pytestmark = pytest.mark.integration

PUBLISH = types.TEXT_DOCUMENT_PUBLISH_DIAGNOSTICS
MIB = 1 << 20


@pytest_lsp.fixture(config=ClientServerConfig(
    server_command=[sys.executable, "-m", "policy_engine.cli", "lsp"]))
async def client(lsp_client: LanguageClient):  # type: ignore[no-untyped-def]
    await lsp_client.initialize_session(types.InitializeParams(
        capabilities=types.ClientCapabilities()))
    yield
    await lsp_client.shutdown_session()


def _server_pid() -> int:
    """This test process's child running the language server."""
    me = os.getpid()
    for task in os.listdir(f"/proc/{me}/task"):
        for pid in Path(f"/proc/{me}/task/{task}/children").read_text().split():
            if b"lsp" in Path(f"/proc/{pid}/cmdline").read_bytes():
                return int(pid)
    raise AssertionError("no language server child")


def _hwm_mib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) // 1024
    raise AssertionError("no VmHWM")


def _insert(client: LanguageClient, uri: str, version: int, line: int, text: str) -> None:
    client.text_document_did_change(types.DidChangeTextDocumentParams(
        text_document=types.VersionedTextDocumentIdentifier(uri=uri, version=version),
        content_changes=[types.TextDocumentContentChangePartial(
            range=types.Range(types.Position(line, 0), types.Position(line, 0)), text=text)]))


async def _too_large(client: LanguageClient, uri: str) -> list[types.Diagnostic]:
    while True:
        params = await client.wait_for_notification(PUBLISH)
        found = [d for d in params.diagnostics if "16,777,216" in d.message]
        if params.uri == uri and found:
            return found


@pytest.mark.asyncio
async def test_a_document_grown_past_16_mib_is_dropped_and_marked(
        client: LanguageClient, tmp_path: Path) -> None:
    uri = (tmp_path / "grow.sbpolicy").as_uri()
    client.text_document_did_open(types.DidOpenTextDocumentParams(types.TextDocumentItem(
        uri=uri, language_id="sbpolicy", version=1, text="# x\n")))
    await client.wait_for_notification(PUBLISH)
    pid = _server_pid()
    before = _hwm_mib(pid)
    chunk = "# " + "A" * (7 * MIB) + "\n"
    for i in range(12):  # 84 MiB in all, each message 7 MiB
        _insert(client, uri, i + 2, i + 1, chunk)
    found = await asyncio.wait_for(_too_large(client, uri), 120)
    assert found[0].severity == types.DiagnosticSeverity.Error
    assert found[0].code == "SBP106"
    # requests on it are refused with the reason, not answered from a partial buffer
    with pytest.raises(JsonRpcException, match="16,777,216"):
        await client.text_document_hover_async(types.HoverParams(
            text_document=types.TextDocumentIdentifier(uri=uri),
            position=types.Position(0, 0)))
    grown = _hwm_mib(pid) - before
    assert grown < 160, f"peak RSS grew {grown} MiB for 84 MiB of inserts"
    # the whole text sent again (a full change within the bound) makes it a document again
    client.text_document_did_change(types.DidChangeTextDocumentParams(
        text_document=types.VersionedTextDocumentIdentifier(uri=uri, version=20),
        content_changes=[types.TextDocumentContentChangeWholeDocument(
            text='policy "p" version "1.0.0"\n')]))
    hover = await client.text_document_hover_async(types.HoverParams(
        text_document=types.TextDocumentIdentifier(uri=uri), position=types.Position(0, 1)))
    assert hover is None or hover.contents is not None
