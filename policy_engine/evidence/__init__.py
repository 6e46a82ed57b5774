"""Evidence: the sink protocol, the spool-and-retry wrapper and digest helpers."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from policy_engine.lazy import lazy_exports

if TYPE_CHECKING:
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

# Imported on first use (PEP 562): `explain` needs `redacted_op` and must not pay for the spool
# (and `logging`) it never writes to.
_WHERE: dict[str, str] = {
    "decision_fields": "decided",
    **dict.fromkeys(("EMPTY_DIGEST", "allowing_template", "canonical_json", "capability_string",
                     "digest_json", "inputs_digest", "redacted_op", "request_summary"), "digest"),
    **dict.fromkeys(("load_or_create_key", "redact_audit", "redact_text", "redact_url",
                     "summarize_args"), "redact"),
    "EvidenceSink": "sink",
    "SpoolingSink": "spool",
}

__all__ = [
    "EMPTY_DIGEST", "EvidenceSink", "SpoolingSink", "allowing_template", "canonical_json",
    "capability_string", "decision_fields",
    "digest_json", "inputs_digest", "load_or_create_key", "redact_audit", "redact_text",
    "redact_url", "redacted_op", "request_summary", "summarize_args",
]


_get, _listing = lazy_exports(__name__, _WHERE, __all__)


def __getattr__(name: str) -> Any:
    return _get(name)


def __dir__() -> list[str]:
    return _listing()
