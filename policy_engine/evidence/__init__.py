"""Evidence: the sink protocol, the spool-and-retry wrapper and digest helpers."""

from policy_engine.evidence.decided import decision_fields
from policy_engine.evidence.digest import (
    EMPTY_DIGEST,
    allowing_template,
    canonical_json,
    capability_string,
    digest_json,
    inputs_digest,
    redacted_op,
    request_summary,
)
from policy_engine.evidence.redact import (
    load_or_create_key,
    redact_audit,
    redact_text,
    redact_url,
    summarize_args,
)
from policy_engine.evidence.sink import EvidenceSink
from policy_engine.evidence.spool import SpoolingSink

__all__ = [
    "EMPTY_DIGEST", "EvidenceSink", "SpoolingSink", "allowing_template", "canonical_json",
    "capability_string", "decision_fields",
    "digest_json", "inputs_digest", "load_or_create_key", "redact_audit", "redact_text",
    "redact_url", "redacted_op", "request_summary", "summarize_args",
]
