"""The seed 002 workspace: ``projects/<project_id>/{inputs,work,artifacts/<exec_id>}`` on the host.

The host root defaults to ``<state_dir>/docker`` (``default_root``), outside the tree fs rules
apply to (``mappings.root_fs``): one tenant's fs.read or fs.list never reaches another tenant's
project, whatever the policy's paths.

Only these three template paths are ever mount sources; each is checked to resolve exactly to
its template (no symlink anywhere on the way) before it is handed to Docker. After a run the
per-exec directory gets ``stdout.txt``, ``stderr.txt``, ``manifest.json`` and ``meta.json``,
written with no-follow opens (the container could have planted symlinks there).
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import re
import secrets
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from policy_engine.errors import BackendRefusal, ErrorCode
from policy_engine.model import Profile

SANDBOX_UID = 1000
OWN_FILES = ("stdout.txt", "stderr.txt", "manifest.json", "meta.json")
CONTAINER_ROOT = "/workspace"
_SLUG = re.compile(r"[^A-Za-z0-9_.-]+")


def slug(text: str, limit: int = 64) -> str:
    """A file-name-safe form of an identifier (never empty, never ``.`` or ``..``)."""
    s = _SLUG.sub("_", text).strip("._")[:limit]
    return s or "x"


def project_id_of(profile: Profile, bound: str | None = None) -> str:
    """Seed 002 §2: without a project concept, one project per tenant and subject; a bound
    call (``bound.py``: a session's workspace) gets one per tenant, subject and bound root.

    A readable prefix (the slugged pair) and a digest of the exact pair: slugging alone is not
    injective (``acme`` + ``x--y`` and ``acme--x`` + ``y``; ``agent:alice`` and
    ``agent_alice``), the digest (128 bits of SHA-256 over an unambiguous encoding) is.
    """
    return project_id(profile.tenant, profile.subject_id, bound)


def project_id(tenant: str, subject_id: str, bound: str | None = None) -> str:
    """:func:`project_id_of` from the tenant, subject and bound root themselves."""
    pair = [tenant, subject_id]
    exact = json.dumps(pair if bound is None else [*pair, bound], ensure_ascii=True)
    digest = hashlib.sha256(exact.encode("ascii")).hexdigest()[:32]
    return f"{slug(tenant, 40)}--{slug(subject_id, 80)}--{digest}"


def default_root(state_dir: Path, profile: Profile) -> Path:
    """``<state_dir>/docker``, refused when it lies beneath the profile's ``root_fs``."""
    root = (state_dir / "docker").absolute()
    fs_root = Path(os.path.normpath(profile.mappings.root_fs))
    if root == fs_root or fs_root in root.parents:
        raise BackendRefusal(
            ErrorCode.CAPABILITY_BLOCKED,
            f"the docker workspace `{root}` would lie beneath root_fs `{fs_root}`, where fs "
            "rules could expose one tenant's project to another: set the state directory "
            "(POLICY_ENGINE_STATE / state_dir) or options.docker.workspace_root outside it",
            audit={"workspace_root": str(root), "root_fs": str(fs_root)})
    return root


@dataclass(frozen=True, slots=True)
class ExecWorkspace:
    """The host directories of one execution."""

    root: Path
    project_id: str
    exec_id: str
    bound: str | None = None  # a bound call's root_fs (bound.py): its project is the root's
    binds: tuple[tuple[str, bool], ...] = ()  # a bound call's (host path, read-only), in place

    @property
    def project(self) -> Path:
        return self.root / "projects" / self.project_id

    @property
    def inputs(self) -> Path:
        return self.project / "inputs"

    @property
    def work(self) -> Path:
        return self.project / "work"

    @property
    def artifacts(self) -> Path:
        return self.project / "artifacts" / self.exec_id

    def mounts(self) -> list[tuple[str, str, bool]]:
        """(host source, container target, read-only) for the three template paths only (a
        bound call: its root at its own path in place of ``work``)."""
        work = ([(p, p, ro) for p, ro in self.binds] if self.bound else
                [(str(self.work), f"{CONTAINER_ROOT}/work", False)])
        return [
            (str(self.inputs), f"{CONTAINER_ROOT}/inputs", True),
            *work,
            (str(self.artifacts), f"{CONTAINER_ROOT}/artifacts", False),
        ]


def prepare(root: Path, profile: Profile, bound: str | None = None,
            binds: tuple[tuple[str, bool], ...] = ()) -> ExecWorkspace:
    """Create the project's directories and a fresh per-exec artifacts directory."""
    ws = ExecWorkspace(root=root, project_id=project_id_of(profile, bound),
                       exec_id=f"{slug(profile.call_id, 48)}-{secrets.token_hex(4)}",
                       bound=bound, binds=binds)
    ws.inputs.mkdir(parents=True, exist_ok=True, mode=0o755)
    # only the engine (and the engine's user) may reach work/ and artifacts/ on the host: the
    # container's uid 1000 can be a real host account, whatever it writes must stay out of
    # every other account's reach (the container gets the binds from the engine, not a path)
    os.chmod(ws.project, 0o700)
    for d in (ws.work, ws.artifacts.parent):
        d.mkdir(parents=True, exist_ok=True, mode=0o755)
    ws.artifacts.mkdir(mode=0o755)
    for d in (ws.work, ws.artifacts):
        os.chown(d, SANDBOX_UID, SANDBOX_UID)
    check_mounts(ws, ws.mounts())
    return ws


def check_mounts(ws: ExecWorkspace, mounts: list[tuple[str, str, bool]]) -> None:
    """Refuse any mount source that is not exactly one of the three template paths (or a
    bound call's root)."""
    allowed = {str(ws.inputs): True, str(ws.artifacts): False,
               **(dict(ws.binds) if ws.bound else {str(ws.work): False})}
    for source, _target, read_only in mounts:
        if source not in allowed or (allowed[source] and not read_only):
            raise BackendRefusal(
                ErrorCode.CAPABILITY_BLOCKED, f"mount source `{source}` is not a workspace "
                "template path", audit={"source": source})
        if os.path.realpath(source) != source or not (
                Path(source).is_dir() or read_only and Path(source).is_file()):
            raise BackendRefusal(
                ErrorCode.CAPABILITY_BLOCKED, f"mount source `{source}` is not a plain directory "
                "(symlink on the way?)", audit={"source": source})


def _open_dir(path: Path) -> int:
    return os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)


def write_file(dir_fd: int, name: str, data: bytes) -> None:
    """Write ``name`` in ``dir_fd`` without following a symlink planted by the container."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW
    try:
        fd = os.open(name, flags, 0o644, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno not in (errno.ELOOP, errno.EISDIR):
            raise
        remove_entry(dir_fd, name)
        fd = os.open(name, flags, 0o644, dir_fd=dir_fd)
    with os.fdopen(fd, "wb") as fh:
        fh.write(data)


def remove_entry(dir_fd: int, name: str) -> None:
    """Remove a file, symlink or whole directory tree beneath ``dir_fd`` (never following)."""
    st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    if not stat.S_ISDIR(st.st_mode):
        os.unlink(name, dir_fd=dir_fd)
        return
    sub = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=dir_fd)
    try:
        for child in os.listdir(sub):
            remove_entry(sub, child)
    finally:
        os.close(sub)
    os.rmdir(name, dir_fd=dir_fd)


def collect_artifacts(ws: ExecWorkspace, limit: int) -> tuple[list[dict[str, Any]], list[str]]:
    """Hash the artifact files (path order) up to ``limit`` total bytes; delete the rest.

    :return: the manifest entries kept and the paths removed for exceeding the limit.
    """
    dfd = _open_dir(ws.artifacts)
    try:
        entries: list[dict[str, Any]] = []
        _walk_and_hash(dfd, entries, limit)
        kept = [e for e in entries if not e.get("removed")]
        removed = [e["path"] for e in entries if e.get("removed")]
        return kept, removed
    finally:
        os.close(dfd)


def _walk_and_hash(dfd: int, entries: list[dict[str, Any]], limit: int) -> None:
    raw: list[dict[str, Any]] = []
    subdirs: list[int] = []
    _walk_collect(dfd, "", raw, subdirs)
    try:
        total = 0
        for e in raw:
            fd_, name = e.pop("_fd", None), e.pop("_name", None)
            if fd_ is None or name is None:
                entries.append(e)
                continue
            if total + e["size"] > limit:
                os.unlink(name, dir_fd=fd_)
                e["removed"] = True
                entries.append(e)
                continue
            total += e["size"]
            e["sha256"] = _hash(fd_, name)
            entries.append(e)
    finally:
        for fd in subdirs:
            os.close(fd)


def _walk_collect(dir_fd: int, prefix: str, out: list[dict[str, Any]], fds: list[int]) -> None:
    for name in sorted(os.listdir(dir_fd)):
        if not prefix and name in OWN_FILES:
            continue
        st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        rel = f"{prefix}{name}"
        if stat.S_ISDIR(st.st_mode):
            sub = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=dir_fd)
            fds.append(sub)
            _walk_collect(sub, rel + "/", out, fds)
        elif stat.S_ISREG(st.st_mode):
            out.append({"path": rel, "size": st.st_size, "_fd": dir_fd, "_name": name})
        else:
            out.append({"path": rel, "size": 0,
                        "type": "symlink" if stat.S_ISLNK(st.st_mode) else "special"})


def _hash(dir_fd: int, name: str) -> str:
    fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW, dir_fd=dir_fd)
    h = hashlib.sha256()
    with os.fdopen(fd, "rb") as fh:
        while chunk := fh.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def write_record(ws: ExecWorkspace, stdout: bytes, stderr: bytes,
                 manifest: list[dict[str, Any]], meta: dict[str, Any]) -> None:
    """Write the four per-exec files of seed 002 §2 into the artifacts directory."""
    dfd = _open_dir(ws.artifacts)
    try:
        write_file(dfd, "stdout.txt", stdout)
        write_file(dfd, "stderr.txt", stderr)
        write_file(dfd, "manifest.json", json.dumps(
            {"exec_id": ws.exec_id, "files": manifest}, indent=2, sort_keys=True).encode())
        write_file(dfd, "meta.json", json.dumps(meta, indent=2, sort_keys=True).encode())
    finally:
        os.close(dfd)
