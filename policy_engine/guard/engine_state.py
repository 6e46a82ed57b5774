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

The fact is the engine's, never a document's: the orchestrator builds its guard with
``config.state_dir`` (``Guard(state_dir=...)``), so the run, ``/v1/decide`` and ``explain
--config`` decide on the same guard or one built the same way.
"""

from __future__ import annotations

import os

from policy_engine.guard.paths import quote
from policy_engine.model import RuleRef

ENGINE_STATE_ID = "builtin:engine-state"
ENGINE_STATE_RULE = RuleRef(id=ENGINE_STATE_ID, file="<builtin>", line=0, column=0)
WORKSPACES = ("run_code", "workspace")
"""The default workspace directories beneath the state dir (module doc)."""


class EngineState:
    """Which resolved paths lie in the engine's state directory, less the session workspaces.

    The directory is known by its absolute spelling and by its real path (a state dir given
    through a symlink): the guard compares resolved paths, and the path as the op wrote it.
    """

    __slots__ = ("roots", "prefixes", "open")

    def __init__(self, state_dir: str | os.PathLike[str]) -> None:
        spelt = os.path.normpath(os.path.abspath(os.fspath(state_dir)))
        self.roots: tuple[str, ...] = tuple(dict.fromkeys((spelt, os.path.realpath(spelt))))
        self.prefixes = tuple(r.rstrip("/") + "/" for r in self.roots)
        self.open = tuple(f"{p}{w}/" for p in self.prefixes for w in WORKSPACES)

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
