"""`explain`: the decision pipeline with a tracer attached, and its text/JSON renderers."""

from policy_engine.explain.pipeline import Explanation, explain
from policy_engine.explain.request import Expectation, ExplainRequest

__all__ = ["ExplainRequest", "Expectation", "Explanation", "explain"]
