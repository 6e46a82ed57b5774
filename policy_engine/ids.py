"""Envelope ids: random version-4 UUIDs in hex, from a pooled read of the kernel's randomness.

``uuid.uuid4().hex`` asks the kernel for 16 bytes (a ``getrandom`` system call) and builds a
``UUID`` object for every call (≈ 2 µs; docs/benchmarks.md "Thirteenth pass"). Here 4 KiB are
read at a time and each id takes the next 16 bytes, with the version and variant bits set as
``uuid4`` sets them: the same format, from the same source. A forked child drops the pool it
inherited (``os.register_at_fork``), so it never hands out its parent's next ids.
"""

from __future__ import annotations

import os
import threading

_POOL_BYTES = 4096
_lock = threading.Lock()
_pool = b""
_at = 0


def _forked() -> None:
    global _lock, _pool, _at
    _lock, _pool, _at = threading.Lock(), b"", 0  # the parent's lock may have been held


os.register_at_fork(after_in_child=_forked)


def envelope_id() -> str:
    """32 hex digits: ``uuid.uuid4().hex``'s form (version 4, RFC 4122 variant)."""
    global _pool, _at
    with _lock:
        if _at + 16 > len(_pool):
            _pool, _at = os.urandom(_POOL_BYTES), 0
        raw = bytearray(_pool[_at:_at + 16])
        _at += 16
    raw[6] = (raw[6] & 0x0F) | 0x40
    raw[8] = (raw[8] & 0x3F) | 0x80
    return raw.hex()
