"""The EvidenceSink protocol: receives begin/end records (digests and summaries, never content)."""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from policy_engine.model import EvidenceBegin, EvidenceEnd


@runtime_checkable
class EvidenceSink(Protocol):
    """Durable destination for evidence. A raising sink never blocks execution: the orchestrator
    counts the failure, logs it and spools the record for retry.
    """

    name: str

    def begin(self, ev: EvidenceBegin) -> None:
        ...

    def end(self, ev: EvidenceEnd) -> None:
        ...

    def close(self) -> None:
        ...

    # optional: ``pair(begin, end)`` writes both records of one call at once (the orchestrator
    # uses it for calls that ran nothing outside the engine before their end, "one append");
    # a sink without it gets ``begin`` then ``end``
