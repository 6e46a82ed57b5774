"""policy-engine: decides, enforces and proves what an AI agent's tool calls may do."""

from policy_engine.errors import (
    Diagnostic,
    DiagnosticsError,
    ErrorCode,
    PolicyEngineError,
    Severity,
    Span,
)

__version__ = "0.1.0"

__all__ = [
    "Diagnostic", "DiagnosticsError", "ErrorCode", "PolicyEngineError", "Severity", "Span",
    "__version__",
]
