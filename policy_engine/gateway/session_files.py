"""A session's files: upload, download (in chunks), list and delete, each a guarded op through
the gateway with its own decision and evidence (docs/sessions.md)."""

from __future__ import annotations

import base64
import dataclasses
import re
import time
from collections.abc import Iterator
from pathlib import Path, PurePosixPath
from typing import Any

from policy_engine.errors import ErrorCode, PolicyEngineError
from policy_engine.gateway.call import Call
from policy_engine.gateway.outcome import Called
from policy_engine.gateway.session_runtime import Sessions
from policy_engine.gateway.session_store import SessionInfo
from policy_engine.model import (
    ExecOp,
    FsListOp,
    FsReadOp,
    FsWriteOp,
    Grant,
    Manifest,
    NetworkMode,
    ProcExecOp,
    Settings,
)
from policy_engine.refusal import PolicyRefusal, Refusal, code_refusal, engine_refusal

_CHUNK = 64 * 1024  # the fs executor's default preview: one guarded read per chunk
# exit 3: nothing of that name; 4: a directory (delete removes one file); anything else
# (a busy mount point such as a masked file, a read-only bind) is the interpreter's traceback
_UNLINK = ("import os, sys\ntry:\n os.unlink(sys.argv[1])\n"
           "except (FileNotFoundError, NotADirectoryError):\n sys.exit(3)\n"
           "except IsADirectoryError:\n sys.exit(4)",)
_GONE, _A_DIRECTORY = 3, 4
_MAKEDIRS = ("import os, sys\nos.makedirs(sys.argv[1], exist_ok=True)",)
_GRANT_TTL_MS = 10 * 60 * 1000


def files_manifest(root: Path) -> Manifest:
    """The built-in manifest of session files: fs read, write and list over the session
    workspaces, and python3 (a delete is a one-line unlink in the sandbox)."""
    paths = [f"{root}/**"]
    return Manifest.model_validate({
        "name": "session.files", "version": "1.0.0",
        "description": "a session's files: upload, download, list, delete",
        "permissions": [{"kind": "fs.read", "paths": paths},
                        {"kind": "fs.write", "paths": paths},
                        {"kind": "fs.list", "paths": paths},
                        {"kind": "proc.exec", "tool": "python3"}],
        "side_effects": ["Read", "Write"], "safety_class": "Medium", "network": "off"})


def relative(path: str) -> str:
    """``path`` as a clean relative path inside the workspace.

    :raises PolicyRefusal: absolute, empty, ``..`` or NUL (``SCHEMA.VALIDATION_FAILED``).
    """
    pure = PurePosixPath(path)
    # `.` (or `./`) names the workspace itself: a write there would replace the directory
    if (not path or "\0" in path or pure.is_absolute() or ".." in pure.parts
            or not pure.parts or pure.parts == (".",) or len(path) > 1024):
        raise PolicyRefusal(engine_refusal(PolicyEngineError(
            ErrorCode.SCHEMA_VALIDATION_FAILED, "path must be a relative path inside the "
            "session workspace (no `..`, at most 1024 characters)"), "service",
            location="path"))
    return str(pure)


class SessionFiles:
    """The files face of :class:`Sessions` (same owner checks: another token's session is
    ``404``).

    :param max_upload_bytes: the largest upload; a bigger one is refused (``413``) before a
        byte is written.
    """

    def __init__(self, sessions: Sessions, *, max_upload_bytes: int = 1 << 20) -> None:
        self.sessions = sessions
        self.max_upload_bytes = max_upload_bytes
        self.manifest = files_manifest(sessions.root)

    def check_size(self, size: int) -> None:
        """:raises PolicyRefusal: ``size`` is over the cap (``SERVICE.PAYLOAD_TOO_LARGE``)."""
        if size > self.max_upload_bytes:
            raise PolicyRefusal(code_refusal(
                "SERVICE.PAYLOAD_TOO_LARGE", 413, f"payload too large: an upload is at most "
                f"{self.max_upload_bytes} bytes", "limits", location="body"))

    def upload(self, tenant: str, subject: str, session_id: str, path: str, data: bytes, *,
               overwrite: bool = True) -> dict[str, Any]:
        """Write ``data`` at ``path``; answers ``{path, size, digest, envelope_id}``."""
        self.check_size(len(data))
        info = self.sessions.get(tenant, subject, session_id)
        rel = relative(path)
        parent = str(PurePosixPath(rel).parent)
        if parent != "." and not (self._work(info) / parent).is_dir():
            self._python(info, _MAKEDIRS, parent)  # fs.write makes no directories
        op = FsWriteOp(path=str(self._work(info) / rel),
                       bytes_b64=base64.b64encode(data).decode(), overwrite=overwrite)
        out = self._run(info, op, "fs.write").outcome
        return {"path": rel, "size": out.result.out.get("size"),
                "digest": out.result.out.get("digest"), "envelope_id": out.envelope_id}

    def download(self, tenant: str, subject: str, session_id: str, path: str
                 ) -> Iterator[bytes]:
        """The file's bytes in chunks, each read a guarded op (the first is made before this
        returns, so a refusal or a missing file raises here, not mid-stream)."""
        info = self.sessions.get(tenant, subject, session_id)
        host = str(self._work(info) / relative(path))
        first = self._read(info, host, 0)

        def chunks() -> Iterator[bytes]:
            data, offset = first, 0
            while data:
                yield data
                offset += len(data)
                if len(data) < _CHUNK:
                    return
                data = self._read(info, host, offset)

        return chunks()

    def list(self, tenant: str, subject: str, session_id: str, path: str = ".",
             depth: int = 3) -> dict[str, Any]:
        """The entries under ``path`` (relative to the workspace), one guarded fs.list."""
        info = self.sessions.get(tenant, subject, session_id)
        work = self._work(info)
        target = work if path in ("", ".") else work / relative(path)
        called = self._run(info, FsListOp(path=str(target), depth=depth), "fs.list")
        out = called.outcome.result.out
        return {"path": path, "entries": out.get("entries", []),
                "truncated": bool(out.get("truncated")), "envelope_id": called.envelope_id}

    def delete(self, tenant: str, subject: str, session_id: str, path: str) -> dict[str, Any]:
        """Unlink ``path`` in the sandbox (one guarded proc.exec of python3; the engine has no
        fs delete op): answers ``{path, envelope_id}``."""
        info = self.sessions.get(tenant, subject, session_id)
        rel = relative(path)
        called = self._python(info, _UNLINK, rel)
        status = called.outcome.result.out.get("exit_code")
        if status == _GONE:
            raise PolicyRefusal(_missing(called.envelope_id, Path("."), rel))
        if status == _A_DIRECTORY:
            raise PolicyRefusal(code_refusal(
                ErrorCode.SCHEMA_VALIDATION_FAILED.value, 422,
                "path names a directory: delete removes one file", "backend",
                envelope_id=called.envelope_id, location="path"))
        if status != 0:
            raise PolicyRefusal(code_refusal(
                ErrorCode.EXECUTION_FAILED.value, 500,
                f"the sandbox could not delete the file (exit {status})", "backend",
                retryable=False, envelope_id=called.envelope_id, location="path"))
        return {"path": rel, "envelope_id": called.envelope_id}

    # --- internals ---------------------------------------------------------------------------

    def _work(self, info: SessionInfo) -> Path:
        return self.sessions.workspace(info)

    def _python(self, info: SessionInfo, code: tuple[str], arg: str) -> Called:
        """A one-line python3 in the session's bubblewrap sandbox, ``arg`` as its argv[1]."""
        op = ProcExecOp(tool="python3", args=("-c", *code, arg), cwd=str(self._work(info)),
                        timeout_ms=10_000)
        return self._run(info, op, "proc.exec", backend="proc-bwrap")

    def _read(self, info: SessionInfo, host: str, offset: int) -> bytes:
        called = self._run(info, FsReadOp(path=host, offset=offset, len=_CHUNK), "fs.read")
        return base64.b64decode(str(called.outcome.result.out.get("bytes_b64", "")))

    def _run(self, info: SessionInfo, op: ExecOp, kind: str, *,
             backend: str | None = None) -> Called:
        """One guarded op on the session's workspace; a refusal raises (``PolicyRefusal``),
        a missing file as the gateway answers it on every face (``404 TOOL.NOT_FOUND``)."""
        work = self._work(info)
        now = int(time.time() * 1000)
        if kind == "proc.exec":
            caps: list[dict[str, Any]] = [{"kind": "proc.exec", "tool": "python3"},
                                          {"kind": "fs.write", "paths": [f"{work}/**"]}]
        else:
            caps = [{"kind": kind, "paths": [str(work), f"{work}/**"]}]
        grant = Grant.model_validate({
            "tenant": info.tenant, "subject_id": info.subject,
            "tool_name": self.manifest.name, "call_id": f"files-{info.session_id}-{now}",
            "expires_at": now + _GRANT_TTL_MS, "capabilities": caps})
        settings = Settings(network=NetworkMode.OFF, root_fs=str(work.parent),
                            session=str(work))  # the policy's `$SESSION`
        orch = self.sessions.pool.get(backend) if backend else None
        called = self.sessions.gateway.run(
            Call(grant, self.manifest, op, settings=settings,
                 annotations={"session": info.session_id},
                 identity=(info.tenant, info.subject)), orchestrator=orch)
        if called.refusal is not None:
            if (called.refusal.code == ErrorCode.NOT_FOUND.value
                    and isinstance(op, (FsReadOp, FsListOp, FsWriteOp))):
                # the code every face gives a missing file, in the caller's words: the
                # backend's message names the host path of the workspace
                raise PolicyRefusal(_missing(called.envelope_id, work, op.path))
            raise PolicyRefusal(_in_caller_words(called.refusal, work))
        return called


def _in_caller_words(refusal: Refusal, work: Path) -> Refusal:
    """``refusal`` with the workspace's host path in its message written as the caller's
    relative paths are (the guard and the backends name the host path they decided on)."""
    # a whole path only: a sibling workspace (`/w/ws10` beside `/w/ws1`) is not rewritten
    message = re.sub(re.escape(str(work)) + r"(/|(?=[`'\"\s)]|$))",
                     lambda m: "" if m.group(1) == "/" else ".", refusal.message)
    return refusal if message == refusal.message else dataclasses.replace(refusal,
                                                                          message=message)


def _missing(envelope_id: str | None, work: Path, path: str) -> Refusal:
    """``TOOL.NOT_FOUND`` (as `/v1/ops` and MCP answer a missing file) naming ``path``
    relative to the workspace ``work``."""
    shown = (str(PurePosixPath(path).relative_to(work)) if path.startswith(f"{work}/")
             else "." if path == str(work) else path)
    return code_refusal(ErrorCode.NOT_FOUND.value, 404, f"not found: no such file `{shown}`",
                        "backend", envelope_id=envelope_id, location="path")
