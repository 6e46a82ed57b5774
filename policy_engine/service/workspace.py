"""The exec workspace of seed 002 §2, one tree per tenant, and safe file access inside it.

``<root>/tenants/<tenant>/projects/<project_id>/{inputs,work,artifacts/<exec_id>}``: a project
id is only unique within its tenant, so the tenant is part of the path.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import posixpath
import re
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import unquote_to_bytes

from policy_engine.service.errors import ServiceError, service_error
from policy_engine.service.models import Artifact

SERVICE_FILES = ("stdout.txt", "stderr.txt", "manifest.json", "meta.json")
_CONTROL = re.compile("[\x00-\x1f\x7f]")


def normalize_input_path(raw: str) -> str:
    """``raw`` as a normalized path relative to ``inputs/``; refuses absolute paths, ``..``,
    NUL and empty results with ``SERVICE.BAD_REQUEST`` (seed 002 §5.1: 400)."""
    if "\x00" in raw or "\\" in raw:
        raise service_error("SERVICE.BAD_REQUEST", "input path has a NUL or backslash")
    if raw.startswith("/"):
        raise service_error("SERVICE.BAD_REQUEST", f"input path `{raw}` is absolute")
    if ".." in raw.split("/"):
        raise service_error("SERVICE.BAD_REQUEST", f"input path `{raw}` contains `..`")
    norm = posixpath.normpath(raw)
    if norm in (".", "") or norm.startswith(("../", "/")):
        raise service_error("SERVICE.BAD_REQUEST", f"input path `{raw}` names no file")
    return norm


class ProjectDirs:
    """The directories of one tenant's project."""

    def __init__(self, root: Path, tenant: str, project_id: str) -> None:
        self.base = root / "tenants" / tenant / "projects" / project_id
        self.inputs = self.base / "inputs"
        self.work = self.base / "work"
        self.artifacts = self.base / "artifacts"

    def create(self, exec_id: str) -> Path:
        """The project's directories and ``artifacts/<exec_id>``.

        :raises ServiceError: ``PROVIDER.UNAVAILABLE`` (503) when the workspace cannot be
            written (see ``GET /sandbox/health``).
        """
        try:
            for d in (self.inputs, self.work, self.artifacts):
                d.mkdir(parents=True, exist_ok=True)
                if d.is_symlink():  # only the service creates these; refuse a planted link
                    raise ServiceError("SANDBOX.CAPABILITY_BLOCKED", 403, "blocked by sandbox "
                                       "policy: workspace directory is a link")
            out = self.artifacts / exec_id
            out.mkdir(mode=0o755)
        except OSError as exc:
            raise ServiceError("PROVIDER.UNAVAILABLE", 503, "provider unavailable: the exec "
                               f"workspace cannot be written ({exc.strerror})", True) from None
        return out

    def write_input(self, rel: str, data: bytes) -> None:
        """Write ``inputs/<rel>`` without following any link (the exec cannot write inputs/,
        but a link planted by other means must still not redirect the write)."""
        parts = rel.split("/")
        fd = os.open(self.inputs, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
        try:
            for part in parts[:-1]:
                with contextlib.suppress(FileExistsError):
                    os.mkdir(part, 0o755, dir_fd=fd)
                nxt = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
                os.close(fd)
                fd = nxt
            with suppress_missing():
                os.unlink(parts[-1], dir_fd=fd)
            out = os.open(parts[-1], os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW,
                          0o644, dir_fd=fd)
            with os.fdopen(out, "wb") as fh:
                fh.write(data)
        except (NotADirectoryError, IsADirectoryError, OSError) as exc:
            raise service_error("SERVICE.BAD_REQUEST",
                                f"cannot write input `{rel}`: {exc.strerror}") from None
        finally:
            os.close(fd)


class suppress_missing:  # noqa: N801 - used like contextlib.suppress
    def __enter__(self) -> None:
        return None

    def __exit__(self, exc_type: object, exc: object, tb: object) -> bool:
        return isinstance(exc, FileNotFoundError | IsADirectoryError)


def write_service_file(directory: Path, name: str, data: bytes) -> None:
    """Replace ``directory/name`` (the exec may have planted a link or file there)."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    try:
        with suppress_missing():
            os.unlink(name, dir_fd=fd)
        if os.path.lexists(directory / name):  # a directory the exec made: move it aside
            os.rename(name, f"{name}.exec-dir", src_dir_fd=fd, dst_dir_fd=fd)
        out = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644,
                      dir_fd=fd)
        with os.fdopen(out, "wb") as fh:
            fh.write(data)
    finally:
        os.close(fd)


def artifact_name(rel: str) -> tuple[str, bool]:
    """``rel`` (as ``os`` functions decode it) as text any JSON writer and a JSONB column take,
    and whether it had to be escaped. A UTF-8 name without control characters is kept as it
    is; another (``os.fsdecode`` keeps stray bytes as lone surrogates; a newline would make a
    path no URL route matches) gets each such byte, each control character and each ``%``
    percent-encoded (``\\xff`` → ``%FF``, ``\\n`` → ``%0A``, ``%`` → ``%25``), so the escape is
    lossless (:func:`artifact_os_name`) and never mistaken for a real name: it is marked
    ``not_utf8``."""
    try:
        rel.encode("utf-8")
        if not _CONTROL.search(rel):
            return rel, False
    except UnicodeEncodeError:
        pass
    out = []
    for ch in rel:
        code = ord(ch)
        if 0xDC80 <= code <= 0xDCFF:  # surrogateescape of the byte code - 0xDC00
            out.append(f"%{code - 0xDC00:02X}")
        elif ch == "%":
            out.append("%25")
        elif code < 0x20 or code == 0x7F:  # a control character: no route matches a newline
            out.append(f"%{code:02X}")
        elif 0xD800 <= code <= 0xDFFF:  # a surrogate fsdecode never makes: its UTF-8 bytes
            out.append("".join(f"%{b:02X}" for b in ch.encode("utf-8", "surrogatepass")))
        else:
            out.append(ch)
    return "".join(out), True


def artifact_os_name(shown: str, escaped: bool) -> str:
    """The name on disk (as ``os`` functions take it) of an artifact listed as ``shown``."""
    return os.fsdecode(unquote_to_bytes(shown)) if escaped else shown


def stored_artifact(data: dict[str, Any]) -> Artifact:
    """An artifact as a store kept it; a row written before names were escaped (a lone
    surrogate in its ``path``) is escaped as it is read, so it still lists."""
    path, escaped = artifact_name(str(data["path"]))
    return Artifact.model_validate({**data, "path": path} | ({"not_utf8": True} if escaped
                                                             else {}))


@dataclass(frozen=True, slots=True)
class ArtifactScan:
    """What :func:`scan_artifacts` found: the listed files, their total size, and whether it
    stopped at its cap (files beyond it are neither listed nor counted)."""

    found: list[dict[str, object]]
    total: int
    truncated: bool


def artifact_entry(rel: str, data: bytes) -> dict[str, object]:
    """The listing entry of a file the service wrote itself (``data`` is its content)."""
    return {"path": rel, "size": len(data), "sha256": hashlib.sha256(data).hexdigest(),
            "not_utf8": False}


def scan_artifacts(directory: Path, limit: int, skip: tuple[str, ...] = ()) -> ArtifactScan:
    """Regular files under ``directory`` (links and special files skipped; top-level names in
    ``skip`` too), with size and sha256, sorted by path; at most ``limit`` files and ``limit``
    other entries are looked at: the walk stops at the next one, so its time and the listing
    are bounded whatever the exec left (attack round 32, M1). A name that is not UTF-8 or has
    a control character is listed escaped (:func:`artifact_name`) with ``not_utf8: true``."""
    found: list[dict[str, object]] = []
    total = others = 0
    pending = [(str(directory), "")]
    while pending:
        path, prefix = pending.pop()
        try:
            entries = os.scandir(path)
        except OSError:
            continue
        with entries:
            for entry in entries:
                if not prefix and entry.name in skip:
                    continue
                try:
                    st = entry.stat(follow_symlinks=False)
                except OSError:
                    continue
                if not stat.S_ISREG(st.st_mode):
                    others += 1
                    if others > limit:
                        return ArtifactScan(_sorted(found), total, True)
                    if stat.S_ISDIR(st.st_mode):
                        pending.append((entry.path, f"{prefix}{entry.name}/"))
                    continue
                if len(found) >= limit:
                    return ArtifactScan(_sorted(found), total, True)
                item = _hashed(entry.path, f"{prefix}{entry.name}")
                if item is not None:
                    found.append(item)
                    total += int(str(item["size"]))
    return ArtifactScan(_sorted(found), total, False)


def _sorted(found: list[dict[str, object]]) -> list[dict[str, object]]:
    return sorted(found, key=lambda a: str(a["path"]))


def _hashed(full: str, rel: str) -> dict[str, object] | None:
    """The entry of one regular file, or ``None`` when it is no longer one (never a link
    followed, never a FIFO waited on)."""
    try:
        fd = os.open(full, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as fh:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return None
        digest = hashlib.sha256()
        size = 0
        for chunk in iter(lambda: fh.read(1 << 16), b""):
            digest.update(chunk)
            size += len(chunk)
    shown, escaped = artifact_name(rel)
    return {"path": shown, "size": size, "sha256": digest.hexdigest(), "not_utf8": escaped}


def open_artifact(directory: Path, rel: str) -> int:
    """A read-only fd of ``directory/rel``, never following a link on the way. ``rel`` is a
    listed path: when no file has that name and it is a percent-escaped name
    (:func:`artifact_name`), the file whose name it escapes (where a UTF-8 name spells the
    same text, that file is the one served)."""
    try:
        return _open_artifact(directory, rel)
    except ServiceError:
        if "%" not in rel:
            raise
    return _open_artifact(directory, artifact_os_name(rel, True))


def _open_artifact(directory: Path, rel: str) -> int:
    parts = rel.split("/")
    if any(p in ("", ".", "..") for p in parts) or "\x00" in rel:
        raise service_error("SERVICE.BAD_REQUEST", "artifact path is not a plain relative path")
    try:
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except OSError:
        raise service_error("SERVICE.NOT_FOUND", "no such artifact") from None
    try:
        for part in parts[:-1]:
            nxt = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
            os.close(fd)
            fd = nxt
        out = os.open(parts[-1], os.O_RDONLY | os.O_NOFOLLOW, dir_fd=fd)
    except OSError:
        raise service_error("SERVICE.NOT_FOUND", "no such artifact") from None
    finally:
        os.close(fd)
    if not stat.S_ISREG(os.fstat(out).st_mode):
        os.close(out)
        raise service_error("SERVICE.NOT_FOUND", "no such artifact")
    return out
