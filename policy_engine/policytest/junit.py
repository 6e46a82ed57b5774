"""JUnit XML for CI test reporters (Jenkins, GitLab, GitHub actions that read JUnit).

One ``testsuite`` per test file and one ``testcase`` per case, with ``classname``, ``name``,
``time``, ``file`` and ``line``; a failing case has a ``failure`` (message: what differs; body:
expected vs actual and the explain trace), a case or file that could not run has an ``error``.
"""

from __future__ import annotations

import os
import re
import xml.etree.ElementTree as ET

from policy_engine.dsl.render import render_diagnostic
from policy_engine.policytest.report_text import render_case
from policy_engine.policytest.results import CaseResult, FileResult, RunResult


def classname(test_file: str) -> str:
    """``examples/policies/org.sbtest.yaml`` → ``examples.policies.org``."""
    path = test_file.replace(os.sep, "/")
    for suffix in (".sbtest.yaml", ".sbtest.yml", ".sbtest.json"):
        if path.lower().endswith(suffix):
            path = path[: -len(suffix)]
    return ".".join(p for p in path.split("/") if p not in ("", "."))


def failure_message(case: CaseResult) -> str:
    parts = []
    for key in case.mismatches:
        want = case.expected.get(key)
        got = getattr(case.actual, key) if case.actual else None
        parts.append(f"{key}: expected {want or '(none)'}, got {got or '(none)'}")
    return "; ".join(parts)


def _suite(f: FileResult) -> ET.Element:
    suite = ET.Element("testsuite", {
        "name": f.path, "tests": str(len(f.cases)), "failures": str(f.count("failed")),
        "errors": str(f.count("error")), "skipped": "0", "time": f"{f.duration_s:.6f}",
        "file": f.path,
    })
    for case in f.cases:
        el = ET.SubElement(suite, "testcase", {
            "classname": classname(f.path), "name": case.name, "time": f"{case.duration_s:.6f}",
            "file": case.file, "line": str(case.line),
        })
        if case.status == "failed":
            fail = ET.SubElement(el, "failure", {"message": failure_message(case),
                                                 "type": "PolicyTestFailure"})
            fail.text = render_case(case)
        elif case.status == "error":
            err = ET.SubElement(el, "error", {"message": case.error, "type": "PolicyTestError"})
            err.text = "\n\n".join(render_diagnostic(d) for d in f.diagnostics)
    if f.diagnostics and not f.cases:
        # the file (or its policy) is unusable: one erroring case so that CI shows it
        first = f.diagnostics[0]
        line = first.span.line if first.span else 0
        el = ET.SubElement(suite, "testcase", {
            "classname": classname(f.path), "name": "(test file)", "time": "0",
            "file": f.path, "line": str(line),
        })
        err = ET.SubElement(el, "error", {"message": f"{first.id} {first.message}",
                                          "type": "PolicyTestError"})
        err.text = "\n\n".join(render_diagnostic(d) for d in f.diagnostics)
        suite.set("tests", "1")
        suite.set("errors", "1")
    return suite


_NOT_XML = re.compile("[^\t\n\r\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")
"""What XML 1.0 cannot hold at all, escaped or not: C0 controls but tab, newline and carriage
return, lone surrogates, U+FFFE and U+FFFF."""


def xml_safe(text: str) -> str:
    """``text`` with every character XML 1.0 forbids written as ``\\xNN`` / ``\\uNNNN``, so a
    case named ``"esc \\x1b"`` stays recognisable and the report stays parseable."""
    def shown(m: re.Match[str]) -> str:
        code = ord(m.group())
        return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"
    return _NOT_XML.sub(shown, text)


def _make_safe(root: ET.Element) -> None:
    for el in root.iter():
        for key, value in el.attrib.items():
            el.set(key, xml_safe(value))
        if el.text:
            el.text = xml_safe(el.text)
        if el.tail:
            el.tail = xml_safe(el.tail)


def to_junit(run: RunResult) -> ET.ElementTree:
    """The run as a JUnit ``testsuites`` document."""
    suites = [_suite(f) for f in run.files]
    root = ET.Element("testsuites", {
        "name": "policy-engine test",
        "tests": str(sum(int(s.get("tests", "0")) for s in suites)),
        "failures": str(sum(int(s.get("failures", "0")) for s in suites)),
        "errors": str(sum(int(s.get("errors", "0")) for s in suites)),
        "time": f"{run.duration_s:.6f}",
    })
    root.extend(suites)
    # names, messages and traces come from test files and policies: anything may be in them
    _make_safe(root)
    ET.indent(root)
    return ET.ElementTree(root)


def write_junit(run: RunResult, path: str) -> None:
    """Write the JUnit XML to ``path``. :raises OSError: when it cannot be written."""
    to_junit(run).write(path, encoding="utf-8", xml_declaration=True)
