"""Check results and the suite report, rendered as text, JSON or JUnit XML."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from typing import Any, Literal

Status = Literal["pass", "fail", "n/a"]
DOCS = "docs/conformance.md#for-executor-plugin-authors"


@dataclass(frozen=True, slots=True)
class CheckResult:
    """The outcome of one check.

    :param id: stable identifier (``timeout.honoured``, ``capabilities.runs[fs.read]``).
    :param title: what the check proves, in one line.
    :param status: ``pass``, ``fail``, or ``n/a`` when nothing the executor declares or
        provides lets the kit exercise it (the message then says how to make it applicable).
    :param problems: one line per violation: what the executor did vs what the contract
        requires, and where to look.
    """

    id: str
    title: str
    status: Status
    problems: tuple[str, ...] = ()
    note: str = ""

    @property
    def message(self) -> str:
        if self.problems:
            return "\n".join(self.problems)
        return self.note

    def to_json(self) -> dict[str, Any]:
        return {"id": self.id, "title": self.title, "status": self.status,
                "problems": list(self.problems), "note": self.note}


@dataclass(slots=True)
class Report:
    """Every check's result for one executor."""

    executor: str
    capabilities: dict[str, Any]
    results: list[CheckResult] = field(default_factory=list)
    runs: int = 0

    @property
    def failed(self) -> list[CheckResult]:
        return [r for r in self.results if r.status == "fail"]

    @property
    def ok(self) -> bool:
        return not self.failed

    def to_json(self) -> dict[str, Any]:
        counts = {s: sum(r.status == s for r in self.results) for s in ("pass", "fail", "n/a")}
        return {"executor": self.executor, "capabilities": self.capabilities,
                "ok": self.ok, "counts": counts, "runs": self.runs,
                "checks": [r.to_json() for r in self.results]}

    def to_text(self) -> str:
        lines = [f"conformance of executor `{self.executor}` "
                 f"(ops {', '.join(self.capabilities.get('op_kinds', []))}; "
                 f"{self.runs} calls through the orchestrator)" if self.capabilities
                 else f"conformance of `{self.executor}`"]
        for r in self.results:
            mark = {"pass": "PASS", "fail": "FAIL", "n/a": "N/A "}[r.status]
            lines.append(f"{mark} {r.id}: {r.title}")
            lines.extend(f"     - {p}" for p in r.problems)
            if r.status == "n/a" and r.note:
                lines.append(f"     {r.note}")
        counts = self.to_json()["counts"]
        lines.append(f"{counts['pass']} passed, {counts['fail']} failed, "
                     f"{counts['n/a']} not applicable")
        if self.failed:
            lines.append(f"what each check requires: {DOCS}")
        return "\n".join(lines)

    def to_junit(self) -> str:
        suite = ET.Element("testsuite", name=f"policy-engine-conformance[{self.executor}]",
                           tests=str(len(self.results)), failures=str(len(self.failed)),
                           skipped=str(sum(r.status == "n/a" for r in self.results)))
        for r in self.results:
            case = ET.SubElement(suite, "testcase", classname="policy_engine.conformance",
                                 name=r.id)
            if r.status == "fail":
                fail = ET.SubElement(case, "failure", message=r.problems[0] if r.problems
                                     else r.title)
                fail.text = r.message
            elif r.status == "n/a":
                ET.SubElement(case, "skipped", message=r.note)
        return ET.tostring(suite, encoding="unicode", xml_declaration=True)


def dumps(report: Report) -> str:
    return json.dumps(report.to_json(), indent=2, sort_keys=False)
