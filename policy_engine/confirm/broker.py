"""Asks the confirmation service when consent is what stands between a call and an allow.

The broker runs the dry run (`explain`, the same decision as the run); only when the call is
denied for missing consent and the grant carries none does it ask. A yes becomes the grant's
``Consent`` (approver, when, until when) and the call then goes through the orchestrator like
any other; a no leaves the grant as it was, so the run is denied ``SANDBOX.PERMISSION_DENY``.
Every question and answer is appended to ``consent.jsonl`` beside the evidence, linked to the
call's evidence envelope.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from policy_engine import tracing
from policy_engine.confirm.services import ConfirmationService, ConsentAnswer, ConsentRequest
from policy_engine.evidence import capability_string, redacted_op
from policy_engine.explain import ExplainRequest, explain
from policy_engine.graph.policyset import PolicySet
from policy_engine.guard import Guard
from policy_engine.model import Consent, ExecOp, Grant, Manifest, Overrides, Settings
from policy_engine.profile import ProfileBuilder

_CONSENT_REASON = "consent required"  # the guard's reason (policy_engine/guard/steps.py)


@dataclass(frozen=True, slots=True)
class Asked:
    """One question and its answer, until the run's envelope id is known."""

    request: ConsentRequest
    answer: ConsentAnswer

    def evidence(self) -> dict[str, Any]:
        """The question and answer as the call's begin record carries them (`consent`)."""
        return {"request": self.request.to_json(), "answer": self.answer.to_json()}


class ConsentBroker:
    def __init__(self, service: ConfirmationService, policyset: PolicySet,
                 log_path: Path) -> None:
        self.service = service
        self.swap(policyset)
        self.log_path = log_path
        self._lock = threading.Lock()

    def swap(self, policyset: PolicySet) -> None:
        """Decide with ``policyset`` from now on (hot reload): one assignment, so a question
        is prepared under the old policy or the new one, never a mix."""
        self._active = (policyset, ProfileBuilder(policyset), Guard(policyset))

    @property
    def policyset(self) -> PolicySet:
        return self._active[0]

    def prepare(self, grant: Grant, manifest: Manifest, op: ExecOp, *,
                settings: Settings | None = None, overrides: Overrides | None = None,
                context: Mapping[str, Any] | None = None) -> tuple[Grant, Asked | None]:
        """``grant`` with the approver's consent when one was needed and given."""
        if grant.consent is not None:
            return grant, None  # a recorded consent is checked by the guard as it is
        request = ExplainRequest(op=op, settings=settings, overrides=overrides,
                                 context=dict(context or {}))
        policyset, builder, guard = self._active
        decision = explain(policyset, manifest, grant, request, builder=builder,
                           guard=guard).decision
        if decision.allowed or not (decision.reason or "").startswith(_CONSENT_REASON):
            return grant, None
        question = ConsentRequest(
            request_id=uuid.uuid4().hex, tenant=grant.tenant, subject_id=grant.subject_id,
            tool_name=grant.tool_name, call_id=grant.call_id, capability=capability_string(op),
            op=redacted_op(op), reason=decision.reason or "", requested_at_ms=_now())
        with tracing.span("policy_engine.consent", {"policy_engine.tenant": grant.tenant,
                                                    "policy_engine.consent.mode":
                                                    self.service.mode}) as sp:
            try:
                answer = self.service.confirm(question)
            except Exception as exc:  # a broken approver is a no, never a crash or a yes
                answer = ConsentAnswer(False, "error", _now(), 0, self.service.mode,
                                       f"confirmation failed: {type(exc).__name__}")
            sp.set_attribute("policy_engine.consent.approved", answer.approved)
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
