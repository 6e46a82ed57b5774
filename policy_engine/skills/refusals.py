"""Evidence for a call refused before it became an op (its arguments break the tool's input
schema, or its backend cannot serve it): a begin and a denied end, so every call leaves
evidence, malformed ones included."""

from __future__ import annotations

import time
import uuid
from typing import Any

from policy_engine.errors import BackendRefusal, PolicyEngineError
from policy_engine.evidence.decided import decision_fields
from policy_engine.evidence.digest import EMPTY_DIGEST, canonical_json, digest_json
from policy_engine.evidence.redact import keyed_digest
from policy_engine.model import Decision, Digest, EvidenceBegin, EvidenceEnd
from policy_engine.orchestrator import Orchestrator


def _arguments_digest(arguments: Any, key: bytes | None) -> Digest:
    # the digest of a redacted view, as op digests are: the arguments only as their size and
    # an HMAC under the evidence key (a plain hash of a short secret could be brute-forced)
    data = canonical_json(arguments).decode("utf-8", "surrogatepass")
    view: dict[str, Any] = {"arguments_bytes": len(data)}
    if key is not None:
        view["arguments_hmac"] = keyed_digest(key, data)
    return digest_json(view)


def record_refusal(orch: Orchestrator, *, tenant: str, subject: str, tool_name: str,
                   capability: str, arguments: Any, err: PolicyEngineError) -> str:
    """Write begin + end (``denied`` with ``err``'s code) to ``orch``'s evidence sinks; the
    envelope id. Nothing ran: no profile, no decision of the policy (``rule`` is empty)."""
    envelope = uuid.uuid4().hex
    now = int(time.time() * 1000)
    begin = EvidenceBegin(
        envelope_id=envelope, tenant=tenant, subject_id=subject, tool_name=tool_name,
        call_id=f"{tool_name}-{envelope}", profile_hash="", capability=capability,
        inputs_digest=_arguments_digest(arguments, orch.evidence_key), produced_at_ms=now,
        policy_version_hash=orch.policyset.version_hash)
    decision = Decision(decision="deny", code=err.code.value, http_status=err.http_status,
                        reason=err.public_message())
    end = EvidenceEnd(
        envelope_id=envelope, status="denied", error_code=err.code.value,
        outputs_digest=EMPTY_DIGEST, finished_at_ms=int(time.time() * 1000),
        # a backend's own no (BackendRefusal) is recorded as a refused backend selection is
        sandbox_error_kind="capability" if isinstance(err, BackendRefusal) else "invalid_input",
        **decision_fields(decision, None, orch.policyset.version_hash))
    for sink in orch.sinks:
        sink.begin(begin)
    for sink in orch.sinks:
        sink.end(end)
    return envelope
