"""What a test run produced: per case, per file and overall (plain, picklable data)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from policy_engine.errors import Diagnostic
from policy_engine.policytest.coverage import CoverageData

Status = Literal["passed", "failed", "error"]


@dataclass(frozen=True, slots=True)
class Outcome:
    """A decision reduced to what a case can expect of it."""

    decision: str
    code: str | None
    rule: str | None


@dataclass(frozen=True, slots=True)
class CaseResult:
    """One case's verdict; failures keep the explanation (text and trace) for the report.

    :param expected: only what the case checks: ``decision`` always, ``code``/``rule`` if written.
    :param mismatches: the expected keys the actual decision disagrees with.
    """

    name: str
    file: str
    line: int
    column: int
    status: Status
    expected: dict[str, str | None]
    actual: Outcome | None
    mismatches: tuple[str, ...] = ()
    reason: str = ""
    duration_s: float = 0.0
    explain_text: str = ""
    trace: tuple[dict[str, Any], ...] = ()
    error: str = ""
    """Why the case could not run (its manifest or grant is unusable); the diagnostics say more."""


@dataclass(slots=True)
class FileResult:
    """One test file: its cases, or the diagnostics that kept it (or some cases) from running."""

    path: str
    policies: tuple[str, ...] = ()
    cases: list[CaseResult] = field(default_factory=list)
    diagnostics: list[Diagnostic] = field(default_factory=list)
    deselected: int = 0
    duration_s: float = 0.0
    names_policies: frozenset[str] = frozenset()
    """Real paths of the policy files the test file names (for `.sbpolicy` arguments)."""

    def count(self, status: Status) -> int:
        return sum(1 for c in self.cases if c.status == status)


@dataclass(slots=True)
class RunResult:
    """The whole run: files in discovery order, merged coverage, problems outside any file."""

    files: list[FileResult] = field(default_factory=list)
    coverage: CoverageData = field(default_factory=CoverageData)
    diagnostics: list[Diagnostic] = field(default_factory=list)
    duration_s: float = 0.0

    def count(self, status: Status) -> int:
        return sum(f.count(status) for f in self.files)

    @property
    def total(self) -> int:
        return sum(len(f.cases) for f in self.files)

    @property
    def all_diagnostics(self) -> list[Diagnostic]:
        """Every diagnostic once (several test files may name the same broken policy)."""
        found = [*self.diagnostics, *(d for f in self.files for d in f.diagnostics)]
        return list(dict.fromkeys(found))
