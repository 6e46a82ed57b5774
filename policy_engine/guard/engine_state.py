"""The engine's own state directory, refused to every guarded op (``builtin:engine-state``).

The state directory holds the evidence log and its HMAC key, the token database, budgets,
revocations and spools: a policy permitting "the project" (``/p/**``) that holds ``./var``
would otherwise hand the agent the key that makes its evidence digests, the tokens of every
tenant, and the log that records what it did (outsider attack 36). Like the mandatory secrets
(``builtin:mandatory-secrets``), no policy, grant or override lifts this deny, and it answers
``SANDBOX.CAPABILITY_BLOCKED`` as they do.

The exceptions are the workspaces the engine keeps there by default, where calls are meant to
act: ``<state_dir>/run_code/`` (the session runtime's, ``gateway/sessions.py``) and
``<state_dir>/workspace/`` (``serve`` and ``mcp``'s exec and session workspaces,
``cli/serve.py``). Only paths strictly beneath them are open, not the directories themselves.
A workspace configured elsewhere inside the state directory (``--workspace STATE/other``) is
refused like the rest of it: keep workspaces at their default names or outside.

The same rule keeps the engine's other trees from the agent (outsider attack 38): an ``fs``
op is performed by the engine itself, as the engine's uid, so a file it writes for the agent
passes every "only this user wrote it" check the engine makes of its own files. Refused to
every guarded op: the engine's cache directory (``enginedirs.engine_cache_dir``: the parser's
tables, a pickle the next command loads; the stored mask walks a one-call command trusts; the
native launcher). Refused to ``fs.write``: the trees a proc sandbox may never write either
(``enginedirs.protected_trees``: the launcher cache, the engine's configuration directory,
login hooks, the engine's code and the Python it runs from).

The fact is the engine's, never a document's: the orchestrator builds its guard with
``config.state_dir`` (``Guard(state_dir=...)``), so the run, ``/v1/decide`` and ``explain
--config`` decide on the same guard or one built the same way; the other trees are read from
the engine process's environment (``HOME``, ``XDG_CACHE_HOME``, ``XDG_CONFIG_HOME``,
``POLICY_ENGINE_STATE``) when the guard is made, as the proc executor reads them.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from policy_engine.guard.paths import quote
from policy_engine.model import RuleRef
from policy_engine.sandbox import enginedirs

ENGINE_STATE_ID = "builtin:engine-state"
ENGINE_STATE_RULE = RuleRef(id=ENGINE_STATE_ID, file="<builtin>", line=0, column=0)
WORKSPACES = ("run_code", "workspace")
"""The default workspace directories beneath the state dir (module doc)."""


class EngineState:
    """Which resolved paths lie in the engine's state directory, less the session workspaces.

    The directory is known by its absolute spelling and by its real path (a state dir given
    through a symlink): the guard compares resolved paths, and the path as the op wrote it.
    """

    __slots__ = ("roots", "prefixes", "open", "trees", "write_trees")

    def __init__(self, state_dir: str | os.PathLike[str],
                 env: Mapping[str, str] | None = None) -> None:
        spelt = os.path.normpath(os.path.abspath(os.fspath(state_dir)))
        self.roots: tuple[str, ...] = tuple(dict.fromkeys((spelt, os.path.realpath(spelt))))
        self.prefixes = tuple(r.rstrip("/") + "/" for r in self.roots)
        self.open = tuple(f"{p}{w}/" for p in self.prefixes for w in WORKSPACES)
        env = os.environ if env is None else env
        cache = "the engine's cache (its parser tables, stored mask walks, native launcher)"
        self.trees = _Trees([(enginedirs.engine_cache_dir(env), cache)])
        self.write_trees = _Trees(enginedirs.protected_trees(env, realpath=_spelt))

    def covers(self, path: str) -> bool:
        """Whether ``path`` (absolute, normalized) is the state dir or beneath it, and not
        beneath one of its workspace directories."""
        # one C-level ``startswith`` over the tuples: this runs on every fs decision of the engine
        if path.startswith(self.prefixes) or path in self.roots:
            return not path.startswith(self.open)
        return False

    def reason(self, what: str, path: str) -> str:
        """The public reason of a refusal of ``path`` (``what``: the op's field)."""
        return (f"{what} {quote(path)} is in the engine's state directory (evidence, keys, "
                f"tokens), which no policy opens (`{ENGINE_STATE_ID}`)")

    def tree(self, path: str, *, write: bool) -> str | None:
        """Which engine tree ``path`` (absolute, normalized) is or lies in, or ``None``: the
        cache for every op, the trees of ``protected_trees`` for a write too."""
        return self.trees.which(path) or (self.write_trees.which(path) if write else None)

    def tree_reason(self, what: str, path: str, tree: str, *, write: bool) -> str:
        """The public reason of a refusal of ``path`` in an engine tree (``tree``: which)."""
        act = "writes to" if write else "opens"
        return (f"{what} {quote(path)} is in {tree}, which no policy {act}: the engine "
                f"would load or run what an agent left there (`{ENGINE_STATE_ID}`)")


class _Trees:
    """Trees, each by its spelling and its real path, and what each is (for the reason)."""

    __slots__ = ("pairs", "roots", "prefixes")

    def __init__(self, trees: list[tuple[str, str]]) -> None:
        self.pairs = tuple((p, w) for t, w in trees
                           for p in dict.fromkeys((t, os.path.realpath(t))))
        self.roots = frozenset(r for r, _ in self.pairs)
        self.prefixes = tuple(r.rstrip("/") + "/" for r, _ in self.pairs)

    def which(self, path: str) -> str | None:
        # one C-level ``startswith`` over the tuple first: this runs on every fs decision
        if not path.startswith(self.prefixes) and path not in self.roots:
            return None
        return next(w for r, w in self.pairs
                    if path == r or path.startswith(r.rstrip("/") + "/"))


def _spelt(path: str) -> str:
    """``protected_trees``' paths as spelt (``EngineState`` adds the resolved spelling)."""
    return os.path.normpath(os.path.abspath(path))
