"""A policy-engine executor that breaks the contract on purpose (conformance kit test)."""
