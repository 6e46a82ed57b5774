"""UnifiedRiskPolicy (seed 001 §4.2): static risk hints for code, and the sandbox they require.

The assessment is a hint, never the boundary: it is recorded with the result and may only make
the isolation stronger (a container instead of bubblewrap). What the code may do is decided by
the policy for the op it becomes, whatever its risk level.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from enum import IntEnum, StrEnum
from typing import Any, Literal

Language = Literal["python", "shell"]


class RiskLevel(IntEnum):
    SAFE = 0
    LOW = 1
    MEDIUM = 2
    HIGH = 3
    CRITICAL = 4


class SecurityMode(StrEnum):
    """``strict``: anything not SAFE runs in a container. ``permissive`` (development): the
    static hint chooses — SAFE and LOW code may use bubblewrap, MEDIUM and above a container."""

    STRICT = "strict"
    PERMISSIVE = "permissive"


@dataclass(frozen=True, slots=True)
class RiskAssessment:
    level: RiskLevel
    patterns: tuple[str, ...]
    language: str

    def to_json(self) -> dict[str, Any]:
        return {"level": self.level.name, "patterns": list(self.patterns),
                "language": self.language}


# Python: module → level of importing it
_MODULES: dict[str, RiskLevel] = {
    **dict.fromkeys(("os", "pathlib", "shutil", "tempfile", "glob", "io", "sys"),
                    RiskLevel.MEDIUM),
    **dict.fromkeys(("subprocess", "socket", "urllib", "http", "requests", "httpx", "ftplib",
                     "smtplib", "telnetlib", "asyncio", "multiprocessing", "threading",
                     "signal", "pty", "pickle", "marshal", "shelve", "importlib", "runpy",
                     "code", "codeop"), RiskLevel.HIGH),
    **dict.fromkeys(("ctypes", "cffi", "mmap", "resource", "fcntl", "gc", "inspect",
                     "builtins", "posix", "_posixsubprocess"), RiskLevel.CRITICAL),
}
_CALLS: dict[str, RiskLevel] = {
    "open": RiskLevel.LOW, "input": RiskLevel.LOW,
    "eval": RiskLevel.HIGH, "exec": RiskLevel.HIGH, "compile": RiskLevel.HIGH,
    "__import__": RiskLevel.HIGH, "getattr": RiskLevel.MEDIUM, "setattr": RiskLevel.MEDIUM,
    "globals": RiskLevel.HIGH, "locals": RiskLevel.MEDIUM, "vars": RiskLevel.MEDIUM,
    "breakpoint": RiskLevel.HIGH,
}
_DUNDERS = frozenset(("__class__", "__subclasses__", "__globals__", "__builtins__",
                      "__bases__", "__mro__", "__code__", "__dict__", "__getattribute__"))
# shell: first word of a command → level
_COMMANDS: dict[str, RiskLevel] = {
    **dict.fromkeys(("echo", "printf", "true", "false", "cat", "head", "tail", "wc", "sort",
                     "uniq", "cut", "tr", "grep", "sed", "awk", "ls", "pwd", "date", "seq",
                     "test", "[", "expr", "basename", "dirname", "jq"), RiskLevel.SAFE),
    **dict.fromkeys(("cp", "mv", "mkdir", "touch", "tee", "find", "xargs", "tar", "gzip",
                     "zip", "unzip", "ln", "python", "python3", "node", "git", "env",
                     "export", "cd", "source", "."), RiskLevel.MEDIUM),
    **dict.fromkeys(("rm", "curl", "wget", "nc", "ncat", "socat", "ssh", "scp", "rsync",
                     "ftp", "telnet", "bash", "sh", "zsh", "dash", "eval", "exec", "kill",
                     "pkill", "nohup", "setsid", "crontab", "chmod", "chown", "pip", "apt",
                     "apt-get", "npm"), RiskLevel.HIGH),
    **dict.fromkeys(("sudo", "su", "doas", "mount", "umount", "chroot", "nsenter", "unshare",
                     "dd", "mkfs", "fdisk", "insmod", "modprobe", "iptables", "docker",
                     "setcap", "capsh"), RiskLevel.CRITICAL),
}


def _python(code: str) -> tuple[RiskLevel, list[str]]:
    try:
        tree = ast.parse(code)
    except (SyntaxError, ValueError) as exc:  # unparseable: assume the worst, hint-wise
        return RiskLevel.HIGH, [f"unparseable: {type(exc).__name__}"]
    level, found = RiskLevel.SAFE, []

    def note(lvl: RiskLevel, what: str) -> None:
        nonlocal level
        level = max(level, lvl)
        if what not in found:
            found.append(what)

    for node in ast.walk(tree):
        if isinstance(node, ast.Import | ast.ImportFrom):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""])
            for name in names:
                root = name.split(".")[0]
                note(_MODULES.get(root, RiskLevel.LOW), f"import {root}")
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) \
                and node.func.id in _CALLS:
            note(_CALLS[node.func.id], f"call {node.func.id}()")
        elif isinstance(node, ast.Attribute) and node.attr in _DUNDERS:
            note(RiskLevel.CRITICAL, f"introspection .{node.attr}")
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) \
                and node.value in _DUNDERS:
            note(RiskLevel.CRITICAL, f"introspection '{node.value}'")
    return level, found


def _shell(code: str) -> tuple[RiskLevel, list[str]]:
    try:
        import bashlex  # type: ignore[import-untyped]

        trees = bashlex.parse(code)
    except Exception as exc:  # bashlex raises its own errors and others on odd input
        return RiskLevel.HIGH, [f"unparseable: {type(exc).__name__}"]
    level, found = RiskLevel.SAFE, []

    def note(lvl: RiskLevel, what: str) -> None:
        nonlocal level
        level = max(level, lvl)
        if what not in found:
            found.append(what)

    class Visitor(bashlex.ast.nodevisitor):  # type: ignore[misc]
        def visitcommand(self, node: Any, parts: Any) -> None:
            words = [p.word for p in parts if p.kind == "word"]
            if words:
                name = words[0].rsplit("/", 1)[-1]
                note(_COMMANDS.get(name, RiskLevel.MEDIUM), f"command {name}")
                if name == "rm" and any(w.startswith("-") and "r" in w for w in words[1:]):
                    note(RiskLevel.HIGH, "recursive rm")

        def visitredirect(self, node: Any, input: Any, type: Any, output: Any,
                          heredoc: Any) -> None:
            target = getattr(output, "word", "") if output is not None else ""
            if isinstance(target, str) and target.startswith("/") and target != "/dev/null":
                note(RiskLevel.HIGH, f"redirect to {target}")

        def visitcommandsubstitution(self, node: Any, command: Any) -> None:
            note(RiskLevel.MEDIUM, "command substitution")

        def visitprocesssubstitution(self, node: Any, command: Any) -> None:
            note(RiskLevel.MEDIUM, "process substitution")

        def visitpipe(self, node: Any, pipe: Any) -> None:
            note(RiskLevel.LOW, "pipe")

    for tree in trees:
        Visitor().visit(tree)
    return level, found


class UnifiedRiskPolicy:
    """Static assessment and the sandbox a security mode requires for it."""

    @staticmethod
    def assess(code: str, language: Language) -> RiskAssessment:
        level, found = _python(code) if language == "python" else _shell(code)
        return RiskAssessment(level, tuple(found), language)

    @staticmethod
    def required_sandbox(risk: RiskAssessment, mode: SecurityMode) -> str:
        """The executor to run on: ``proc-bwrap`` or ``docker`` (a container)."""
        threshold = RiskLevel.SAFE if mode is SecurityMode.STRICT else RiskLevel.LOW
        return "proc-bwrap" if risk.level <= threshold else "docker"
