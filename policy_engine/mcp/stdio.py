"""The MCP stdio transport's byte layer: the SDK's ``stdio_server`` fed by a reader that bounds
each JSON-RPC line, answering an over-long one with a JSON-RPC error instead of holding it."""

from __future__ import annotations

import json
import os
import re
import sys
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import Any, BinaryIO, cast

import anyio
import anyio.to_thread
from anyio.abc import ObjectReceiveStream, ObjectSendStream
from mcp.server.stdio import stdio_server
from mcp.shared.message import SessionMessage

from policy_engine.inputs.text import first_not_unicode
from policy_engine.refusal import code_refusal

MAX_LINE_BYTES = 16 * 1024 * 1024
"""One JSON-RPC message's bound, the LSP's (policy_engine/lsp/transport.py): a tool call's
arguments are inputs a skill bounds far lower; a longer line is refused, never buffered."""
_DISCARD_CHUNK = 1024 * 1024
_ID = re.compile(rb'"id"\s*:\s*(-?\d{1,19}|"(?:[^"\\]|\\.){0,128}")')
_INVALID_REQUEST = -32600


def _id_in(prefix: bytes) -> Any:
    """The request id when it comes early in the line (so the client can match the error to
    its call), else ``None`` as JSON-RPC asks for an id that cannot be read."""
    match = _ID.search(prefix)
    if match is None:
        return None
    try:
        return json.loads(match.group(1))
    except ValueError:
        return None


_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")
_INVALID_PARAMS = -32602


def not_text(line: bytes) -> str | None:
    """Where a JSON-RPC line holds a string UTF-8 cannot encode (an escaped lone surrogate,
    ``"\\ud800"``), else ``None``. The SDK's parser rejects such a line without reading its id,
    and the client waited forever for an answer (outsider attack 15, F2)."""
    if _SURROGATE_ESCAPE.search(line) is None:  # the common case costs one scan
        return None
    try:
        message = json.loads(line)
    except ValueError:
        return None  # not JSON: the SDK answers it as it does
    return first_not_unicode(message)


def not_text_error(msg_id: Any, where: str) -> str:
    """The JSON-RPC error answering a message with a string that is not text, as one line."""
    return _rpc_error(msg_id, _INVALID_PARAMS, "SCHEMA.VALIDATION_FAILED", 422,
                      f"the string at `{where or '/'}` is not valid Unicode text (a lone "
                      "surrogate): send UTF-8 text")


def too_long(msg_id: Any) -> str:
    """The JSON-RPC error answering an over-long line, as one line."""
    return _rpc_error(msg_id, _INVALID_REQUEST, "SERVICE.PAYLOAD_TOO_LARGE", 413,
                      f"a JSON-RPC message longer than {MAX_LINE_BYTES} bytes: it is read and "
                      "dropped; send smaller arguments")


def _rpc_error(msg_id: Any, rpc_code: int, code: str, http_status: int, message: str) -> str:
    """A JSON-RPC error carrying the one refusal document (``code``), as one line."""
    refusal = code_refusal(code, http_status, message, "service").to_json()
    return json.dumps({"jsonrpc": "2.0", "id": msg_id, "error": {
        "code": rpc_code, "message": f"{code}: {message}",
        "data": {"code": code, "policy-engine/refusal": refusal}}})


class _Out:
    """stdout for the SDK's writer and for refusals: one whole line per locked write, so a
    refusal never lands inside an answer."""

    def __init__(self, raw: BinaryIO) -> None:
        self.raw = raw
        self.lock = anyio.Lock()

    async def write(self, text: str) -> None:
        data = text.encode("utf-8")
        async with self.lock:
            await anyio.to_thread.run_sync(self._put, data)

    def _put(self, data: bytes) -> None:
        self.raw.write(data)
        self.raw.flush()

    async def flush(self) -> None:  # every write is flushed whole
        return None


class _Lines:
    """stdin as the SDK iterates it (text lines), each read at most ``MAX_LINE_BYTES + 1``
    bytes at a time; the rest of an over-long line is read in chunks and dropped."""

    def __init__(self, raw: BinaryIO, out: _Out) -> None:
        self.raw = raw
        self.out = out

    def __aiter__(self) -> AsyncIterator[str]:
        return self._lines()

    async def _lines(self) -> AsyncIterator[str]:
        while True:
            line = await anyio.to_thread.run_sync(self.raw.readline, MAX_LINE_BYTES + 1)
            if not line:
                return
            if len(line) <= MAX_LINE_BYTES or line.endswith(b"\n") and len(line) == (
                    MAX_LINE_BYTES + 1):
                where = not_text(line)
                if where is None:
                    yield line.decode("utf-8", errors="replace")
                else:
                    await self.out.write(not_text_error(_id_in(line[:4096]), where) + "\n")
                continue
            msg_id = _id_in(line[:4096])
            del line
            ended = await self._discard()
            print(f"policy-engine mcp: a JSON-RPC line over {MAX_LINE_BYTES} bytes was "
                  "refused and dropped", file=sys.stderr)
            await self.out.write(too_long(msg_id) + "\n")
            if not ended:
                return

    async def _discard(self) -> bool:
        """Drop the rest of the line; False at end of input."""
        while True:
            chunk = await anyio.to_thread.run_sync(self.raw.readline, _DISCARD_CHUNK)
            if not chunk:
                return False
            if chunk.endswith(b"\n"):
                return True


@contextmanager
def _claimed(fd: int, divert_to: int) -> Iterator[BinaryIO]:
    """The wire on a private descriptor while ``fd`` points elsewhere (stdin at /dev/null,
    stdout at stderr), so a handler's or child's stray read or print misses the protocol;
    ``fd`` is restored on exit. The SDK does the same for the streams it opens itself."""
    private = os.dup(fd)
    os.set_inheritable(private, False)
    os.dup2(divert_to, fd)
    try:
        yield os.fdopen(private, "rb" if fd == 0 else "wb", buffering=-1, closefd=False)
    finally:
        os.dup2(private, fd)


@asynccontextmanager
async def bounded_stdio() -> AsyncIterator[tuple[ObjectReceiveStream[SessionMessage | Exception],
                                                 ObjectSendStream[SessionMessage]]]:
    """``mcp.server.stdio.stdio_server`` over this process's stdin/stdout, lines bounded."""
    sys.stdout.flush()
    null = os.open(os.devnull, os.O_RDONLY)
    try:
        with _claimed(0, null) as wire_in, _claimed(1, 2) as wire_out:
            out = _Out(wire_out)
            stdin = cast(Any, _Lines(wire_in, out))
            async with stdio_server(stdin=stdin, stdout=cast(Any, out)) as streams:
                yield cast(Any, streams)
    finally:
        os.close(null)
