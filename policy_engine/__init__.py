"""policy-engine: decides, enforces and proves what an AI agent's tool calls may do.

The names re-exported here are the stable public API; internal modules may change.
"""

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
from policy_engine.graph import PolicySet
from policy_engine.guard import Guard
from policy_engine.orchestrator import Orchestrator, RunOutcome
from policy_engine.profile import ProfileBuilder

__version__ = "0.1.0"

__all__ = [
    "Diagnostic", "DiagnosticsError", "EngineConfig", "ErrorCode", "ExplainRequest",
    "Explanation", "Guard", "Orchestrator", "PolicyEngineError", "PolicySet", "ProfileBuilder",
    "RunOutcome", "Severity", "Span", "__version__", "check_files", "compile_files", "explain",
]
