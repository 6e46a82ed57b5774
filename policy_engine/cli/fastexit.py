"""Ending a read-only command (explain, check) without the interpreter's teardown.

Freeing every module, pydantic validator and compiled pattern at exit costs ≈ 25 ms of the
≈ 200 ms a cold `explain` takes; a one-shot command that holds no resource has nothing to clean
up. The shortcut is taken only when all of these hold, else the normal exit runs:

- the command asked for it (:func:`request`): it writes nothing but stdout/stderr;
- no ``atexit`` handler was registered since :func:`baseline` (a plugin's cleanup, logging's
  flush: anything that registered one needs it to run);
- no other thread is alive (one could still be writing);
- stdout and stderr flush without error (a closed pipe takes the normal path and its message);
- ``POLICY_ENGINE_FAST_EXIT`` is not ``0``.

Only the console entry point (``main``) calls :func:`exit_if_safe`: a command invoked in-process
(click's test runner, an embedding program) always returns normally.
"""

from __future__ import annotations

import atexit
import os
import sys
import threading

_requested = False


def request() -> None:
    """Called by a command that holds no resource: it may end without interpreter teardown."""
    global _requested
    _requested = True


def baseline() -> int:
    """The number of ``atexit`` handlers before the command runs."""
    return atexit._ncallbacks()


def safe(handlers_before: int) -> bool:
    """Whether ending the process now skips nothing but freeing memory."""
    return (_requested and os.environ.get("POLICY_ENGINE_FAST_EXIT", "1") != "0"
            and atexit._ncallbacks() == handlers_before and threading.active_count() == 1)


def exit_if_safe(code: object, handlers_before: int) -> None:
    """``os._exit(code)`` after flushing stdout/stderr when :func:`safe`; else return."""
    if not (code is None or isinstance(code, int)) or not safe(handlers_before):
        return
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except (OSError, ValueError):
        return
    os._exit(code or 0)
