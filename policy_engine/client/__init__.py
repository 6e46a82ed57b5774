"""A typed client of the policy-engine service (sync and async, httpx): docs/sessions.md."""

from policy_engine.client.http import AsyncClient, Client
from policy_engine.client.models import (
           CodeResult,
           Exec,
           FileWritten,
           OpOutcome,
           OutputEvent,
           Session,
           SkillResult,
)
from policy_engine.refusal import PolicyRefusal

__all__ = ["AsyncClient", "Client", "CodeResult", "Exec", "FileWritten", "OpOutcome",
           "OutputEvent", "PolicyRefusal", "Session", "SkillResult"]
