"""JSON report: the same facts as the text report, for tools."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from policy_engine.policytest.coverage import FileCoverage, total_percent
from policy_engine.policytest.results import CaseResult, RunResult


def case_json(case: CaseResult) -> dict[str, Any]:
    out: dict[str, Any] = {
        "name": case.name, "file": case.file, "line": case.line, "column": case.column,
        "status": case.status, "expected": case.expected,
        "actual": asdict(case.actual) if case.actual else None,
        "duration_ms": round(case.duration_s * 1000, 3),
    }
    if case.status == "failed":
        out.update(mismatches=list(case.mismatches), reason=case.reason, trace=list(case.trace))
    if case.status == "error":
        out["error"] = case.error
    return out


def coverage_json(files: list[FileCoverage], threshold: float | None) -> dict[str, Any]:
    pct = total_percent(files)
    return {
        "files": [{
            "file": f.file, "rules": f.total, "fired": f.fired, "percent": round(f.percent, 2),
            "unfired": [asdict(r) for r in f.unfired],
        } for f in files],
        "rules": sum(f.total for f in files),
        "fired": sum(f.fired for f in files),
        "percent": round(pct, 2),
        "threshold": threshold,
        "below_threshold": threshold is not None and pct < threshold,
    }


def run_json(run: RunResult, *, coverage: list[FileCoverage] | None, threshold: float | None,
             exit_code: int) -> dict[str, Any]:
    return {
        "summary": {
            "passed": run.count("passed"), "failed": run.count("failed"),
            "errors": run.count("error"), "total": run.total,
            "deselected": sum(f.deselected for f in run.files), "files": len(run.files),
            "duration_s": round(run.duration_s, 3), "exit_code": exit_code,
        },
        "files": [{
            "file": f.path, "policies": list(f.policies),
            "duration_ms": round(f.duration_s * 1000, 3),
            "cases": [case_json(c) for c in f.cases],
        } for f in run.files],
        "diagnostics": [d.to_json() for d in run.all_diagnostics],
        "coverage": coverage_json(coverage, threshold) if coverage is not None else None,
    }
