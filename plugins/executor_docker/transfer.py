"""Copying files in and out of a warm container (which has no workspace mounts of its own).

Inputs go in read-only (owned by root, modes 0444/0555); artifacts come out through a streamed
tar read with the ``data`` filter, symlinks and special files skipped, and the size limit applied
while reading so an oversized archive never lands on the host.
"""

from __future__ import annotations

import io
import os
import tarfile
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from plugins.executor_docker.runner import run_quiet
from policy_engine.lazy import lazy_module

if TYPE_CHECKING:
    import docker
else:  # the SDK on first use: a start that runs no container does not import it
    docker = lazy_module("docker")

ARTIFACTS_DIR = "/workspace/artifacts"


class _IterReader(io.RawIOBase):
    """A read-only file over an iterator of byte chunks (the SDK's archive stream)."""

    def __init__(self, chunks: Iterator[bytes]) -> None:
        self._chunks = chunks
        self._buf = b""

    def readable(self) -> bool:
        return True

    def readinto(self, b: memoryview) -> int:  # type: ignore[override]  # RawIOBase's buffer
        while not self._buf:
            try:
                self._buf = next(self._chunks)
            except StopIteration:
                return 0
        n = min(len(b), len(self._buf))
        b[:n] = self._buf[:n]
        self._buf = self._buf[n:]
        return n


def tar_inputs(inputs: Path, skip: frozenset[str] = frozenset()) -> bytes | None:
    """A tar of the project's inputs (regular files and directories only), or ``None``;
    ``skip``: host paths left out with everything beneath them (mandatory denies)."""
    entries = sorted(p for p in inputs.rglob("*")
                     if not any(str(p) == s or str(p).startswith(s + "/") for s in skip))
    if not entries:
        return None
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tf:
        for path in entries:
            if path.is_symlink() or not (path.is_dir() or path.is_file()):
                continue
            info = tf.gettarinfo(str(path), arcname=str(path.relative_to(inputs)))
            info.uid = info.gid = 0
            info.uname = info.gname = "root"
            info.mode = 0o555 if info.isdir() else 0o444
            if info.isdir():
                tf.addfile(info)
            else:
                with path.open("rb") as fh:
                    tf.addfile(info, fh)
    return buf.getvalue()


def put_inputs(client: docker.DockerClient, container_id: str, inputs: Path,
               skip: frozenset[str] = frozenset()) -> bool:
    """Copy the inputs into ``/workspace/inputs``; ``False`` when there was nothing to copy."""
    data = tar_inputs(inputs, skip)
    if data is None:
        return False
    client.api.put_archive(container_id, "/workspace/inputs", data)
    return True


def artifacts_changed(client: docker.DockerClient, container_id: str) -> bool:
    """Whether the artifacts directory has entries (it is a volume: the engine's diff of the
    container's layer does not see it)."""
    return run_quiet(client, container_id, [
        "/bin/sh", "-c", f'test -n "$(/usr/bin/ls -A {ARTIFACTS_DIR})"']) == 0


def fetch_artifacts(client: docker.DockerClient, container_id: str, dest: Path,
                    limit: int) -> list[str]:
    """Extract the container's artifacts into ``dest``; return the paths dropped (over limit)."""
    chunks, _stat = client.api.get_archive(container_id, ARTIFACTS_DIR)
    removed: list[str] = []
    total = 0
    reader = io.BufferedReader(_IterReader(iter(chunks)))
    with tarfile.open(fileobj=reader, mode="r|") as tf:
        for member in tf:
            name = member.name.split("/", 1)[1] if "/" in member.name else ""
            if not name:
                continue
            member.name = name
            if member.isdir():
                (dest / name).mkdir(parents=True, exist_ok=True)
                continue
            if not member.isreg():
                removed.append(name)
                continue
            if total + member.size > limit:
                removed.append(name)
                continue
            total += member.size
            tf.extract(member, path=dest, filter="data", set_attrs=False)
            os.chmod(dest / name, 0o644)
    return removed
