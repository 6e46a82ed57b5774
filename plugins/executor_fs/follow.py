"""In-root symlinks: the fs executor opens the path the guard decided, its links resolved.

The guard decides on the resolved path (symlinks followed beneath the root), so refusing every
path that crosses a link made ``explain`` allow what the run refused (F6). The executor now
resolves the path the same way, has the call's guard decide the resolved path again (a link may
have changed since the decision), and opens the resolved path with no-follow semantics: a link
swapped in after this point is still refused by ``openat2``/``O_NOFOLLOW``.
"""

from __future__ import annotations

from plugins.executor_fs.listing import printable_name
from policy_engine import ErrorCode, PolicyEngineError
from policy_engine.executor import ExecContext
from policy_engine.guard.paths import quote, resolve_beneath
from policy_engine.model import FsListOp, FsReadOp, FsWriteOp

FsOp = FsReadOp | FsWriteOp | FsListOp


def followed(ctx: ExecContext, op: FsOp) -> str:
    """``op.path`` with its in-root symlinks resolved and the result decided by ``ctx.guard``.

    Without a guard in the context (a caller that is not the orchestrator) the path is returned
    as given, and the no-follow open refuses any link on it, as before.

    :raises PolicyEngineError: the guard's code when it refuses the resolved path.
    """
    if ctx.guard is None:
        return op.path
    try:
        resolved = resolve_beneath(ctx.profile.mappings.root_fs, op.path)
    except PolicyEngineError:
        return op.path  # a link out of the root, `..`, a loop: the no-follow open refuses it
    if resolved == op.path:
        return resolved
    decision = ctx.guard.decide(ctx.profile, op.model_copy(update={"path": resolved}))
    if not decision.allowed:
        raise PolicyEngineError(
            ErrorCode(decision.code or ErrorCode.PERMISSION_DENY),
            f"{quote(op.path)} resolves to {quote(resolved)}: {decision.reason}",
            # a resolved name that is not UTF-8 goes to logs escaped, as listings print it
            audit={"resolved": printable_name(resolved) or resolved})
    return resolved
