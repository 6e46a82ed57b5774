"""fs.list as a bounded stream: per-entry guard checks, a deadline per entry, at most N+1 kept."""

from __future__ import annotations

import functools
import os
import stat
import time
from collections.abc import Callable
from typing import Any

from policy_engine import ErrorCode, PolicyEngineError
from policy_engine.executor import Decider, ExecContext
from policy_engine.model import Decision, ExecOp, FsListOp, FsReadOp, Profile, ProfileDeny
from policy_engine.model.text import printable_path
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


def printable_name(name: str) -> str | None:
    """``name`` as UTF-8 text when it is not (``model.text.printable_path``: ``\\xff`` escapes,
    as proc results print masked paths); ``None`` when it is UTF-8 already (the common case)."""
    try:
        name.encode("utf-8")
        return None
    except UnicodeEncodeError:
        return printable_path(name)


@functools.lru_cache(maxsize=4096)
def _glob(pattern: str, home: str) -> PathGlob:
    """A deny's compiled glob: built once, not per call (≈ 18 per fs op; issue 27)."""
    return PathGlob.of(pattern, home)


# (id(denies), home, path) -> (denies, answer): the answer depends on the profile's denies and
# home alone, and a profile builder gives every profile the same denies tuple (the policy's),
# so calls under any grant of a policy share it; the entry holds the tuple, so its id is not
# reused while kept
_DENIED: dict[tuple[int, str, str], tuple[tuple[ProfileDeny, ...], str | None]] = {}
_DENIED_MAX = 4096


def mandatory_denied(profile: Profile, normalized: str) -> str | None:
    """The id of a mandatory deny whose path glob matches ``normalized``, or ``None``
    (remembered per denies and path: ≈ 18 glob matches per fs op; issue 27)."""
    denies, home = profile.denies, profile.mappings.home
    key = (id(denies), home, normalized)
    hit = _DENIED.get(key)
    if hit is not None and hit[0] is denies:
        return hit[1]
    found: str | None = None
    for deny in denies:
        paths = getattr(deny.capability, "paths", ())
        if deny.mandatory and any(_glob(p, home).matches(normalized) for p in paths):
            found = deny.rule.id
            break
    if len(_DENIED) >= _DENIED_MAX:
        _DENIED.clear()  # a cache, not a limit
    _DENIED[key] = (denies, found)
    return found


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
        """Whether the entry at ``path`` may be listed; a name that is not UTF-8 is judged both
        as the disk spells it and in its printed form, and hidden when either is refused or
        cannot be judged (fail closed: a listing never shows what the policy might hide)."""
        escaped = printable_name(path)
        if escaped is None:
            return self._shown(path, FsReadOp(path=path), FsListOp(path=path, depth=1))
        try:
            # the op models refuse lone surrogates (they come from JSON): the real name is
            # built unvalidated, as the fs executor's own re-decision of a resolved path is
            raw = self._shown(path, FsReadOp.model_construct(path=path),
                              FsListOp.model_construct(path=path, depth=1))
            return raw and self._shown(escaped, FsReadOp(path=escaped),
                                       FsListOp(path=escaped, depth=1))
        except Exception:  # noqa: BLE001 - an entry that cannot be judged is not shown
            return False

    def _shown(self, path: str, read_op: FsReadOp, list_op: FsListOp) -> bool:
        if mandatory_denied(self.profile, path) is not None:
            return False
        if self.guard is None:
            return True
        read = self._decide(read_op)
        if not read.allowed and read.code not in _NOT_GRANTED:
            return False
        listed = self._decide(list_op)
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
    listing is truncated, which names made it in follows the directory's own order. A path that
    is not UTF-8 is listed in its escaped form (``printable_name``) marked ``not_utf8: true``,
    so it cannot be taken for a real name spelled with backslashes; ``not_utf8`` counts them.
    """

    def __init__(self, ctx: ExecContext, base: str, max_files: int,
                 shown: Callable[[str], bool]) -> None:
        self.ctx = ctx
        self.base = base.rstrip("/")
        self.max_files = max_files
        self.shown = shown
        self.out: list[dict[str, Any]] = []
        self.not_utf8 = 0

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
                escaped = printable_name(rel)
                row: dict[str, Any] = {"path": rel if escaped is None else escaped,
                                       "type": kind, "size": st.st_size}
                if escaped is not None:
                    row["not_utf8"] = True
                    self.not_utf8 += 1
                self.out.append(row)
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
