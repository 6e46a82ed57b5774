"""`policy-engine test`: policy unit tests (`*.sbtest.yaml`), their runner, coverage and reports."""

from policy_engine.policytest.discovery import TEST_SUFFIXES, discover
from policy_engine.policytest.loader import LoadedCase, LoadedTestFile, load_test_file
from policy_engine.policytest.model import PolicyTestCase, PolicyTestFile
from policy_engine.policytest.results import CaseResult, FileResult, RunResult
from policy_engine.policytest.runner import run_tests

__all__ = [
    "TEST_SUFFIXES", "CaseResult", "FileResult", "LoadedCase", "LoadedTestFile", "PolicyTestCase",
    "PolicyTestFile", "RunResult", "discover", "load_test_file", "run_tests",
]
