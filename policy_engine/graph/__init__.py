"""The compiled decision graph's data: rules indexed by capability kind."""

from policy_engine.graph.policyset import (
    CompiledCondition,
    CompiledRule,
    ConsentRule,
    NamedProfile,
    PolicySet,
)

__all__ = ["CompiledCondition", "CompiledRule", "ConsentRule", "NamedProfile", "PolicySet"]
