"""The `tmp` executor: isolated, size-bounded temp spaces under ``mappings.tmp_dir``."""

from __future__ import annotations

import atexit
import os
import secrets
import stat
import threading
import time
import weakref
from dataclasses import dataclass
from typing import Any, Literal

from plugins.executor_tmp.quota import (
    disk_usage,
    mount_tmpfs,
    page_round,
    remove_tree,
    unmount,
)
from policy_engine import ErrorCode, PolicyEngineError
from policy_engine.executor import ExecContext, ExecutorCapabilities
from policy_engine.model import (
    ExecOp,
    ExecResult,
    OpKind,
    Profile,
    SideEffect,
    SideEffectRec,
    TmpAllocOp,
    TmpCapability,
)

QuotaMode = Literal["auto", "tmpfs", "accounting"]


@dataclass(frozen=True, slots=True)
class TmpOptions:
    """Validated ``tmp`` plugin options.

    :param max_bytes: the executor's own ceiling on one space, whatever the profile allows.
    :param quota: ``tmpfs`` (mount a size-limited tmpfs; needs root and mount permission),
        ``accounting`` (a plain directory; usage counted on ``usage``/``check``/``release``) or
        ``auto`` (tmpfs when the mount succeeds, accounting otherwise).
    """

    max_bytes: int = 256 * 1024 * 1024
    quota: QuotaMode = "auto"

    @staticmethod
    def parse(raw: Any) -> TmpOptions:
        opts = dict(raw or {})
        unknown = set(opts) - {"max_bytes", "quota"}
        if unknown:
            raise ValueError(f"tmp: unknown options {sorted(unknown)}")
        max_bytes = opts.get("max_bytes", 256 * 1024 * 1024)
        if not isinstance(max_bytes, int) or isinstance(max_bytes, bool) or max_bytes < 0:
            raise ValueError("tmp: `max_bytes` must be a non-negative integer")
        quota = opts.get("quota", "auto")
        if quota not in ("auto", "tmpfs", "accounting"):
            raise ValueError("tmp: `quota` must be one of auto, tmpfs, accounting")
        return TmpOptions(max_bytes=max_bytes, quota=quota)


@dataclass(frozen=True, slots=True)
class TmpSpace:
    """One allocated space: a handle id, its path and how its quota is enforced."""

    handle: str
    path: str
    size_bytes: int
    quota: Literal["tmpfs", "accounting"]


def _allowed_size(profile: Profile, ceiling: int) -> int:
    """The smallest ``max_bytes`` of the profile's tmp.use capabilities and the ceiling."""
    caps = [c for pc in profile.capabilities for c in pc.all_of if isinstance(c, TmpCapability)]
    if not caps:
        raise PolicyEngineError(ErrorCode.CAPABILITY_BLOCKED, "profile grants no tmp.use")
    sizes = [c.max_bytes for c in caps if c.max_bytes is not None]
    return min([ceiling, *sizes])


def _ensure_base(base: str) -> None:
    """Create ``tmp_dir`` 0700 if missing; refuse a symlink or a directory owned by another."""
    os.makedirs(base, mode=0o700, exist_ok=True)
    st = os.lstat(base)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid():
        raise PolicyEngineError(ErrorCode.CAPABILITY_BLOCKED,
                                f"tmp_dir `{base}` is not a directory owned by this process")


class TmpExecutor:
    """Serves tmp.alloc; ``release`` gives a space back, ``close`` and interpreter exit release
    everything still allocated.
    """

    name = "tmp"
    capabilities = ExecutorCapabilities(op_kinds=frozenset({OpKind.TMP_ALLOC}),
                                        resource_limits=True)
    charges_at_start = True  # ctx.started() before the space is created

    def __init__(self, options: TmpOptions | None = None) -> None:
        self.options = options or TmpOptions()
        self._spaces: dict[str, TmpSpace] = {}
        self._lock = threading.Lock()
        # a weak reference: the atexit hook must not keep a closed executor alive
        ref = weakref.ref(self)
        self._atexit = lambda: (lambda ex: ex.close() if ex is not None else None)(ref())
        atexit.register(self._atexit)

    def execute(self, ctx: ExecContext, op: ExecOp) -> ExecResult:
        if not isinstance(op, TmpAllocOp):
            raise PolicyEngineError(ErrorCode.EXECUTION_FAILED, f"tmp cannot run `{op.kind}`")
        if ctx.cancel.cancelled or time.monotonic() > ctx.deadline:  # ctx.limits.timeout_ms
            raise PolicyEngineError(ErrorCode.TIMEOUT, "no time left to allocate a tmp space")
        allowed = _allowed_size(ctx.profile, self.options.max_bytes)
        if op.size_bytes > allowed:
            raise PolicyEngineError(ErrorCode.CAPABILITY_BLOCKED,
                                    f"tmp space of {op.size_bytes} bytes exceeds {allowed}")
        ctx.started()  # nothing created yet
        space = self.allocate(ctx.profile, op.size_bytes)
        ctx.record_side_effect(SideEffectRec(kind=SideEffect.FILESYSTEM, meta={
            "op": "tmp.alloc", "handle": space.handle, "bytes": space.size_bytes,
            "quota": space.quota}))
        return ExecResult(ok=True, out={
            "handle": space.handle, "path": space.path, "size_bytes": space.size_bytes,
            "quota": space.quota,
        })

    def allocate(self, profile: Profile, size_bytes: int) -> TmpSpace:
        """Create a fresh 0700 space of at most ``size_bytes`` under ``mappings.tmp_dir``."""
        allowed = _allowed_size(profile, self.options.max_bytes)
        if size_bytes > allowed:
            raise PolicyEngineError(ErrorCode.CAPABILITY_BLOCKED,
                                    f"tmp space of {size_bytes} bytes exceeds {allowed}")
        base = profile.mappings.tmp_dir
        _ensure_base(base)
        handle = "tmp-" + secrets.token_hex(8)
        path = os.path.join(base, handle)
        os.mkdir(path, 0o700)  # fails if the name exists: never reuse someone else's dir
        quota: Literal["tmpfs", "accounting"] = "accounting"
        if self.options.quota != "accounting":
            rc = mount_tmpfs(path, size_bytes)
            if rc == 0:
                quota = "tmpfs"
            elif self.options.quota == "tmpfs":
                os.rmdir(path)
                raise PolicyEngineError(ErrorCode.PROVIDER_UNAVAILABLE,
                                        "tmpfs quota requested but mount is not permitted",
                                        audit={"errno": rc})
        space = TmpSpace(handle, path, page_round(size_bytes) if quota == "tmpfs" else size_bytes,
                         quota)
        with self._lock:
            self._spaces[handle] = space
        return space

    def _get(self, handle: str) -> TmpSpace:
        with self._lock:
            space = self._spaces.get(handle)
        if space is None:
            raise PolicyEngineError(ErrorCode.CAPABILITY_BLOCKED, f"unknown tmp handle `{handle}`")
        return space

    def usage(self, handle: str) -> int:
        """Bytes currently allocated in the space (the accounting mode's measure)."""
        return disk_usage(self._get(handle).path)

    def check(self, handle: str) -> int:
        """Explicit accounting: raise ``QUOTA.BUDGET_EXCEEDED`` when a space is over quota."""
        space = self._get(handle)
        used = disk_usage(space.path)
        if used > space.size_bytes:
            raise PolicyEngineError(ErrorCode.BUDGET_EXCEEDED,
                                    f"tmp space `{handle}` uses {used} of {space.size_bytes} bytes")
        return used

    def release(self, handle: str) -> dict[str, Any]:
        """Unmount (tmpfs) and delete the space; returns its final usage."""
        with self._lock:
            space = self._spaces.pop(handle, None)
        if space is None:
            raise PolicyEngineError(ErrorCode.CAPABILITY_BLOCKED, f"unknown tmp handle `{handle}`")
        used = disk_usage(space.path)
        try:
            if space.quota == "tmpfs":
                unmount(space.path)
            remove_tree(space.path)
        except OSError as err:
            raise PolicyEngineError(
                ErrorCode.EXECUTION_FAILED, f"cannot release tmp space `{handle}`: {err.strerror}",
            ) from None
        return {"handle": handle, "used_bytes": used, "over_quota": used > space.size_bytes}

    def handles(self) -> list[str]:
        with self._lock:
            return list(self._spaces)

    def close(self) -> None:
        """Release every space still allocated; best effort so one failure cannot strand others."""
        for handle in self.handles():
            try:
                self.release(handle)
            except PolicyEngineError:
                continue
        atexit.unregister(self._atexit)
