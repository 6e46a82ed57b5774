"""The `fs` executor: read, write and list beneath the profile's root with no-follow opens."""

from __future__ import annotations

import base64
import binascii
import contextlib
import hashlib
import os
import secrets
import stat
from dataclasses import dataclass
from typing import Any

from plugins.executor_fs.follow import FsOp, followed
from plugins.executor_fs.listing import EntryFilter, Lister, check_time, mandatory_denied
from plugins.executor_fs.mounts import LocalMounts
from plugins.executor_fs.resolve import BeneathOpener, open_root, rename_noreplace, split_relative
from policy_engine import ErrorCode, PolicyEngineError
from policy_engine.executor import ExecContext, ExecutorCapabilities
from policy_engine.guard.engine_state import ENGINE_STATE_ID, EngineState
from policy_engine.model import (
    SYSTEM_DEFAULT_LIMITS,
    Digest,
    ExecOp,
    ExecResult,
    FsListOp,
    FsReadOp,
    FsWriteOp,
    OpKind,
    SideEffect,
    SideEffectRec,
    Usage,
)
from policy_engine.model.unchecked import assembled

_CHUNK = 64 * 1024
# the fields a read's models are given (``assembled``: what the validated calls set)
_EFFECT_GIVEN = frozenset({"kind", "meta"})
_BYTES_IN_GIVEN = frozenset({"bytes_in"})
_RESULT_GIVEN = frozenset({"ok", "out", "used"})
_MOUNTS = LocalMounts()  # one mount table per process


@dataclass(frozen=True, slots=True)
class FsOptions:
    """Validated ``fs`` plugin options.

    :param preview_bytes: how many leading bytes of a read are returned base64 (seed 000:
        "hash + first N bytes"); the rest is represented by the digest only.
    :param use_openat2: ``None`` probes the kernel, ``False`` forces the openat walk.
    :param allow_hardlinks: read regular files that have more than one hard link. Off by
        default: a link made on the host to a file outside the root (``ln /root/.ssh/id
        /workspace/work/x``) has the name of an allowed path and the content of a denied one,
        and no path check can tell them apart.
    """

    preview_bytes: int = 64 * 1024
    use_openat2: bool | None = None
    allow_hardlinks: bool = False

    @staticmethod
    def parse(raw: Any) -> FsOptions:
        opts = dict(raw or {})
        unknown = set(opts) - {"preview_bytes", "use_openat2", "allow_hardlinks"}
        if unknown:
            raise ValueError(f"fs: unknown options {sorted(unknown)}")
        preview = opts.get("preview_bytes", 64 * 1024)
        if not isinstance(preview, int) or isinstance(preview, bool) or preview < 0:
            raise ValueError("fs: `preview_bytes` must be a non-negative integer")
        use = opts.get("use_openat2")
        if use is not None and not isinstance(use, bool):
            raise ValueError("fs: `use_openat2` must be a boolean or null")
        links = opts.get("allow_hardlinks", False)
        if not isinstance(links, bool):
            raise ValueError("fs: `allow_hardlinks` must be a boolean")
        return FsOptions(preview_bytes=preview, use_openat2=use, allow_hardlinks=links)


def _limit(ctx: ExecContext, name: str) -> int:
    """The call's effective limit ``name`` (``ctx.limits``: the permitting rule's included)."""
    value = getattr(ctx.limits, name)
    return int(value if value is not None else getattr(SYSTEM_DEFAULT_LIMITS, name))


class FsExecutor:
    """Serves fs.read / fs.write / fs.list; every open resolves beneath ``mappings.root_fs``."""

    name = "fs"
    capabilities = ExecutorCapabilities(
        op_kinds=frozenset({OpKind.FS_READ, OpKind.FS_WRITE, OpKind.FS_LIST}),
        readonly_rootfs=False, resource_limits=True,
    )
    charges_at_start = True  # ctx.started() before the first open beneath the root
    # run wholly inside the engine, acting on nothing: their begin record is written with the
    # end, in one append (Orchestrator; a write still gets its begin record first)
    contained_kinds = frozenset({OpKind.FS_READ, OpKind.FS_LIST})

    def __init__(self, options: FsOptions | None = None) -> None:
        self.options = options or FsOptions()
        self.opener = BeneathOpener(self.options.use_openat2)

    def close(self) -> None:
        """Nothing pooled: every call opens and closes its own descriptors."""

    def stops_by_itself(self, kind: OpKind, root_fs: str) -> bool:
        """Whether a ``kind`` call beneath ``root_fs`` ends by its deadline and on its cancel
        token without a watching thread (``run_with_deadline`` then runs it in the calling
        thread): a read or a listing checks both between chunks and entries, and none of its
        system calls waits on a server or a daemon when every file system beneath the root is
        local (``mounts.LocalMounts``). A write (it fsyncs) is watched."""
        return kind in self.contained_kinds and _MOUNTS.local(root_fs)

    def execute(self, ctx: ExecContext, op: ExecOp) -> ExecResult:
        if isinstance(op, FsReadOp):
            return self._read(ctx, op)
        if isinstance(op, FsWriteOp):
            return self._write(ctx, op)
        if isinstance(op, FsListOp):
            return self._list(ctx, op)
        raise PolicyEngineError(ErrorCode.EXECUTION_FAILED, f"fs cannot run `{op.kind}`")

    # -- helpers --------------------------------------------------------------------------

    def _parts(self, ctx: ExecContext, op: FsOp) -> list[str]:
        """Relative components of the path with its in-root links resolved (follow.py); a
        mandatory deny and the engine's state dir are re-checked here as a second line."""
        path = op.path
        parts = split_relative(path, ctx.profile.mappings.root_fs)
        resolved = followed(ctx, op)
        if resolved != path:
            parts = split_relative(resolved, ctx.profile.mappings.root_fs)
        normalized = _normalized(ctx, parts)
        # the engine's state dir (guard/engine_state.py), as the call's guard knows it
        state: EngineState | None = getattr(ctx.guard, "engine_state", None)
        if state is not None and state.covers(normalized):
            raise PolicyEngineError(ErrorCode.CAPABILITY_BLOCKED,
                                    state.reason("path", normalized),
                                    audit={"rule": ENGINE_STATE_ID})
        write = op.kind == "fs.write"
        if state is not None and (tree := state.tree(normalized, write=write)):
            raise PolicyEngineError(ErrorCode.CAPABILITY_BLOCKED,  # its other trees, as the guard
                                    state.tree_reason("path", normalized, tree, write=write),
                                    audit={"rule": ENGINE_STATE_ID})
        rule = mandatory_denied(ctx.profile, normalized)
        if rule is not None:
            raise PolicyEngineError(ErrorCode.CAPABILITY_BLOCKED,
                                    f"path `{path}` is under a mandatory deny",
                                    audit={"rule": rule})
        return parts

    def _open(self, ctx: ExecContext, parts: list[str], flags: int, shown: str) -> int:
        if flags & os.O_CREAT == 0:
            # the usual case in one system call; anything unusual the long way (its errors)
            fd = self.opener.open_whole(ctx.profile.mappings.root_fs, parts, flags)
            if fd is not None:
                return fd
        root_fd = open_root(ctx.profile.mappings.root_fs)
        try:
            return self.opener.open(root_fd, parts, flags, shown=shown)
        finally:
            os.close(root_fd)

    # -- fs.read --------------------------------------------------------------------------

    def _read(self, ctx: ExecContext, op: FsReadOp) -> ExecResult:
        cap = _limit(ctx, "max_bytes_in")
        want = cap if op.len is None else op.len
        if want > cap:
            raise PolicyEngineError(ErrorCode.CAPABILITY_BLOCKED,
                                    f"read of {want} bytes exceeds max_bytes_in {cap}")
        parts = self._parts(ctx, op)
        ctx.started()  # refusals above this line cost no `calls` budget
        # O_NONBLOCK: a FIFO swapped in must not hang the call before fstat refuses it
        fd = self._open(ctx, parts, os.O_RDONLY | os.O_NONBLOCK, op.path)
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise PolicyEngineError(ErrorCode.CAPABILITY_BLOCKED,
                                        f"`{op.path}` is not a regular file")
            # fstat of the opened descriptor: a link added after the open is seen too
            if st.st_nlink > 1 and not self.options.allow_hardlinks:
                raise PolicyEngineError(
                    ErrorCode.CAPABILITY_BLOCKED,
                    f"`{op.path}` has {st.st_nlink} hard links: its content may belong to a "
                    "path outside the policy (the operator can set `options.fs.allow_hardlinks`)",
                    audit={"nlink": st.st_nlink})
            offset, sha, head, total = op.offset or 0, hashlib.sha256(), bytearray(), 0
            # read one byte past the cap when no length was asked: it tells "too big" apart
            budget = want if op.len is not None else cap + 1
            while total < budget:
                check_time(ctx)
                asked = min(_CHUNK, budget - total)
                chunk = os.pread(fd, asked, offset + total)
                if not chunk:
                    break
                total += len(chunk)
                sha.update(chunk)
                if len(head) < self.options.preview_bytes:
                    head += chunk[: self.options.preview_bytes - len(head)]
                if len(chunk) < asked:
                    break  # a regular file's short read is its end (no second read to see it)
        finally:
            os.close(fd)
        if op.len is None and total > cap:
            raise PolicyEngineError(ErrorCode.CAPABILITY_BLOCKED,
                                    f"`{op.path}` is larger than max_bytes_in {cap}")
        ctx.consume("bytes_in", total)
        # the three models assembled, not validated: every value is built right here, of its
        # field's type (``model.unchecked``; ≈ 5 µs a read; docs/benchmarks.md "Thirteenth pass")
        ctx.record_side_effect(assembled(SideEffectRec, {"kind": SideEffect.READ, "meta": {
            "op": "fs.read", "path": op.path, "bytes": total}}, _EFFECT_GIVEN))
        # ``Digest(...).model_dump()``'s dict, built directly (no model per read)
        digest = {"algo": "sha256", "b64": base64.b64encode(sha.digest()).decode(), "size": total}
        used = assembled(Usage, {"calls": 0, "bytes_out": 0, "bytes_in": total, "cpu_ms": 0,
                                 "gpu_ms": 0, "file_count": 0}, _BYTES_IN_GIVEN)
        return assembled(ExecResult, {"ok": True, "code": None, "message": None, "out": {
            "path": op.path, "offset": offset, "size": total, "digest": digest,
            "bytes_b64": base64.b64encode(bytes(head)).decode(),
            "preview_truncated": total > len(head), "resolver": self.opener.method,
        }, "used": used}, _RESULT_GIVEN)

    # -- fs.write -------------------------------------------------------------------------

    def _write(self, ctx: ExecContext, op: FsWriteOp) -> ExecResult:
        try:
            data = base64.b64decode(op.bytes_b64, validate=True)
        except (binascii.Error, ValueError):
            raise PolicyEngineError(ErrorCode.SCHEMA_VALIDATION_FAILED,
                                    "`bytes_b64` is not valid base64") from None
        cap = _limit(ctx, "max_bytes_out")
        if len(data) > cap:  # refused before a single byte touches the disk
            raise PolicyEngineError(ErrorCode.CAPABILITY_BLOCKED,
                                    f"write of {len(data)} bytes exceeds max_bytes_out {cap}")
        parts = self._parts(ctx, op)
        if not parts:
            raise PolicyEngineError(ErrorCode.CAPABILITY_BLOCKED, "cannot write the root itself")
        ctx.started()
        dir_fd = self._open(ctx, parts[:-1], os.O_RDONLY | os.O_DIRECTORY, op.path)
        name, tmp = parts[-1], f".{parts[-1]}.pe-{secrets.token_hex(6)}.tmp"
        try:
            self._check_target(dir_fd, name, op)
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
                         | os.O_CLOEXEC, 0o644, dir_fd=dir_fd)
            try:
                with os.fdopen(fd, "wb", closefd=True) as fh:
                    fh.write(data)
                    fh.flush()
                    os.fsync(fh.fileno())
                check_time(ctx)
                if op.overwrite:
                    os.rename(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
                else:
                    rename_noreplace(dir_fd, tmp, name)
            except BaseException as err:
                _unlink_quiet(dir_fd, tmp)
                if isinstance(err, FileExistsError):
                    raise PolicyEngineError(ErrorCode.CAPABILITY_BLOCKED,
                                            f"`{op.path}` exists and overwrite is false") from None
                if isinstance(err, OSError):
                    raise PolicyEngineError(ErrorCode.EXECUTION_FAILED,
                                            f"write failed: {err.strerror}") from None
                raise
            os.fsync(dir_fd)  # the rename itself must survive a crash
        finally:
            os.close(dir_fd)
        ctx.consume("bytes_out", len(data))
        ctx.record_side_effect(SideEffectRec(kind=SideEffect.WRITE, meta={
            "op": "fs.write", "path": op.path, "bytes": len(data), "overwrite": op.overwrite}))
        return ExecResult(ok=True, out={
            "path": op.path, "size": len(data), "digest": Digest.of(data).model_dump(),
            "resolver": self.opener.method,
        }, used=Usage(bytes_out=len(data), file_count=1))

    @staticmethod
    def _check_target(dir_fd: int, name: str, op: FsWriteOp) -> None:
        try:
            st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        except FileNotFoundError:
            return
        if not stat.S_ISREG(st.st_mode):
            raise PolicyEngineError(ErrorCode.CAPABILITY_BLOCKED,
                                    f"`{op.path}` exists and is not a regular file")
        if not op.overwrite:
            raise PolicyEngineError(ErrorCode.CAPABILITY_BLOCKED,
                                    f"`{op.path}` exists and overwrite is false")

    # -- fs.list --------------------------------------------------------------------------

    def _list(self, ctx: ExecContext, op: FsListOp) -> ExecResult:
        depth = min(op.depth, _limit(ctx, "max_depth"))
        max_files = _limit(ctx, "max_files")
        parts = self._parts(ctx, op)
        ctx.started()
        fd = self._open(ctx, parts, os.O_RDONLY | os.O_DIRECTORY, op.path)
        lister = Lister(ctx, _normalized(ctx, parts), max_files, EntryFilter(ctx).shown)
        truncated = lister.walk(fd, "", depth)
        entries = lister.out
        listing = "\n".join(f"{e['type']} {e['path']} {e['size']}" for e in entries).encode()
        ctx.record_side_effect(SideEffectRec(kind=SideEffect.READ, meta={
            "op": "fs.list", "path": op.path, "entries": len(entries)}))
        return ExecResult(ok=True, out={
            "path": op.path, "depth": depth, "entries": entries, "count": len(entries),
            "truncated": truncated, "digest": Digest.of(listing).model_dump(),
            "resolver": self.opener.method,
            # entries whose names are not UTF-8, listed escaped (listing.printable_name)
            **({"not_utf8": lister.not_utf8} if lister.not_utf8 else {}),
        }, used=Usage(file_count=len(entries)))


def _normalized(ctx: ExecContext, parts: list[str]) -> str:
    """The absolute path of ``parts`` beneath the root, as the policy's globs see it."""
    root = [p for p in ctx.profile.mappings.root_fs.split("/") if p]
    return "/" + "/".join([*root, *parts])


def _unlink_quiet(dir_fd: int, name: str) -> None:
    with contextlib.suppress(OSError):
        os.unlink(name, dir_fd=dir_fd)
