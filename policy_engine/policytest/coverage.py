"""Rule coverage: which permit/forbid rules fired in some case, per policy file and line.

A rule *fired* when, in some case's trace, it decided the case or matched on the way: the
decision names it, a ``permit``/``forbid`` step reports it as ``match``, or a ``limits`` step
checks it (which happens only after it matched). Steps where it did not match (``no-match``,
``condition-false``, ``condition-error``, an ``address`` refusal) do not count. Built-in rules
and consent rules are not counted: the trace does not attribute consent to one rule.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from policy_engine.compiler.builtins import BUILTIN_FILE
from policy_engine.graph import PolicySet
from policy_engine.model import Decision

SiteKey = tuple[str, int, int]
"""(real path of the policy file, line, column) of a rule."""


@dataclass(frozen=True, slots=True)
class RuleSite:
    """A rule as coverage reports it."""

    file: str
    """As shown (relative to the working directory when the test file was named so)."""
    line: int
    column: int
    id: str
    effect: str


@dataclass(slots=True)
class CoverageData:
    """Rules seen in compiled policy sets and the ones that fired; merges across workers."""

    sites: dict[SiteKey, RuleSite] = field(default_factory=dict)
    fired: set[SiteKey] = field(default_factory=set)

    def merge(self, other: CoverageData) -> None:
        for key, site in other.sites.items():
            self.sites.setdefault(key, site)
        self.fired |= other.fired


@dataclass(frozen=True, slots=True)
class FileCoverage:
    """Coverage of one policy file."""

    file: str
    total: int
    fired: int
    unfired: tuple[RuleSite, ...]

    @property
    def percent(self) -> float:
        return 100.0 * self.fired / self.total if self.total else 100.0


def rule_sites(ps: PolicySet) -> dict[tuple[str, int, int], SiteKey]:
    """Map each user rule's (shown file, line, column) to its site key; built-ins left out."""
    return {
        (r.ref.file, r.ref.line, r.ref.column): (os.path.realpath(r.ref.file), r.ref.line,
                                                 r.ref.column)
        for r in ps.rules if r.ref.file != BUILTIN_FILE
    }


def register(data: CoverageData, ps: PolicySet, sites: dict[tuple[str, int, int], SiteKey]) -> None:
    """Record the rules of a compiled set as coverable."""
    for r in ps.rules:
        key = sites.get((r.ref.file, r.ref.line, r.ref.column))
        if key is not None and key not in data.sites:
            data.sites[key] = RuleSite(r.ref.file, r.ref.line, r.ref.column, r.id, r.effect)


def fired(decision: Decision, sites: dict[tuple[str, int, int], SiteKey]) -> set[SiteKey]:
    """The site keys of the rules that fired in ``decision`` (see the module docstring)."""
    refs = [decision.rule] if decision.rule is not None else []
    for step in decision.trace or ():
        if step.rule is not None and (step.outcome == "match" or step.node in ("limits",
                                                                             "decision")):
            refs.append(step.rule)
    out: set[SiteKey] = set()
    for ref in refs:
        key = sites.get((ref.file, ref.line, ref.column))
        if key is not None:
            out.add(key)
    return out


def summarize(data: CoverageData) -> list[FileCoverage]:
    """Per policy file (sorted by shown path): totals and every rule that never fired."""
    by_file: dict[str, list[tuple[SiteKey, RuleSite]]] = {}
    for key, site in data.sites.items():
        by_file.setdefault(key[0], []).append((key, site))
    out = []
    for entries in by_file.values():
        entries.sort(key=lambda e: (e[0][1], e[0][2]))
        unfired = tuple(site for key, site in entries if key not in data.fired)
        out.append(FileCoverage(entries[0][1].file, len(entries), len(entries) - len(unfired),
                                unfired))
    return sorted(out, key=lambda c: c.file)


def total_percent(files: list[FileCoverage]) -> float:
    """Fired rules over all rules, in percent (100 when there is no rule at all)."""
    total = sum(f.total for f in files)
    return 100.0 * sum(f.fired for f in files) / total if total else 100.0
