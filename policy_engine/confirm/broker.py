"""Asks the confirmation service when consent is what stands between a call and an allow.

The broker decides nothing: the orchestrator's own decision of the call (the one decision, made
once) is handed to :meth:`ConsentBroker.ask`; only a deny for missing consent, on a grant that
carries none, is asked about. A yes becomes the grant's ``Consent`` (approver, when, until
when); a no, a timeout, a late answer or no service leaves the call denied
``SANDBOX.PERMISSION_DENY``. The approver receives the reviewable form of the op
(confirm/review.py); the evidence and ``consent.jsonl`` keep the redacted op and the digest of
that form, never the form itself.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from policy_engine import tracing
from policy_engine.confirm.review import reviewable
from policy_engine.confirm.services import ConfirmationService, ConsentAnswer, ConsentRequest
from policy_engine.evidence import capability_string, digest_json, redacted_op
from policy_engine.model import Consent, Decision, ExecOp, Grant
from policy_engine.refusal import ConsentSeen

CONSENT_REASON = "consent required"  # the guard's reason (policy_engine/guard/steps.py)


def needs_consent(decision: Decision) -> bool:
    """Whether ``decision`` is a deny that a consent would lift."""
    return not decision.allowed and (decision.reason or "").startswith(CONSENT_REASON)


def answer_kind(answer: ConsentAnswer) -> str:
    """approved / refused / timed_out / no_service: a person's no is told apart from silence
    and from no approver at all (the answer's detail says which; anything unclear is
    ``no_service``, still a no)."""
    if answer.approved:
        return "approved"
    detail = answer.detail.lower()
    if answer.mode == "deny":
        return "no_service"
    if answer.timed_out or "timeout" in detail or "timed out" in detail \
            or detail.startswith(("late", "timed_out")):
        return "timed_out"
    if detail.startswith("refused by") or detail.startswith("refused at"):
        return "refused"
    return "no_service"


@dataclass(frozen=True, slots=True)
class Asked:
    """One question and its answer, until the run's envelope id is known."""

    request: ConsentRequest
    answer: ConsentAnswer

    @property
    def kind(self) -> str:
        return answer_kind(self.answer)

    def seen(self) -> ConsentSeen:
        """The refusal document's ``consent`` for this question."""
        # silence and a missing service have no approver: nobody answered
        answered = self.kind in ("approved", "refused")
        return ConsentSeen(asked=True, answer=self.kind,  # type: ignore[arg-type]
                           by=f"{self.answer.mode}:{self.answer.approver}" if answered else None,
                           at=self.answer.decided_at_ms if answered else None)

    def evidence(self) -> dict[str, Any]:
        """The question and answer as evidence keeps them: the redacted op and the digest of
        the reviewable form (the form itself went to the approver only)."""
        request = self.request.to_json()
        request["review"] = {"digest": digest_json(request.get("review") or {}).model_dump(
            mode="json")}
        return {"request": request, "answer": {**self.answer.to_json(), "kind": self.kind}}


class ConsentBroker:
    """Asks ``service`` about consent-needing denials and logs every question and answer to
    ``log_path`` (``consent.jsonl`` beside the evidence), linked to the call's envelope."""

    def __init__(self, service: ConfirmationService, log_path: Path) -> None:
        self.service = service
        self.log_path = log_path
        self._lock = threading.Lock()

    def ask(self, grant: Grant, op: ExecOp, decision: Decision) -> tuple[Grant, Asked] | None:
        """``None`` when ``decision`` is not a consent-needing deny (or the grant already
        carries a consent, which the guard judged as it is); else the grant — with the
        approver's consent when one was given in time — and the question asked."""
        if grant.consent is not None or not needs_consent(decision):
            return None
        question = ConsentRequest(
            request_id=uuid.uuid4().hex, tenant=grant.tenant, subject_id=grant.subject_id,
            tool_name=grant.tool_name, call_id=grant.call_id, capability=capability_string(op),
            op=redacted_op(op), reason=decision.reason or "", requested_at_ms=_now(),
            review=reviewable(op))
        started = time.monotonic()
        with tracing.span("policy_engine.consent", {"policy_engine.tenant": grant.tenant,
                                                    "policy_engine.consent.mode":
                                                    self.service.mode}) as sp:
            try:
                answer = self.service.confirm(question)
            except Exception as exc:  # a broken approver is a no, never a crash or a yes
                answer = ConsentAnswer(False, "error", _now(), 0, self.service.mode,
                                       f"confirmation failed: {type(exc).__name__}")
            sp.set_attribute("policy_engine.consent.approved", answer.approved)
        limit = getattr(self.service, "timeout_s", None)
        late = isinstance(limit, int | float) and time.monotonic() - started > limit
        if late and answer.approved:  # a yes after the timeout is a no, recorded as late
            answer = ConsentAnswer(False, answer.approver, _now(), 0, answer.mode,
                                   f"late: answered after the {limit:g}s timeout")
        asked = Asked(question, answer)
        if not answer.approved:
            return grant, asked
        consent = Consent(granted_by=f"{answer.mode}:{answer.approver}",
                          granted_at=answer.decided_at_ms,
                          expires_at=answer.decided_at_ms + answer.valid_for_ms,
                          scope=question.request_id)
        return grant.model_copy(update={"consent": consent}), asked

    def record(self, asked: Asked | None, envelope_id: str) -> None:
        """Append the question and answer to the consent log (for approver audits), linked to
        the call's evidence envelope, whose begin record carries them too (``annotations``)."""
        if asked is None:
            return
        line = json.dumps({"envelope_id": envelope_id, **asked.evidence()}, sort_keys=True)
        with self._lock:
            self.log_path.parent.mkdir(parents=True, exist_ok=True)
            with self.log_path.open("a", encoding="utf-8") as fh:
                fh.write(line + "\n")


def consent_notes(asked: Asked | None) -> dict[str, Any] | None:
    """The evidence annotations of a call for which consent was (or was not) asked."""
    return None if asked is None else {"consent": asked.evidence()}


def _now() -> int:
    return int(time.time() * 1000)
