"""fs.list as a bounded stream: per-entry guard checks, a deadline per entry, at most N+1 kept."""

from __future__ import annotations

import os
import stat
import time
from collections.abc import Callable
from typing import Any

from policy_engine import ErrorCode, PolicyEngineError
from policy_engine.executor import Decider, ExecContext
from policy_engine.model import Decision, ExecOp, FsListOp, FsReadOp, Profile
from policy_engine.patterns.paths import PathGlob

# Denials that mean "this entry may not be read or listed" rather than "no rule grants it":
# a forbid (mandatory or not), a symlink leaving the root, an unresolvable path. Codes like
# PERMISSION_DENY/DENY_TOOL only say no permit admitted the op.
_NOT_GRANTED = frozenset({ErrorCode.PERMISSION_DENY.value, ErrorCode.DENY_TOOL.value})


def check_time(ctx: ExecContext) -> None:
    """Raise ``TIMEOUT`` once the call was cancelled or its deadline passed."""
    if ctx.cancel.cancelled:
        raise PolicyEngineError(ErrorCode.TIMEOUT, ctx.cancel.reason or "cancelled")
    if time.monotonic() > ctx.deadline:
        raise PolicyEngineError(ErrorCode.TIMEOUT, "file operation exceeded its deadline")


def mandatory_denied(profile: Profile, normalized: str) -> str | None:
    """The id of a mandatory deny whose path glob matches ``normalized``, or ``None``."""
    for deny in profile.denies:
        paths = getattr(deny.capability, "paths", ())
        if deny.mandatory and any(
                PathGlob.of(p, profile.mappings.home).matches(normalized) for p in paths):
            return deny.rule.id
    return None


class EntryFilter:
    """Whether a listed entry may be shown: what could not be read or listed directly is hidden.

    With the call's guard (``ctx.guard``, always set by the orchestrator) an entry is shown only
    when fs.read or fs.list of it would be allowed and neither is refused by a forbid or a
    blocked path; without a guard (an executor driven directly) the profile's mandatory denies
    are applied, the executor's usual second line.
    """

    def __init__(self, ctx: ExecContext) -> None:
        self.profile = ctx.profile
        # the policy's answer for each name, not the disk's: a directory is not "unreadable"
        # because fs.read refuses a directory (Guard.policy_only)
        policy_only = getattr(ctx.guard, "policy_only", None)
        self.guard: Decider | None = policy_only() if callable(policy_only) else ctx.guard

    def _decide(self, op: ExecOp) -> Decision:
        assert self.guard is not None
        return self.guard.decide(self.profile, op)

    def shown(self, path: str) -> bool:
        if mandatory_denied(self.profile, path) is not None:
            return False
        if self.guard is None:
            return True
        read = self._decide(FsReadOp(path=path))
        if not read.allowed and read.code not in _NOT_GRANTED:
            return False
        listed = self._decide(FsListOp(path=path, depth=1))
        if not listed.allowed and listed.code not in _NOT_GRANTED:
            return False
        return read.allowed or listed.allowed


def _kind(mode: int) -> str:
    if stat.S_ISDIR(mode):
        return "dir"
    if stat.S_ISREG(mode):
        return "file"
    return "symlink" if stat.S_ISLNK(mode) else "other"


class Lister:
    """Depth-first listing that never holds more than ``max_files + 1`` entries per directory.

    ``os.scandir`` streams the directory; the deadline is checked for every entry read, and
    reading stops once one more entry than the call may still return has been kept, so a
    directory of 300,000 names costs neither the time nor the memory of reading it all. The
    kept entries of one directory are sorted (stable output when nothing is cut off); when the
    listing is truncated, which names made it in follows the directory's own order.
    """

    def __init__(self, ctx: ExecContext, base: str, max_files: int,
                 shown: Callable[[str], bool]) -> None:
        self.ctx = ctx
        self.base = base.rstrip("/")
        self.max_files = max_files
        self.shown = shown
        self.out: list[dict[str, Any]] = []

    def walk(self, fd: int, prefix: str, depth: int) -> bool:
        """List ``fd`` (owned and closed here); return whether the listing was cut short."""
        try:
            if depth <= 0:
                return False
            room = self.max_files - len(self.out)
            kept: list[tuple[str, os.stat_result]] = []
            with os.scandir(fd) as it:
                for entry in it:
                    check_time(self.ctx)
                    rel = f"{prefix}{entry.name}"
                    if not self.shown(f"{self.base}/{rel}"):
                        continue
                    try:
                        st = entry.stat(follow_symlinks=False)
                    except OSError:
                        continue  # removed meanwhile
                    kept.append((entry.name, st))
                    if len(kept) > room:
                        break
            kept.sort(key=lambda item: item[0])
            for name, st in kept:
                if len(self.out) >= self.max_files:
                    return True
                kind = _kind(st.st_mode)
                rel = f"{prefix}{name}"
                self.out.append({"path": rel, "type": kind, "size": st.st_size})
                if kind == "dir" and depth > 1:
                    try:
                        sub = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW
                                      | os.O_CLOEXEC, dir_fd=fd)
                    except OSError:
                        continue  # swapped for a symlink or removed meanwhile: not followed
                    if self.walk(sub, rel + "/", depth - 1):
                        return True
            return False
        finally:
            os.close(fd)
