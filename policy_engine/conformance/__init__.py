"""Conformance kit for executor plugins: run the executor-facing contract checks against any
installed executor (``policy-engine conformance --executor NAME`` or ``pytest --pe-executor``).
"""

from __future__ import annotations

from policy_engine.conformance.harness import SetupError
from policy_engine.conformance.probes import Probe, ProbeEnv
from policy_engine.conformance.report import CheckResult, Report
from policy_engine.conformance.suite import run_suite

__all__ = ["CheckResult", "Probe", "ProbeEnv", "Report", "SetupError", "run_suite"]
