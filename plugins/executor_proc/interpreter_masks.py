"""What of a proc interpreter's sandbox plan its mount namespace keeps for its life (the masks,
the read-only islands, where each bind resolved): compared before each stateful call with the
plan its plain twin gets now (attack 35, F1; docs/sessions.md "Masks")."""

from __future__ import annotations

from pathlib import Path

from plugins.executor_proc.spec import Plan
from policy_engine.model import ProcExecOp

SERVER_SOURCE = (Path(__file__).parent / "interpreter_server.py").read_text()


def server_op(op: ProcExecOp) -> ProcExecOp:
    """``op`` (the decided call) with the server as its code: what the interpreter runs."""
    return op.model_copy(update={"args": ("-c", SERVER_SOURCE), "stdin_b64": None})


MaskKey = frozenset[tuple[str, str]]


def mask_key(plan: Plan) -> MaskKey:
    """What of ``plan`` shapes the namespace beyond the profile (already the session's key,
    ``sandbox_key``): the masked files and directories, the read-only islands in the writable
    binds, and where each bind resolved to."""
    return frozenset({*(("mask", p) for p in plan.mask_files),
                      *(("mask-dir", p) for p in plan.mask_dirs),
                      *(("hidden", p) for p in plan.hidden_dirs),
                      *(("readonly", p) for p in plan.readonly),
                      *(("bind", f"{k}\0{v}") for k, v in plan.resolved.items())})


def changed(before: MaskKey, now: MaskKey) -> str | None:
    """Counts only (the paths are secrets' names): ``None`` when equal."""
    if before == now:
        return None
    more, fewer = now - before, before - now
    masks = sum(1 for kind, _ in more if kind != "bind")
    gone = sum(1 for kind, _ in fewer if kind != "bind")
    binds = sum(1 for kind, _ in more | fewer if kind == "bind")
    return ", ".join(part for part in (
        f"{masks} path(s) masked now" if masks else "",
        f"{gone} mask(s) gone" if gone else "",
        "a bind resolves elsewhere" if binds else "") if part)
