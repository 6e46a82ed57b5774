"""Evidence: the sink protocol; JSONL and SQLite sinks are plugins."""

from policy_engine.evidence.sink import EvidenceSink

__all__ = ["EvidenceSink"]
