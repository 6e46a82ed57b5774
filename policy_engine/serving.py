"""Process-wide bounds of the long-running servers (`serve`, `mcp`): how many calls run at once
and how much address space each worker thread reserves.

Under an address-space limit (RLIMIT_AS 1 GiB, a container's) the servers ran out of address
space long before memory: glibc reserves a 64 MiB malloc arena per thread that allocates (up
to 8 per core) besides its 8 MiB stack, and every tool call held an anyio worker thread plus the
orchestrator's deadline thread. ~20 concurrent MCP calls reached 1 GiB at 150 MB RSS and the
server aborted ("can't start new thread"); `serve` stopped answering even `/sandbox/health`.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os

import anyio.to_thread

log = logging.getLogger(__name__)

MAX_CONCURRENT_CALLS = 8
"""Tool calls (and other blocking handlers) running at once; more wait their turn. Each holds
one worker thread and one executor thread; the sandbox itself is another process."""
SERVE_CONCURRENT_CALLS = 16
"""`serve`'s blocking handlers at once (execs, ops, listings, health): more wait their turn."""
IO_THREADS = 2
"""Worker threads kept beside the calls for a transport's own blocking reads and writes (MCP
stdio reads stdin and writes stdout on worker threads): a full house of calls never stalls
the next message."""
MALLOC_ARENAS = 2
"""glibc malloc arenas: threads share them instead of reserving 64 MiB each."""
_M_ARENA_MAX = -8  # glibc's mallopt parameter number


def limit_malloc_arenas(arenas: int = MALLOC_ARENAS) -> bool:
    """Cap glibc's malloc arenas for this process (``MALLOC_ARENA_MAX`` set by the operator
    wins). False where there is no glibc ``mallopt`` (musl, macOS): nothing to cap there."""
    if os.environ.get("MALLOC_ARENA_MAX"):
        return False
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name) if name else None
        mallopt = getattr(libc, "mallopt", None)
    except OSError:
        mallopt = None
    if mallopt is None:
        return False
    return bool(mallopt(_M_ARENA_MAX, arenas))


def bound_worker_threads(calls: int = MAX_CONCURRENT_CALLS, io_threads: int = IO_THREADS) -> int:
    """Bound anyio's default worker-thread limiter of the running event loop (the pool every
    ``to_thread.run_sync`` without a limiter of its own draws from; 40 by default) to
    ``calls + io_threads``. Call from inside the loop. Returns the bound."""
    limiter = anyio.to_thread.current_default_thread_limiter()
    limiter.total_tokens = calls + io_threads
    return calls + io_threads
