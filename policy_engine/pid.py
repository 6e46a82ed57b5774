"""This process's id without a system call: read once, read again in a forked child.

``os.getpid()`` is a system call on every use (glibc stopped caching it); the meter, the rate
windows and the mount table each asked it on every call to notice a fork, eight times per
`/v1/ops` call (issue 27, docs/benchmarks.md "Thirteenth pass"). ``os.register_at_fork`` runs in
every child ``os.fork`` makes (``serve --workers``, multiprocessing's fork), before any Python
code of the child, so the kept value is never the parent's there.
"""

from __future__ import annotations

import os

_pid = os.getpid()


def _forked() -> None:
    global _pid
    _pid = os.getpid()


os.register_at_fork(after_in_child=_forked)


def current() -> int:
    """``os.getpid()``, kept."""
    return _pid
