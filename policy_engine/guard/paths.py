"""File paths on resolved values: lexical normalization and symlink resolution beneath a root.

The guard and the fs executors share these so a path is judged exactly as it will be opened.
Normalization is purely lexical and refuses what could be read two ways (NUL, ``..``, relative
paths); :func:`resolve_beneath` then follows symlinks one component at a time with ``lstat`` and
``readlink`` and refuses any link whose target leaves the root, after one ``openat2`` probe
(``guard.nofollow``) has confirmed most paths hold no link at all. The executor still opens with
no-follow semantics: a check here cannot stop a link swapped in after it (TOCTOU).
"""

from __future__ import annotations

import os
import stat

from policy_engine.errors import ErrorCode, PolicyEngineError
from policy_engine.guard.nofollow import UNKNOWN, probe

MAX_SYMLINKS = 40
"""Same bound as Linux ``ELOOP``: a longer chain is refused rather than followed."""


def path_blocked(reason: str, path: str) -> PolicyEngineError:
    """The refusal of a path the guard cannot judge as written (``CAPABILITY_BLOCKED``)."""
    return PolicyEngineError(ErrorCode.CAPABILITY_BLOCKED, reason, audit={"path": path})


def quote(value: str, limit: int = 200) -> str:
    """User input for a public reason: in backticks, without backticks or control characters."""
    if len(value) <= limit and "`" not in value and value.isprintable():
        return f"`{value}`"  # the common case: nothing to replace or cut
    clean = "".join(c if c.isprintable() and c != "`" else "?" for c in value[:limit])
    return f"`{clean}{'…' if len(value) > limit else ''}`"


def normalize_path(path: str) -> str:
    """Return the absolute, normalized form of ``path``.

    ``//`` and ``.`` segments collapse and a trailing ``/`` is dropped. NUL bytes, ``..``
    segments and relative paths are refused (``SANDBOX.CAPABILITY_BLOCKED``, "path traversal"):
    resolving them lexically could disagree with what the kernel opens through a symlink.
    """
    # INVARIANT: the fast path returns only absolute strings with no NUL and no empty, `.` or
    # `..` segment; a dot-file (`/.env`) stays on it. Every fs decision runs it: operators, no
    # method or isinstance call, ≈ 1/3 cheaper than the checks below (a normal path) and ≈ 2/5
    # (a dot-file); benchmarks/bench_guard_ab.py. The guard's ``stages.resolve`` spells it out
    # too (tests/unit/test_guard_paths.py keeps the two equal).
    if type(path) is str and path[:1] == "/" and "//" not in path and "\x00" not in path and \
            ("/." not in path or ("/./" not in path and "/../" not in path and
                                  path[-2:] != "/." and path[-3:] != "/..")) and \
            (path[-1] != "/" or len(path) == 1):
        return path
    why = path_refusal(path)
    if why is not None:
        raise path_blocked(why, path if isinstance(path, str) else repr(path))
    return collapse(path)


def collapse(path: str) -> str:
    """:func:`normalize_path` of a path :func:`path_refusal` accepts: empty and ``.`` segments
    dropped, and with them a trailing ``/``."""
    return "/" + "/".join([seg for seg in path.split("/") if seg and seg != "."])


def path_refusal(path: object) -> str | None:
    """Why :func:`normalize_path` refuses ``path`` (its reason, ``SANDBOX.CAPABILITY_BLOCKED``),
    or ``None`` when it accepts it: the guard's fs step refuses an untraced call with it
    without raising (an exception through the guard's frames costs ≈ 3 µs)."""
    if not isinstance(path, str):
        return "path traversal: path is not a string"
    if "\x00" in path:
        return "path traversal: path contains a NUL byte"
    if not path.startswith("/"):
        return f"path traversal: relative path {quote(path)} is not accepted"
    if ".." in path.split("/"):
        return f"path traversal: {quote(path)} contains a `..` segment"
    return None


def is_beneath(root: str, path: str) -> bool:
    """Whether normalized ``path`` is ``root`` or inside it, on a segment boundary."""
    if root == "/":
        return True
    return path == root or (path.startswith(root) and path[len(root)] == "/")


def resolve_beneath(root: str, path: str) -> str:
    """Resolve every symlink in ``path`` without leaving ``root``; return the resolved path.

    ``root`` itself is trusted (the operator configured it); only what lies beneath it is
    walked. Components that do not exist end the walk: nothing below them can be a link yet.

    :raises PolicyEngineError: ``CAPABILITY_BLOCKED`` when ``path`` is outside ``root``, a link
        target leaves ``root``, or the chain is longer than :data:`MAX_SYMLINKS`.
    """
    return resolve_normalized(normalize_path(root), normalize_path(path))


def resolve_normalized(root: str, path: str) -> str:
    """:func:`resolve_beneath` for a root and path already through :func:`normalize_path`."""
    if not is_beneath(root, path):
        raise path_blocked(f"path {quote(path)} is outside the root {quote(root)}", path)
    return resolve_within(root, path)


def resolve_within(root: str, path: str, *, probed: bool = False) -> str:
    """:func:`resolve_normalized` for a ``path`` the caller knows is beneath ``root`` (the
    guard picks the root that contains it: one containment test less per decision).

    :param probed: the caller's own probe of ``path`` said :data:`~nofollow.UNKNOWN` (walk).
    """
    base = "" if root == "/" else root
    i, n = len(base), len(path)
    # Two or more components below the root: one openat2 answers for all of them when none is
    # a link (nofollow.py); a single component costs one lstat below, which is cheaper.
    if not probed and path.find("/", i + 1) != -1 and probe(path)[0] != UNKNOWN:
        return path
    # Fast loop while no symlink has been seen: the path itself is the answer so far, and
    # the walk costs one lstat per existing component below the root.
    lstat, islnk = os.lstat, stat.S_ISLNK
    while i < n:
        j = path.find("/", i + 1)
        if j == -1:
            j = n
        try:
            mode = lstat(path[:j]).st_mode
        except (FileNotFoundError, NotADirectoryError):
            # nothing below a missing component or a file can exist, nor be a link yet (a
            # refusal below a file told a caller which hidden files exist: attack 35, F3)
            return path
        except OSError as exc:  # EACCES, ELOOP: refuse rather than guess
            raise path_blocked(f"path {quote(path)} cannot be resolved", path) from exc
        if islnk(mode):
            return _walk(root, path)
        i = j
    return path


def _walk(root: str, path: str) -> str:
    """The general walk, entered at the first symlink: a stack of components still to visit."""
    rest = [s for s in path[len(root):].split("/") if s]
    rest.reverse()  # a stack: the next component to visit is at the end
    done: list[str] = []
    base = root.rstrip("/")
    links = 0
    while rest:
        seg = rest.pop()
        if seg == ".":
            continue
        if seg == "..":
            if not done:
                if root == "/":  # `..` at `/` stays at `/`, as in the kernel
                    continue
                raise path_blocked(f"symlink in {quote(path)} leaves the root", path)
            done.pop()
            continue
        current = base + "/" + "/".join([*done, seg])
        try:
            st = os.lstat(current)
        except (FileNotFoundError, NotADirectoryError):  # nothing below: a lexical rest
            done.append(seg)
            done.extend(s for s in reversed(rest) if s not in ("", "."))
            if ".." in done:
                raise path_blocked(f"symlink in {quote(path)} leaves the root", path) from None
            break
        except OSError as exc:  # EACCES, ELOOP: refuse rather than guess
            raise path_blocked(f"path {quote(path)} cannot be resolved", path) from exc
        if not stat.S_ISLNK(st.st_mode):
            done.append(seg)
            continue
        links += 1
        if links > MAX_SYMLINKS:
            raise path_blocked(f"too many symlinks in {quote(path)}", path)
        try:
            target = os.readlink(current)
        except OSError as exc:
            # swapped between lstat and readlink (EINVAL: no longer a link, ENOENT: gone):
            # what the path means changed under us, so refuse rather than guess
            raise path_blocked(f"path {quote(path)} changed while it was being resolved",
                           path) from exc
        if "\x00" in target or not target:
            raise path_blocked(f"symlink in {quote(path)} is invalid", path)
        parts = [s for s in target.split("/") if s]
        if target.startswith("/"):
            # An absolute target restarts the walk at the root; its leading components must
            # spell the root itself, with no `..` that could climb out first.
            root_parts = [s for s in root.split("/") if s]
            if parts[: len(root_parts)] != root_parts:
                raise path_blocked(f"symlink in {quote(path)} leaves the root", path)
            parts = parts[len(root_parts):]
            done = []
        rest.extend(reversed(parts))
    return base + "/" + "/".join(done) if done else (base or "/")
