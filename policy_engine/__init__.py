"""policy-engine: decides, enforces and proves what an AI agent's tool calls may do.

The names re-exported here are the stable public API; internal modules may change. They are
imported on first use (PEP 562), so ``import policy_engine`` (and every ``policy_engine.x``
import, which runs this file first) costs nothing until a name is used: a CLI command loads
only what it needs, and no authoring tool (lint, fmt, tests, conformance) comes along.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from policy_engine.compiler import check_files, compile_files
    from policy_engine.config import EngineConfig
    from policy_engine.errors import (
        Diagnostic,
        DiagnosticsError,
        ErrorCode,
        PolicyEngineError,
        Severity,
        Span,
    )
    from policy_engine.explain import ExplainRequest, Explanation, explain
    from policy_engine.gateway import Call, Called, Gateway, SandboxManager
    from policy_engine.graph import PolicySet
    from policy_engine.guard import Guard
    from policy_engine.orchestrator import Orchestrator, RunOutcome
    from policy_engine.profile import ProfileBuilder
    from policy_engine.refusal import PolicyRefusal, Refusal
    from policy_engine.runcode.manager import RunCodeResult

__version__ = "0.1.0"

_WHERE: dict[str, str] = {
    "check_files": "policy_engine.compiler", "compile_files": "policy_engine.compiler",
    "EngineConfig": "policy_engine.config",
    "Diagnostic": "policy_engine.errors", "DiagnosticsError": "policy_engine.errors",
    "ErrorCode": "policy_engine.errors", "PolicyEngineError": "policy_engine.errors",
    "Severity": "policy_engine.errors", "Span": "policy_engine.errors",
    "ExplainRequest": "policy_engine.explain", "Explanation": "policy_engine.explain",
    "explain": "policy_engine.explain",
    "PolicySet": "policy_engine.graph",
    "Guard": "policy_engine.guard",
    "Orchestrator": "policy_engine.orchestrator", "RunOutcome": "policy_engine.orchestrator",
    "ProfileBuilder": "policy_engine.profile",
    "Call": "policy_engine.gateway", "Called": "policy_engine.gateway",
    "Gateway": "policy_engine.gateway", "SandboxManager": "policy_engine.gateway",
    "PolicyRefusal": "policy_engine.refusal", "Refusal": "policy_engine.refusal",
    "RunCodeResult": "policy_engine.runcode.manager",
}

__all__ = [
    "Call", "Called", "Diagnostic", "DiagnosticsError", "EngineConfig", "ErrorCode",
    "ExplainRequest", "Explanation", "Gateway", "Guard", "Orchestrator", "PolicyEngineError",
    "PolicyRefusal", "PolicySet", "ProfileBuilder", "Refusal", "RunCodeResult", "RunOutcome",
    "SandboxManager", "Severity", "Span", "__version__", "check_files", "compile_files",
    "explain",
]


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'policy_engine' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # the next access is a plain attribute
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
