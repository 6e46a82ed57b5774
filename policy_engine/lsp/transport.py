"""The LSP server's stdio transport and document access, bounded: frames, header lines and
unopened documents have size limits, and error replies carry no Python traceback.

pygls reads a frame of whatever ``Content-Length`` announces (one above 2^63 raised
OverflowError and ended the server), reads a header line of any length, serves a request on a
URI nobody opened by reading that path whole (``file:///dev/zero`` grew to gigabytes), and puts
``traceback.format_tb`` into every internal-error reply (server paths shown to the client).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, BinaryIO
from urllib.parse import unquote

from lsprotocol import types
from pygls.exceptions import JsonRpcException, JsonRpcInvalidParams
from pygls.io_ import StdoutWriter
from pygls.lsp.server import LanguageServer
from pygls.protocol import LanguageServerProtocol
from pygls.uris import to_fs_path

from policy_engine.dsl.source import MAX_POLICY_BYTES, read_source

log = logging.getLogger(__name__)

MAX_FRAME_BYTES = 16 * 1024 * 1024
"""A message body's bound: a whole `.sbpolicy` (at most 1 MiB) JSON-escaped, with room."""
MAX_DOCUMENT_BYTES = MAX_FRAME_BYTES
"""An open document's bound after edits (attack round 32, L1: incremental inserts, each under
the frame bound, grew one buffer to 1.95 GiB); one past it is dropped and marked too large."""
TOO_LARGE: set[str] = set()
"""The URIs of documents over :data:`MAX_DOCUMENT_BYTES`: kept empty, never analysed, until
the client sends their whole text again (a full change or didOpen) or closes them."""
MAX_HEADER_BYTES = 8192
"""A header line's bound (``Content-Length: N`` and ``Content-Type`` need a few dozen)."""
_DISCARD_CHUNK = 64 * 1024
_CONTENT_LENGTH = re.compile(rb"Content-Length: *(\d{1,40})\r?\n", re.IGNORECASE)


class BoundedProtocol(LanguageServerProtocol):
    """pygls' protocol, minus the traceback in error replies (it showed server file paths and
    code to any client); the server's log keeps it."""

    def _send_response(self, msg_id: Any, result: Any | None = None,
                       error: types.ResponseError | None = None) -> None:
        if error is not None and error.data is not None:
            error = types.ResponseError(code=error.code, message=error.message)
        super()._send_response(msg_id, result=result, error=error)


class _NoRefusalTracebacks(logging.Filter):
    """pygls logs every error reply with ``logger.exception``; for a refusal the server raised
    on purpose (a ``JsonRpcException``: an unopened document, bad params) the traceback is
    noise in the log, so the record keeps its one line and drops it."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if isinstance(exc, JsonRpcException):
            record.msg = f"{record.getMessage()}: {exc}"
            record.args = None
            record.exc_info = None
            record.exc_text = None
        return True


class _Reader:
    """Blocking stdin reads run on a thread, each bounded."""

    def __init__(self, stdin: BinaryIO, pool: ThreadPoolExecutor) -> None:
        self.stdin = stdin
        self.pool = pool

    async def readline(self) -> bytes:
        loop = asyncio.get_running_loop()
        data: bytes = await loop.run_in_executor(self.pool, self.stdin.readline,
                                                 MAX_HEADER_BYTES)
        return data

    async def read(self, n: int) -> bytes:
        loop = asyncio.get_running_loop()
        data: bytes = await loop.run_in_executor(self.pool, self.stdin.read, n)
        return data


async def _discard(reader: _Reader, n: int) -> bool:
    """Read and drop ``n`` bytes in small chunks; False at end of input."""
    while n > 0:
        chunk = await reader.read(min(n, _DISCARD_CHUNK))
        if not chunk:
            return False
        n -= len(chunk)
    return True


async def _serve(stop: threading.Event, reader: _Reader, server: LanguageServer) -> None:
    """pygls' message loop (``pygls.io_.run_async``) with every read bounded."""
    length: int | None = None
    while not stop.is_set():
        header = await reader.readline()
        if not header:
            break
        if len(header) >= MAX_HEADER_BYTES and not header.endswith(b"\n"):
            log.error("a header line longer than %d bytes: skipped", MAX_HEADER_BYTES)
            while header and not header.endswith(b"\n"):
                header = await reader.readline()
            continue
        match = _CONTENT_LENGTH.fullmatch(header)
        if match and length is None:
            length = int(match.group(1))
        if length is None or header.strip():
            continue
        size, length = length, None
        if size > MAX_FRAME_BYTES:
            # the frame is dropped whole so the next one still starts where the client put it
            log.error("a message of %d bytes is over the %d-byte bound: skipped", size,
                      MAX_FRAME_BYTES)
            print(f"policy-engine lsp: a message announced Content-Length {size}, over the "
                  f"{MAX_FRAME_BYTES}-byte bound; it is read and dropped", file=sys.stderr)
            if not await _discard(reader, size):
                break
            continue
        body = await reader.read(size)
        if len(body) < size:
            break
        try:
            message = json.loads(body, object_hook=server.protocol.structure_message)
            server.protocol.handle_message(message)
        except Exception as exc:  # pygls' own handling: a logged error, the server goes on
            log.exception("Unable to handle message")
            server.report_server_error(exc, JsonRpcException)


def serve_stdio(server: LanguageServer, stdin: BinaryIO | None = None,
                stdout: BinaryIO | None = None) -> None:
    """``server.start_io()`` with the bounded loop."""
    logging.getLogger("pygls.protocol.json_rpc").addFilter(_NoRefusalTracebacks())
    stop = threading.Event()
    server._stop_event = stop
    server.protocol.set_writer(StdoutWriter(stdout or sys.stdout.buffer))
    pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="pe-lsp-stdin")
    try:
        asyncio.run(_serve(stop, _Reader(stdin or sys.stdin.buffer, pool), server))
    except BrokenPipeError:
        log.error("Connection to the client is lost! Shutting down the server.")
    except (KeyboardInterrupt, SystemExit):
        pass
    finally:
        pool.shutdown(wait=False, cancel_futures=True)
        server.shutdown()  # type: ignore[no-untyped-call]


def _roots(ls: LanguageServer) -> list[Path]:
    """The workspace the client gave (root and folders), as real directories."""
    uris = [f.uri for f in ls.workspace.folders.values()]
    if ls.workspace.root_uri:
        uris.append(ls.workspace.root_uri)
    return [Path(os.path.realpath(p)) for p in (to_fs_path(u) for u in uris) if p]


def too_large_message(uri: str) -> str:
    return (f"`{unquote(uri)}` grew past {MAX_DOCUMENT_BYTES:,} bytes through edits: the server "
            "dropped its text and analyses nothing more of it; send the whole text again (or "
            "close and reopen it) once it is smaller")


def _over(text: str) -> bool:
    # a character is at most 4 UTF-8 bytes: only a long text is encoded to be measured
    return len(text) > MAX_DOCUMENT_BYTES or (
        len(text) * 4 > MAX_DOCUMENT_BYTES
        and len(text.encode("utf-8", "surrogatepass")) > MAX_DOCUMENT_BYTES)


def bound_document(ls: LanguageServer, uri: str, whole: bool) -> bool:
    """After a change (``whole``: it carried the whole text): True when the document is over
    :data:`MAX_DOCUMENT_BYTES` (now or still); its text is then dropped (the buffer emptied)."""
    doc = ls.workspace.text_documents.get(uri)
    if doc is None:
        TOO_LARGE.discard(uri)
        return False
    if whole:
        TOO_LARGE.discard(uri)
    if uri not in TOO_LARGE and not _over(doc.source):
        return False
    TOO_LARGE.add(uri)
    ls.workspace.put_text_document(types.TextDocumentItem(
        uri=doc.uri, language_id=doc.language_id or "sbpolicy", version=doc.version or 0,
        text=""))
    return True


def document_text(ls: LanguageServer, uri: str) -> str:
    """The text of ``uri``: the client's buffer when it opened it, else a regular file under
    the workspace it gave, read with the CLI's input rules (1 MiB, regular files only).

    :raises JsonRpcInvalidParams: neither (the reply says so; nothing is read).
    """
    if uri in TOO_LARGE or unquote(uri) in TOO_LARGE:
        raise JsonRpcInvalidParams(too_large_message(uri))
    opened = ls.workspace.text_documents.get(unquote(uri))
    if opened is not None:
        source: str = opened.source
        return source
    path = to_fs_path(uri)
    real = Path(os.path.realpath(path)) if path else None
    if real is None or not any(real == r or r in real.parents for r in _roots(ls)):
        raise JsonRpcInvalidParams(
            f"`{uri}` is not open and not under the workspace: the server reads only "
            "documents the client opened (didOpen) or files under its root")
    text = read_source(real, str(path), max_bytes=MAX_POLICY_BYTES)
    if not isinstance(text, str):
        raise JsonRpcInvalidParams(f"`{uri}` cannot be read: {text.message}")
    return text
