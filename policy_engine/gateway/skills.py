"""Skills through the gateway: a skill's one op runs on the call path every face shares."""

from __future__ import annotations

from typing import Any

from policy_engine.executor import CancelToken
from policy_engine.gateway.call import Call, Gateway
from policy_engine.skills.invoke import InvokeResult, SkillInvoker
from policy_engine.skills.model import Skill


def invoke_skill(gateway: Gateway, invoker: SkillInvoker, skill: Skill, inputs: Any, *,
                 tenant: str, subject: str, cancel: CancelToken | None = None
                 ) -> InvokeResult:
    """Validate, build the op, run it through ``gateway`` (consent, evidence, one outcome).

    :raises InputError: the inputs break ``interface.inputs`` (nothing ran).
    :raises PolicyEngineError: no op could be built (recorded as a refusal).
    """
    prepared = invoker.prepare(skill, inputs, tenant=tenant, subject=subject)
    called = gateway.run(Call(prepared.grant, prepared.manifest, prepared.op,
                              settings=prepared.settings, identity=(tenant, subject),
                              cancel=cancel), orchestrator=prepared.orchestrator)
    return invoker.answer(skill, called.outcome,
                          called.refusal.to_json() if called.refusal else None)
