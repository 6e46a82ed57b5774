"""Text report: each failure with expected vs actual and its explain trace, then the summary."""

from __future__ import annotations

import math

from policy_engine.policytest.coverage import FileCoverage, total_percent
from policy_engine.policytest.results import CaseResult, RunResult

_FIELDS = ("decision", "code", "rule")
_INDENT = "    "


def shown(value: str | None) -> str:
    return "(none)" if value is None else value


def percent(value: float) -> str:
    """One decimal, rounded down: 99.96 % must not read as 100.0 % when it fails a threshold."""
    return f"{math.floor(value * 10) / 10:.1f}%"


def render_case(case: CaseResult, *, verbose: bool = False) -> str:
    """A failing or erroring case in full; a passing one as one line (only asked for with -v)."""
    where = f"{case.file}:{case.line}:{case.column}"
    if case.status == "passed":
        return f"PASS  {where}: {case.name} ({case.duration_s * 1000:.2f} ms)"
    if case.status == "error":
        return f"ERROR {where}: {case.name}: {case.error} (see the diagnostics)"
    lines = [f"FAIL  {where}: {case.name}"]
    actual = case.actual
    got = {"decision": actual.decision, "code": actual.code, "rule": actual.rule} \
        if actual else {}
    rows = [("", "expected", "actual", "")]
    for key in _FIELDS:
        want = shown(case.expected[key]) if key in case.expected else "(not checked)"
        mark = "  <- differs" if key in case.mismatches else ""
        rows.append((key, want, shown(got.get(key)), mark))
    w0 = max(len(r[0]) for r in rows)
    w1 = max(len(r[1]) for r in rows)
    lines.extend(f"  {a:<{w0}}  {b:<{w1}}  {c}{d}".rstrip() for a, b, c, d in rows)
    if case.reason:
        lines.append(f"  reason: {case.reason}")
    lines.append("  explain:")
    lines.extend(_INDENT + line if line else line for line in case.explain_text.splitlines())
    return "\n".join(lines)


def render_coverage(files: list[FileCoverage], threshold: float | None) -> str:
    """Per policy file: fired/total and where each rule that never fired is written."""
    lines = ["rule coverage (a rule fired when it decided a case or matched in one):"]
    width = max([len(f.file) for f in files] + [len("total")])
    for f in files:
        lines.append(f"  {f.file:<{width}}  {f.fired:>4}/{f.total:<4} {percent(f.percent):>7}")
        lines.extend(f"    never fired: {r.file}:{r.line}:{r.column}  {r.effect} {r.id}"
                     for r in f.unfired)
    total = sum(f.total for f in files)
    fired = sum(f.fired for f in files)
    pct = total_percent(files)
    lines.append(f"  {'total':<{width}}  {fired:>4}/{total:<4} {percent(pct):>7}")
    if not files:
        lines.append("  (no policy compiled: nothing to cover)")
    verdict = threshold_verdict(pct, threshold)
    if verdict:
        lines.append(verdict)
    return "\n".join(lines)


def threshold_verdict(pct: float, threshold: float | None) -> str:
    if threshold is None:
        return ""
    if pct < threshold:
        return (f"coverage {percent(pct)} is below the threshold {threshold:g}% by "
                f"{threshold - pct:.1f} points")
    return f"coverage {percent(pct)} meets the threshold {threshold:g}%"


def render_summary(run: RunResult) -> str:
    """``FAILED: 1 failed, 46 passed in 3 test files (0.84 s)``."""
    failed, passed, errors = run.count("failed"), run.count("passed"), run.count("error")
    parts = [f"{failed} failed"] if failed else []
    parts.append(f"{passed} passed")
    if errors:
        parts.append(f"{errors} error(s)")
    deselected = sum(f.deselected for f in run.files)
    if deselected:
        parts.append(f"{deselected} deselected")
    broken = sum(1 for f in run.files if f.diagnostics and not f.cases)
    nfiles = len(run.files)
    tail = f" in {nfiles} test file{'s' if nfiles != 1 else ''}"
    if broken:
        tail += f" ({broken} unusable)"
    ok = not failed and not errors and not run.all_diagnostics
    return f"{'OK' if ok else 'FAILED'}: {', '.join(parts)}{tail} ({run.duration_s:.2f} s)"


def render_run(run: RunResult, *, verbose: bool, coverage: list[FileCoverage] | None,
               threshold: float | None) -> str:
    """Everything for stdout: cases (failures, or all with ``verbose``), coverage, summary."""
    blocks: list[str] = []
    for f in run.files:
        for case in f.cases:
            if verbose or case.status != "passed":
                blocks.append(render_case(case, verbose=verbose))
    if coverage is not None:
        blocks.append(render_coverage(coverage, threshold))
    blocks.append(render_summary(run))
    sep = "\n" if verbose else "\n\n"
    return sep.join(blocks)
