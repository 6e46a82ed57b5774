"""Ending a read-only command (explain, check) without the interpreter's teardown.

Freeing every module, pydantic validator and compiled pattern at exit costs ≈ 25 ms of the
≈ 200 ms a cold `explain` takes; a one-shot command that holds no resource has nothing to clean
up but what ``atexit`` handlers do. So when the command asked for it (:func:`request`: it
writes nothing but stdout/stderr), no other thread is alive, no profiler or tracer is installed
and ``POLICY_ENGINE_FAST_EXIT`` is not ``0``, the exit runs every ``atexit`` handler (a
wrapper's, a plugin's, logging's flush: exactly what the normal exit runs), flushes stdout and
stderr and ends the process without freeing memory. A flush error (a closed pipe) takes the
normal path and its message.

Only the console entry point (``main``) calls :func:`exit_if_safe`, so click's test runner gets
its result as before; a program calling ``main()`` itself and expecting it to return (rather
than end the process, as a console script does) sets ``POLICY_ENGINE_FAST_EXIT=0``.
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


def safe() -> bool:
    """Whether ending the process after the ``atexit`` handlers skips nothing but freeing
    memory."""
    # a profiler, tracer or coverage tool (sys.setprofile/settrace) reports after the program
    # returns, not from an atexit handler: let it
    return (_requested and os.environ.get("POLICY_ENGINE_FAST_EXIT", "1") != "0"
            and threading.active_count() == 1
            and sys.getprofile() is None and sys.gettrace() is None)


def exit_if_safe(code: object) -> None:
    """Run the ``atexit`` handlers, flush and ``os._exit(code)`` when :func:`safe`; else
    return (the normal exit follows)."""
    if not (code is None or isinstance(code, int)) or not safe():
        return
    atexit._run_exitfuncs()  # runs each once and forgets it: the normal exit will not repeat
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except (OSError, ValueError):
        return
    os._exit(code or 0)
