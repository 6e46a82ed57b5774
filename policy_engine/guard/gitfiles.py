"""Built-in refusal: an fs.write that would let git run a program of the writer's choosing.

A permit for `git status` plus a workspace fs.write permit is code execution: git runs the
program named by the repository's ``core.fsmonitor`` (and its hooks, filters, diff drivers…)
on the next `git status`. So a write to git's control files — the repository configuration
(``config``, ``config.worktree``), the files that move it elsewhere (``commondir``, ``gitdir``,
a ``.git`` file), and anything under ``hooks/`` — of any repository, worktree or submodule (any
path with a ``.git`` segment before them) is refused unless the permitting rule names a ``.git``
path itself (``/workspace/repo/.git/config``, ``**/.git/**``): a broad ``/workspace/**`` is not
read as consent to that. The guard decides it, so `explain` answers as the run does. Git run
inside a sandbox is further pinned by the executors (``GIT_PINS``: no system or global config,
no fsmonitor, no hooks, no implicit bare repository).
"""

from __future__ import annotations

from collections.abc import Iterable

from policy_engine.guard.matchers import FsMatcher

_CONFIG_NAMES = frozenset({"config", "config.worktree", "commondir", "gitdir"})

GIT_PINS: dict[str, str] = {
    "GIT_CONFIG_NOSYSTEM": "1",
    "GIT_CONFIG_GLOBAL": "/dev/null",  # also keeps $HOME/.gitconfig and XDG's out
    # the oldest `-c` form every git parses; the highest-precedence configuration
    "GIT_CONFIG_PARAMETERS": "'core.fsmonitor=false' 'core.hookspath=/dev/null' "
                             "'safe.barerepository=explicit'",
}
"""Environment every sandboxed proc.exec gets (a policy naming one of these names exactly in
its ``env`` list lets the call replace it, as with any hijack variable)."""


def git_control_file(path: str) -> str | None:
    """The part of ``path`` from its ``.git`` segment on, when a write there could make git run
    a program (see the module docstring); ``None`` otherwise."""
    if ".git" not in path:
        return None  # the common case: one substring test
    parts = path.split("/")
    try:
        at = parts.index(".git")
    except ValueError:
        return None
    rest = parts[at + 1:]
    if rest and rest[0] in ("objects", "refs", "logs"):
        return None  # data git reads, never runs (a branch may well be called `hooks`)
    if not rest or rest[-1] in _CONFIG_NAMES or "hooks" in rest:
        return "/".join(parts[at:])
    return None


def names_git(members: Iterable[object]) -> bool:
    """Whether a capability's fs patterns name a ``.git`` path explicitly."""
    return any(".git" in p.split("/") for m in members if isinstance(m, FsMatcher)
               for p in m.paths)


def refusal(path: str, members: Iterable[object]) -> str | None:
    """Why an fs.write of ``path`` under a capability of ``members`` is refused, or ``None``."""
    part = git_control_file(path)
    if part is None or names_git(members):
        return None
    return (f"write to `{path}` is refused: git runs programs named in `{part}` (core.fsmonitor, "
            "hooks, filters); a permit must name the `.git` path itself to allow it")
