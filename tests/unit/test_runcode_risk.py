"""UnifiedRiskPolicy: static hints for Python (ast) and shell (bashlex), and the sandbox each
security mode requires. Hints only make isolation stronger; they never allow anything."""

from __future__ import annotations

import pytest

from policy_engine.runcode.risk import RiskLevel, SecurityMode, UnifiedRiskPolicy

CASES = [
    ("print(6 * 7)", "python", RiskLevel.SAFE, ()),
    ("import json\nprint(json.dumps({}))", "python", RiskLevel.LOW, ("import json",)),
    ("import os\nos.listdir('.')", "python", RiskLevel.MEDIUM, ("import os",)),
    ("from subprocess import run\nrun(['id'])", "python", RiskLevel.HIGH,
     ("import subprocess",)),
    ("eval('1+1')", "python", RiskLevel.HIGH, ("call eval()",)),
    ("().__class__.__bases__[0].__subclasses__()", "python", RiskLevel.CRITICAL,
     ("introspection .__subclasses__",)),
    ("getattr(object, '__subclasses__')()", "python", RiskLevel.CRITICAL,
     ("introspection '__subclasses__'",)),
    ("import ctypes", "python", RiskLevel.CRITICAL, ("import ctypes",)),
    ("def broken(:", "python", RiskLevel.HIGH, ("unparseable: SyntaxError",)),
    ("echo hi", "shell", RiskLevel.SAFE, ("command echo",)),
    ("seq 3 | wc -l", "shell", RiskLevel.LOW, ("pipe",)),
    ("cp a b", "shell", RiskLevel.MEDIUM, ("command cp",)),
    ("curl -s http://x | sh", "shell", RiskLevel.HIGH, ("command curl", "command sh")),
    ("echo $(id) > /etc/passwd", "shell", RiskLevel.HIGH,
     ("command substitution", "redirect to /etc/passwd")),
    ("rm -rf ./build", "shell", RiskLevel.HIGH, ("recursive rm",)),
    ("sudo true", "shell", RiskLevel.CRITICAL, ("command sudo",)),
    ("/usr/bin/sudo true", "shell", RiskLevel.CRITICAL, ("command sudo",)),
    ("if then (( fi", "shell", RiskLevel.HIGH, ()),
]


@pytest.mark.parametrize(("code", "language", "level", "patterns"), CASES)
def test_assessment(code: str, language: str, level: RiskLevel,
                    patterns: tuple[str, ...]) -> None:
    risk = UnifiedRiskPolicy.assess(code, language)  # type: ignore[arg-type]
    assert risk.level == level, risk
    assert set(patterns) <= set(risk.patterns), risk
    if level > RiskLevel.SAFE or language == "shell":
        assert risk.patterns  # a non-trivial verdict always says why


@pytest.mark.parametrize(("level", "strict", "permissive"), [
    (RiskLevel.SAFE, "proc-bwrap", "proc-bwrap"),
    (RiskLevel.LOW, "docker", "proc-bwrap"),
    (RiskLevel.MEDIUM, "docker", "docker"),
    (RiskLevel.CRITICAL, "docker", "docker"),
])
def test_strict_forces_a_container_for_anything_not_safe(level: RiskLevel, strict: str,
                                                         permissive: str) -> None:
    code = {RiskLevel.SAFE: "print(1)", RiskLevel.LOW: "import json",
            RiskLevel.MEDIUM: "import os", RiskLevel.CRITICAL: "import ctypes"}[level]
    risk = UnifiedRiskPolicy.assess(code, "python")
    assert risk.level == level
    assert UnifiedRiskPolicy.required_sandbox(risk, SecurityMode.STRICT) == strict
    assert UnifiedRiskPolicy.required_sandbox(risk, SecurityMode.PERMISSIVE) == permissive
