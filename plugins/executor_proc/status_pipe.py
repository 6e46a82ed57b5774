"""The launchers' status pipe: the isolation each applied, and how the tool ended."""

from __future__ import annotations

import json
import os
from typing import Any


def parse(raw: bytes, expected: int = 1) -> dict[str, Any]:
    """The launcher's status; with a chain (restricted network) each launcher appended one
    object, the tool's launcher last, reported as ``tool_layer``. A chain cut short (the bridge
    could not start the tool) is an error: the tool never ran under its layer. The tool's
    parent (``report_end``) appends how the tool ended, returned as ``tool_end``.
    """
    docs: list[Any] = []
    text, pos, dec = raw.decode(errors="replace"), 0, json.JSONDecoder()
    try:
        while pos < len(text):
            value, pos = dec.raw_decode(text, pos)
            docs.append(value)
    except ValueError:
        return {"error": "launcher status unreadable"}
    if not all(isinstance(d, dict) for d in docs):
        return {"error": "launcher status malformed"}
    errors = [d["error"] for d in docs if "error" in d]
    if errors:
        return {"error": errors[0]}
    ends = [d["tool_end"] for d in docs if "tool_end" in d]
    docs = [d for d in docs if "tool_end" not in d]
    if not docs:
        return {}
    if len(docs) != expected:
        return {"error": "the network bridge did not start the tool's launcher"}
    end = {"tool_end": ends[-1]} if ends else {}
    if expected == 2:  # the tool's layer adds TCP rules only; seccomp is inherited, not re-added
        return {**docs[0], "tool_layer": {"landlock": docs[1].get("landlock", "off")}, **end}
    return {**docs[0], **end}


def end_signal(end: Any, wait_status: int, direct: bool) -> int | None:
    """The signal that ended the tool, 0 when it exited on its own, ``None`` when unknown.

    ``direct``: the engine waited for the tool itself (proc-landlock, local), so its wait
    status says. Else the tool's parent reported it (``tool_end``); without that report (bwrap
    with ``layer2: false``, a parent the tool killed) only a 128 + N code is left.
    """
    if direct:
        return os.WTERMSIG(wait_status) if os.WIFSIGNALED(wait_status) else 0
    if isinstance(end, dict):
        for key, killed in (("signal", True), ("exit", False)):
            value = end.get(key)
            if isinstance(value, int) and not isinstance(value, bool):
                return value if killed else 0
    return None
