"""The shared head+tail output capture: bounded memory, exact head/tail, digest of everything."""

from __future__ import annotations

import base64
import hashlib

from hypothesis import given
from hypothesis import strategies as st

from policy_engine.capture import TRUNCATION_MARK, HeadTail


@given(limit=st.integers(0, 64), chunks=st.lists(st.binary(max_size=40), max_size=20))
def test_keeps_exactly_head_and_tail_of_the_stream(limit: int, chunks: list[bytes]) -> None:
    cap = HeadTail(limit)
    for chunk in chunks:
        cap.feed(chunk)
    stream = b"".join(chunks)
    head_n = limit - limit // 2
    tail_n = limit // 2
    assert cap.total == len(stream)
    assert cap.truncated == (len(stream) > limit)
    if not cap.truncated:
        assert cap.kept() == stream
    else:
        expected = stream[:head_n] + (stream[-tail_n:] if tail_n else b"")
        assert cap.kept(mark=False) == expected
        dropped = len(stream) - len(expected)
        assert cap.kept() == stream[:head_n] + TRUNCATION_MARK % dropped + (
            stream[-tail_n:] if tail_n else b"")
    digest = cap.digest()
    assert digest.size == len(stream)
    assert digest.b64 == base64.b64encode(hashlib.sha256(stream).digest()).decode()


def test_memory_stays_bounded_by_the_limit() -> None:
    cap = HeadTail(1000)
    for _ in range(10_000):
        cap.feed(b"x" * 997)
    assert len(cap.head) == 500
    assert len(cap.tail()) == 500
    # the tail buffer itself never holds more than the tail plus one chunk
    assert sum(len(c) for c in cap._tail) < 500 + 997
