"""The gateway: the one path every face runs a call on.

identity (the face's authentication) → revocation → one decision → consent (the confirmation
service, asked about that very decision) → budget → execution → evidence → one outcome. The
orchestrator performs the steps from revocation on; the gateway checks identity, hands the
orchestrator the consent step, records the question beside the evidence and shapes the
outcome (:class:`~policy_engine.gateway.outcome.Called`). Faces parse, call
:meth:`Gateway.run` (or :meth:`Gateway.decide` for a dry run) and render.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from policy_engine import tracing
from policy_engine.confirm.broker import Asked, ConsentBroker, consent_notes
from policy_engine.confirm.services import ConfirmationService, DenyConfirmation
from policy_engine.errors import ErrorCode, PolicyEngineError
from policy_engine.executor import CancelToken, Executor
from policy_engine.explain import ExplainRequest, Explanation, explain
from policy_engine.gateway.loop_sized import loop_sized
from policy_engine.gateway.outcome import Called, refusal_of
from policy_engine.guard import Guard
from policy_engine.model import Decision, ExecOp, Grant, Manifest, OpKind, Overrides, Settings
from policy_engine.orchestrator import Orchestrator
from policy_engine.profile import ProfileBuilder
from policy_engine.refusal import PolicyRefusal, Refusal, engine_refusal


@dataclass(frozen=True, slots=True)
class Call:
    """One call as a face parsed it.

    :param identity: ``(tenant, subject)`` the face authenticated; the grant must name them.
    :param annotations: begin-record notes the face adds (run_code's risk hint); no secrets.
    """

    grant: Grant
    manifest: Manifest
    op: ExecOp
    settings: Settings | None = None
    overrides: Overrides | None = None
    context: Mapping[str, Any] | None = None
    identity: tuple[str, str] | None = None
    annotations: Mapping[str, Any] | None = None
    cancel: CancelToken | None = None
    on_output: Callable[[str, bytes], None] | None = None  # streamed stdout/stderr
    via: Callable[[Executor], Executor] | None = None  # runs the decided op (Orchestrator.run)
    # the root_fs ``runs_on_caller`` just said yes for, in this thread (Orchestrator.run)
    on_caller: str | None = None


class Gateway:
    """Runs calls on ``orchestrator`` (or one a face picks per call, e.g. a pinned backend)
    and asks ``broker``'s confirmation service when a decision lacks only consent.

    :param broker: default: nobody is asked (``deny``), each question still recorded.
    """

    def __init__(self, orchestrator: Orchestrator, broker: ConsentBroker | None = None
                 ) -> None:
        self.orch = orchestrator
        self.broker = broker or ConsentBroker(
            DenyConfirmation(), orchestrator.config.state_dir / "consent.jsonl")

    @classmethod
    def with_service(cls, orchestrator: Orchestrator, service: ConfirmationService,
                     log_path: Path | None = None) -> Gateway:
        """A gateway asking ``service`` (consent log beside the evidence by default)."""
        path = log_path or orchestrator.config.state_dir / "consent.jsonl"
        return cls(orchestrator, ConsentBroker(service, path))

    def run(self, call: Call, *, orchestrator: Orchestrator | None = None) -> Called:
        """Run ``call``: never raises for a refusal or failure (``Called.refusal`` says it).

        :raises PolicyRefusal: the grant names another tenant or subject than the identity the
            face authenticated (nothing ran; no evidence of a call that was never anyone's).
        """
        if call.identity is not None and \
                (call.grant.tenant, call.grant.subject_id) != call.identity:
            raise PolicyRefusal(engine_refusal(PolicyEngineError(
                ErrorCode.PERMISSION_DENY, "the grant is for another tenant or subject than "
                "the caller"), "grant"))
        orch = orchestrator or self.orch
        box: list[Asked] = []

        def consent(grant: Grant, op: ExecOp, decision: Decision
                    ) -> tuple[Grant, Mapping[str, Any] | None] | None:
            answered = self.broker.ask(grant, op, decision)
            if answered is None:
                return None
            box.append(answered[1])
            return answered[0], consent_notes(answered[1])

        # the span every face's call passes through (face → gateway → run → decide → consent →
        # execute → evidence); attributes never carry secrets (docs/operations.md "Traces")
        with tracing.span("policy_engine.gateway", {"policy_engine.tenant": call.grant.tenant,
                                                    "policy_engine.tool": call.grant.tool_name,
                                                    "policy_engine.op": str(call.op.kind)}
                          ) as sp:
            outcome = orch.run(call.grant, call.manifest, call.op, settings=call.settings,
                               overrides=call.overrides, context=call.context or None,
                               cancel=call.cancel, annotations=call.annotations,
                               consent=consent, on_output=call.on_output, via=call.via,
                               on_caller=call.on_caller)
            asked = box[0] if box else None
            self.broker.record(asked, outcome.envelope_id)
            called = Called(outcome, asked, refusal_of(outcome, asked))
            if sp.is_recording():
                sp.set_attribute("policy_engine.consent.asked", asked is not None)
                if called.refusal is not None:
                    sp.set_attribute("policy_engine.refused_by", called.refusal.refused_by)
            return called

    def runs_on_caller(self, kind: OpKind, root_fs: str, op: ExecOp | None = None) -> bool:
        """Whether a ``kind`` call beneath ``root_fs`` runs start to end in the calling thread
        without waiting on anything outside this machine (``Orchestrator.runs_on_caller``),
        consent included: the confirmation service answers at once (``deny``, ``auto``); with
        ``op``, also whether it is small enough to hold an event loop (``loop_sized``)."""
        # the backend's answer first: kept per kind, where ``loop_sized`` asks the disk
        return self.broker.service.mode in ("deny", "auto") and \
            self.orch.runs_on_caller(kind, root_fs) and (op is None or loop_sized(op))

    def decide(self, manifest: Manifest, grant: Grant, request: ExplainRequest, *,
               backend: bool = True, trace: bool = True) -> Explanation:
        """The dry run: the decision the run makes, on the running engine's own profile
        builder and guard (one pair, swapped with the policy), with the trace attached.

        :param backend: also make the backend choice the run makes (``/v1/decide``).
        :param trace: attach the trace (the full explain document); without it the decision
            is made untraced, exactly as the run makes it.
        """
        orch = self.orch
        builder, guard = orch.builder, orch.guard
        return explain(orch.policyset, manifest, grant, request,
                       builder=builder if isinstance(builder, ProfileBuilder) else None,
                       guard=guard if isinstance(guard, Guard) else None,
                       executors=orch.components.executors if backend else None,
                       config=orch.config if backend else None, trace=trace)


def raise_refusal(called: Called) -> Called:
    """``called`` when it ran, else its :class:`PolicyRefusal` (the Python face's errors)."""
    if called.refusal is not None:
        raise PolicyRefusal(called.refusal)
    return called


def input_refusal(err: PolicyEngineError, *, envelope_id: str | None = None,
                  location: str | None = None) -> Refusal:
    """The refusal of malformed input (``SCHEMA.VALIDATION_FAILED``, located)."""
    return engine_refusal(err, "service", envelope_id=envelope_id, location=location)
