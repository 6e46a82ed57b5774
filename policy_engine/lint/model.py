"""What the lint passes around: findings, the per-file and per-policy views rules read, config."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

from policy_engine.compiler.context import CompileContext
from policy_engine.dsl import ast
from policy_engine.errors import Diagnostic, Severity, Span


@dataclass(frozen=True, slots=True)
class Finding:
    """One diagnostic the lint reports (an SBP3xx finding, or an SBP1xx/2xx input problem).

    :param anchor_line: first line of the statement the finding is in; a suppression comment
        directly above the statement covers it (see :mod:`policy_engine.lint.suppress`).
    :param suppressed: the reason given by the suppression that hides it, else ``None``.
    """

    diagnostic: Diagnostic
    anchor_line: int = 0
    suppressed: str | None = None

    @property
    def id(self) -> str:
        return self.diagnostic.id

    @property
    def severity(self) -> Severity:
        return self.diagnostic.severity

    @property
    def span(self) -> Span | None:
        return self.diagnostic.span

    def fingerprint(self, source_line: str = "") -> str:
        """A stable hash of the rule, file and the trimmed source line (not the line number),
        so a finding keeps its identity when lines above it move (SARIF partialFingerprints)."""
        span = self.diagnostic.span
        where = span.file if span else ""
        blob = "\x1f".join((self.id, where, " ".join(source_line.split()), self.diagnostic.message))
        return hashlib.sha256(blob.encode("utf-8")).hexdigest()[:32]

    def sort_key(self) -> tuple[str, int, int, str, str]:
        span = self.diagnostic.span
        if span is None:
            return ("", 0, 0, self.id, self.diagnostic.message)
        return (span.file, span.line, span.column, self.id, self.diagnostic.message)


@dataclass(slots=True)
class FileView:
    """One parsed file as rules see it, with the compiled policy it is linted within.

    :param policy: the compile context of the root policy that includes this file (stages run
        up to CheckTypes: rule drafts carry capabilities, limits and compiled conditions).
    """

    file: ast.PolicyFile
    real: str
    policy: CompileContext

    @property
    def name(self) -> str:
        return self.file.file


@dataclass(frozen=True, slots=True)
class LintConfig:
    """What to report.

    :param select: only these IDs (empty: every rule); ``ignore``: never these.
    :param home: what ``~`` expands to when globs are compared (the sandbox's home, so the
        answer is the same on every machine).
    """

    select: frozenset[str] = frozenset()
    ignore: frozenset[str] = frozenset()
    home: str = "/root"

    def enabled(self, rule_id: str) -> bool:
        if rule_id in self.ignore:
            return False
        return not self.select or rule_id in self.select


@dataclass(slots=True)
class LintResult:
    """Everything one lint run found.

    :param files: every policy file linted (display paths, in order).
    :param unusable: files that do not parse or compile; their SBP1xx/2xx diagnostics are in
        ``findings`` too.
    :param sources: display path -> text, for renderers that show the source line.
    """

    files: list[str] = field(default_factory=list)
    findings: list[Finding] = field(default_factory=list)
    unusable: list[str] = field(default_factory=list)
    sources: dict[str, str] = field(default_factory=dict)

    def active(self) -> list[Finding]:
        return [f for f in self.findings if f.suppressed is None]
