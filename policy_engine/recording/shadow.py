"""Shadow (audit) mode: a second policy decides every call beside the enforcing one, unenforced.

What the shadow policy would decide is recorded in the call's begin record (``shadow``) and
counted in ``sandbox_shadow_would_deny{code,rule}``; the call itself goes on under the
enforcing policy. This is the rollout step before enforcing a new policy (admission
controllers' warn/audit modes): run it in shadow, read what it would have denied, then swap.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from prometheus_client import Counter

from policy_engine.errors import PolicyEngineError
from policy_engine.evidence.redact import redact_text
from policy_engine.graph.policyset import PolicySet
from policy_engine.guard import Guard
from policy_engine.model import Decision, ExecOp, Grant, Manifest, Overrides, Settings
from policy_engine.observe import Metrics
from policy_engine.profile import ProfileBuilder

log = logging.getLogger(__name__)


class ShadowPolicy:
    """Decides calls under an audit-only policy; never raises into the call."""

    def __init__(self, policyset: PolicySet, metrics: Metrics) -> None:
        self.policyset = policyset
        self.builder = ProfileBuilder(policyset)
        self.guard = Guard(policyset)
        self.would_deny = Counter(
            "sandbox_shadow_would_deny", "calls the shadow (audit) policy would deny",
            ["code", "rule"], registry=metrics.registry)

    def decide(self, grant: Grant, manifest: Manifest, op: ExecOp, *,
               settings: Settings | None, overrides: Overrides | None,
               context: Mapping[str, object] | None, now_ms: int,
               enforced: Decision) -> dict[str, Any]:
        """The ``shadow`` member of the begin record for this call."""
        try:
            profile = self.builder.build(grant, manifest, settings=settings, overrides=overrides)
            d = self.guard.decide(profile, op, context=context, now_ms=now_ms)
        except PolicyEngineError as exc:
            d = Decision(decision="deny", code=exc.code.value, reason=exc.reason)
        except Exception as exc:  # a broken shadow policy must never affect the real call
            log.error("shadow policy failed on a call: %s: %s", type(exc).__name__, exc)
            return {"policy_version_hash": self.policyset.version_hash,
                    "error": type(exc).__name__}
        rule = d.rule.model_dump() if d.rule else None
        if not d.allowed:
            self.would_deny.labels(code=d.code or "", rule=d.rule.id if d.rule else "").inc()
        return {"decision": d.decision, "code": None if d.allowed else d.code, "rule": rule,
                "reason": redact_text(d.reason) if d.reason else None,
                "policy_version_hash": self.policyset.version_hash,
                "would_deny": not d.allowed,
                "differs": (d.decision, d.code if not d.allowed else None)
                != (enforced.decision, enforced.code if not enforced.allowed else None)}
