"""The exec workspace of seed 002 §2, one tree per tenant, and safe file access inside it.

``<root>/tenants/<tenant>/projects/<project_id>/{inputs,work,artifacts/<exec_id>}``: a project
id is only unique within its tenant, so the tenant is part of the path.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import posixpath
import stat
from pathlib import Path
from typing import Any
from urllib.parse import unquote_to_bytes

from policy_engine.service.errors import ServiceError, service_error
from policy_engine.service.models import Artifact

SERVICE_FILES = ("stdout.txt", "stderr.txt", "manifest.json", "meta.json")


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
    and whether it had to be escaped. A UTF-8 name is kept as it is; a name that is not
    (``os.fsdecode`` keeps its stray bytes as lone surrogates) gets each such byte and each
    ``%`` percent-encoded (``\\xff`` → ``%FF``, ``%`` → ``%25``), so the escape is lossless
    (:func:`artifact_os_name`) and never mistaken for a real name: it is marked ``not_utf8``."""
    try:
        rel.encode("utf-8")
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


def scan_artifacts(directory: Path) -> tuple[list[dict[str, object]], int]:
    """Every regular file under ``directory`` (links and special files skipped), with size and
    sha256, sorted by path; and their total size. A name that is not UTF-8 is listed escaped
    (:func:`artifact_name`) with ``not_utf8: true``: the exec record is stored whatever the
    names (issue 32 item 6)."""
    found: list[dict[str, object]] = []
    total = 0
    for dirpath, dirnames, filenames in os.walk(directory, followlinks=False):
        dirnames.sort()
        for name in sorted(filenames):
            full = os.path.join(dirpath, name)
            st = os.lstat(full)
            if not stat.S_ISREG(st.st_mode):
                continue
            digest = hashlib.sha256()
            fd = os.open(full, os.O_RDONLY | os.O_NOFOLLOW)
            with os.fdopen(fd, "rb") as fh:
                for chunk in iter(lambda: fh.read(1 << 16), b""):
                    digest.update(chunk)
            rel, escaped = artifact_name(os.path.relpath(full, directory).replace(os.sep, "/"))
            found.append({"path": rel, "size": st.st_size, "sha256": digest.hexdigest(),
                          "not_utf8": escaped})
            total += st.st_size
    return found, total


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
