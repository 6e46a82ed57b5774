"""Where the guard's file facts come from when they must not be the deciding host's disk.

A decision reads facts beyond the policy, grant, manifest and op: whether a path exists, is a
link (and to where), is a regular file and how large, whether a ``cwd`` exists. By default the
guard reads them on the host, which is the view of the executor that runs fs ops (``fs``: host
paths). A process's ``cwd`` is a fact of the executor that runs it (the bind view of bubblewrap,
the container's filesystem for Docker, the host for ``local``) and is answered by that
executor's ``refusal`` (the backend selection asks it in the run and in ``explain --config``).

A :class:`FactSource` replaces the host disk for callers that must decide the same on every
machine (``policy-engine test``, a request declaring ``facts``):

- :data:`UNKNOWN_FACTS`: nothing is known. A path is decided as written (no link followed),
  its kind, size and existence refuse nothing, a ``cwd`` refuses nothing.
- :class:`DeclaredFacts`: paths declared with their kind (``file``/``dir``/``symlink``/``absent``/
  ``other``/``unreadable``), size and link target, or a fixture directory standing for
  ``root_fs``; a path declared nowhere is unknown, as above.

An unreadable fact (``unreadable``, or a fixture entry the engine may not ``lstat``) is a deny
with its own reason, never an allow.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Final, Literal

from policy_engine.errors import ErrorCode, PolicyEngineError
from policy_engine.guard.paths import is_beneath, normalize_path, quote

UNKNOWN: Final = "unknown"
"""``seen`` for a path whose facts are unknown: ``fsfacts.fs_refusal`` refuses nothing for it."""
MAX_LINKS: Final = 40  # as the kernel's ELOOP bound

Kind = Literal["file", "dir", "symlink", "absent", "other", "unreadable"]
_MODE: Final[dict[str, int]] = {"file": stat.S_IFREG | 0o644, "dir": stat.S_IFDIR | 0o755,
                                "other": stat.S_IFIFO | 0o644}


@dataclass(frozen=True, slots=True)
class PathFact:
    """What a request or test declares of one path."""

    kind: Kind
    size: int = 0
    target: str | None = None  # a symlink's target (absolute, or relative to its directory)


def fact_unreadable(path: str, why: str) -> PolicyEngineError:
    """The deny for a fact that cannot be read: never decided as if it were absent."""
    return PolicyEngineError(ErrorCode.CAPABILITY_BLOCKED,
                             f"the facts of {quote(path)} cannot be read ({why}): refused",
                             audit={"path": path})


@dataclass(frozen=True, slots=True)
class FactSource:
    """Facts from declarations (``paths``) and a fixture directory standing for ``root_fs``;
    with neither, every fact is unknown.

    :param label: how the trace names the source (``declared``, ``unknown``).
    """

    label: str
    paths: Mapping[str, PathFact] = field(default_factory=dict)
    fixture: str | None = None

    def lookup(self, root_fs: str, path: str) -> PathFact | None:
        """The declared fact of normalized ``path``, the fixture's, or ``None`` (unknown)."""
        got = self.paths.get(path)
        if got is not None or self.fixture is None or not is_beneath(root_fs, path):
            return got
        rel = path[len(root_fs.rstrip("/")):].lstrip("/")
        where = os.path.join(self.fixture, rel) if rel else self.fixture
        try:
            st = os.lstat(where)
        except OSError as exc:
            if exc.errno in (errno.ENOENT, errno.ENOTDIR):
                return PathFact("absent")
            return PathFact("unreadable", target=os.strerror(exc.errno or errno.EIO))
        if stat.S_ISLNK(st.st_mode):
            return PathFact("symlink", target=os.readlink(where))
        if stat.S_ISREG(st.st_mode):
            return PathFact("file", st.st_size)
        return PathFact("dir" if stat.S_ISDIR(st.st_mode) else "other")

    def real(self, root_fs: str, path: str) -> str:
        """``path`` with every declared link on it followed (at most :data:`MAX_LINKS`)."""
        if not self.paths and self.fixture is None:
            return path
        hops = 0
        parts = [p for p in path.split("/") if p]
        done = ""
        while parts:
            done = f"{done}/{parts.pop(0)}"
            fact = self.lookup(root_fs, done)
            if fact is None or fact.kind != "symlink" or not fact.target:
                continue
            hops += 1
            if hops > MAX_LINKS:
                raise PolicyEngineError(ErrorCode.CAPABILITY_BLOCKED,
                                        f"too many symlinks in {quote(path)}")
            target = fact.target if fact.target.startswith("/") else \
                f"{os.path.dirname(done)}/{fact.target}"
            rest = "/".join(parts)
            # a declared target may hold `..`: fold it lexically (the kernel would walk it)
            joined = os.path.normpath(f"{target}/{rest}" if rest else target)
            parts = [p for p in normalize_path(joined).split("/") if p]
            done = ""
        return done or "/"

    def resolve(self, root_fs: str, tmp_dir: str, raw: str
                ) -> tuple[str, tuple[int, int] | str, bool, str | None]:
        """``resolve.resolve_fs`` answered from this source: the resolved path, its facts
        (``Stat``, ``"absent"`` or :data:`UNKNOWN`), whether it lies beneath the fs root or the
        tmp dir, and the path as written when following links changed it.

        :raises PolicyEngineError: for a fact that cannot be read (:func:`fact_unreadable`).
        """
        written = normalize_path(raw)
        path = self.real(root_fs, written)
        inside = is_beneath(root_fs, path) or is_beneath(tmp_dir, path)
        fact = self.lookup(root_fs, path)
        seen: tuple[int, int] | str
        if fact is None or fact.kind == "symlink":
            seen = UNKNOWN
        elif fact.kind == "absent":
            seen = "absent"
        elif fact.kind == "unreadable":
            raise fact_unreadable(path, fact.target or "declared unreadable")
        else:
            seen = (_MODE[fact.kind], fact.size)
        return path, seen, inside, (written if path != written else None)

    def cwd_refusal(self, root_fs: str, cwd: str) -> str | None:
        """Why the declared facts refuse ``cwd`` (absent, or not a directory), else ``None``
        (a directory, or unknown)."""
        path = self.real(root_fs, cwd)
        fact = self.lookup(root_fs, path)
        if fact is None or fact.kind == "dir":
            return None
        if fact.kind == "unreadable":
            raise fact_unreadable(path, fact.target or "declared unreadable")
        what = "does not exist" if fact.kind == "absent" else "is not a directory"
        return f"cwd {quote(cwd)} {what} ({self.label})"

    def describe(self, root_fs: str, path: str) -> str:
        """The trace's words for what this source says of ``path``."""
        fact = self.lookup(root_fs, path)
        if fact is None:
            return f"{quote(path)}: unknown ({self.label}: nothing declared, nothing refused)"
        if fact.kind == "file":
            return f"{quote(path)} is a regular file of {fact.size} bytes ({self.label})"
        if fact.kind == "dir":
            return f"{quote(path)} is a directory ({self.label})"
        return f"{quote(path)} is {fact.kind} ({self.label})"


UNKNOWN_FACTS: Final = FactSource("unknown")
"""Every fact unknown: what ``policy-engine test`` decides on unless a test declares facts."""


def parse_declared(raw: Mapping[str, object], label: str = "declared",
                   fixture: str | None = None) -> FactSource:
    """A :class:`FactSource` from a ``facts:`` mapping (``path: kind`` or ``path: {kind, size,
    target}``). :raises ValueError: for a malformed entry (the loaders locate it)."""
    paths: dict[str, PathFact] = {}
    for key, value in raw.items():
        try:
            path = normalize_path(key)
        except PolicyEngineError as exc:
            raise ValueError(f"fact path `{key[:200]}`: {exc.reason}") from None
        spec: Mapping[str, object] = {"kind": value} if isinstance(value, str) else \
            value if isinstance(value, Mapping) else {}
        kind = spec.get("kind")
        if kind not in ("file", "dir", "symlink", "absent", "other", "unreadable"):
            raise ValueError(f"fact `{path}`: `kind` must be one of file, dir, symlink, absent, "
                             f"other, unreadable (got {kind!r})")
        unknown = set(spec) - {"kind", "size", "target"}
        if unknown:
            raise ValueError(f"fact `{path}`: unknown keys {sorted(unknown)}")
        size = spec.get("size", 0)
        if isinstance(size, bool) or not isinstance(size, int) or size < 0:
            raise ValueError(f"fact `{path}`: `size` must be a non-negative integer")
        target = spec.get("target")
        if (kind == "symlink") != isinstance(target, str) or \
                (isinstance(target, str) and (not target or "\x00" in target)):
            raise ValueError(f"fact `{path}`: a symlink and only a symlink has a `target`")
        paths[path] = PathFact(kind, size, target if isinstance(target, str) else None)
    return FactSource(label, paths, fixture)
