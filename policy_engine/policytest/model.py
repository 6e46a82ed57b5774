"""The test-file format: a policy, default fixtures, and cases with their expected decisions."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from policy_engine.explain.request import CallRequest


class PolicyTestCase(CallRequest):
    """One case: an explain request (without `description`/`expect`) plus what it must decide.

    ``want_code`` and ``want_rule`` are checked only when written; an explicit ``null`` asserts
    that there is none (``want_rule: null``: decided without a rule, e.g. the default deny).
    ``manifest`` and ``grant`` override the file's defaults.
    """

    name: str = Field(min_length=1, description="unique in the file; `-k` filters on it")
    want_decision: Literal["allow", "deny"]
    want_code: str | None = Field(default=None, description="error code of the deny")
    want_rule: str | None = Field(default=None, description="id of the deciding rule")

    @property
    def checks_code(self) -> bool:
        return "want_code" in self.model_fields_set

    @property
    def checks_rule(self) -> bool:
        return "want_rule" in self.model_fields_set


class PolicyTestFile(BaseModel):
    """A `*.sbtest.yaml` file: paths are relative to the file itself."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    policy: str | list[str] = Field(description="the .sbpolicy file(s) compiled as one set")
    manifest: str | None = Field(default=None, description="default tool manifest of every case")
    grant: str | None = Field(default=None, description="default grant of every case")
    now_ms: int | None = Field(default=None, description="default decision time")
    facts: dict[str, Any] | None = Field(
        default=None, description="file facts every case decides on (a case's own `facts` "
        "adds to them); undeclared facts are unknown (docs/policy-tests.md, \"Facts\")")
    fixture: str | None = Field(
        default=None, description="a directory standing for the profile's root_fs: the facts "
        "of paths beneath it are read there (relative to the test file)")
    cases: list[PolicyTestCase] = Field(min_length=1)

    @property
    def policies(self) -> list[str]:
        return [self.policy] if isinstance(self.policy, str) else list(self.policy)
