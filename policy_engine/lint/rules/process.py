"""Rules SBP310-SBP313: proc.exec permits that run shells, inline code or any arguments, or
let a call set a loader/interpreter/tool-hijack environment variable."""

from __future__ import annotations

import re
from collections.abc import Iterator

from policy_engine.dsl import ast
from policy_engine.guard.env import is_hijack
from policy_engine.lint.model import FileView, Finding, LintConfig
from policy_engine.lint.rules.base import RuleView, finding, rule_views, where
from policy_engine.model import CapabilityKind, ProcCapability
from policy_engine.patterns import compile_slots

SHELLS = frozenset({
    "sh", "bash", "zsh", "dash", "ksh", "mksh", "pdksh", "ash", "fish", "csh", "tcsh", "rbash",
    "busybox", "toybox", "cmd", "cmd.exe", "powershell", "powershell.exe", "pwsh", "nu", "xonsh",
    "elvish",
})
"""Programs whose arguments are a command language."""

LAUNCHERS = frozenset({
    "env", "xargs", "sudo", "doas", "su", "runuser", "nohup", "timeout", "nice", "ionice",
    "setsid", "stdbuf", "chroot", "unshare", "nsenter", "flock", "watch", "script", "expect",
    "awk", "gawk", "mawk", "nawk", "busybox",
})
"""Programs that run another program (or a program text) named in their arguments."""

_INTERPRETERS: tuple[tuple[re.Pattern[str], tuple[str, ...], frozenset[str]], ...] = (
    # (tool name, inline-code flags, literals after which options end)
    (re.compile(r"(python|pypy)(\d+(\.\d+)?)?"), ("-c",), frozenset({"-m", "--"})),
    (re.compile(r"(node|nodejs|bun)(\d+)?"), ("-e", "--eval", "-p", "--print"), frozenset({"--"})),
    (re.compile(r"deno"), ("eval",), frozenset()),
    (re.compile(r"perl(\d+(\.\d+)*)?"), ("-e", "-E"), frozenset({"--"})),
    (re.compile(r"ruby(\d+(\.\d+)*)?"), ("-e",), frozenset({"--"})),
    (re.compile(r"php(\d+(\.\d+)*)?"), ("-r",), frozenset({"--"})),
    (re.compile(r"lua(jit|\d+(\.\d+)?)?"), ("-e",), frozenset({"--"})),
    (re.compile(r"Rscript|R"), ("-e", "--expr"), frozenset()),
    (re.compile(r"osascript"), ("-e",), frozenset()),
    (re.compile(r"tclsh(\d+(\.\d+)?)?|wish"), ("-c",), frozenset()),
    (re.compile(r"(j?irb|pry|ipython\d*)"), ("-c", "-e"), frozenset()),
)

_ANYTHING = ("push", "--upload-file", "-delete", "x", "/etc/passwd", "")
"""Arguments a template that constrains nothing admits (used to spot ``/.*/ ...``)."""


def _basename(tool: str) -> str:
    return tool.rsplit("/", 1)[-1]


def interpreter(tool: str) -> tuple[tuple[str, ...], frozenset[str]] | None:
    """The inline-code flags and option terminators of interpreter ``tool``, else ``None``."""
    name = _basename(tool)
    for pattern, flags, stops in _INTERPRETERS:
        if pattern.fullmatch(name):
            return flags, stops
    return None


def _samples(flags: tuple[str, ...]) -> tuple[str, ...]:
    # single-letter flags combine with others: `python -Ic code`, `perl -we code`
    combined = [f"-{p}{f[1:]}" for f in flags if len(f) == 2 for p in ("I", "B", "w", "E", "S")]
    return (*flags, *combined)


def inline_slot(cap: ProcCapability, flags: tuple[str, ...], stops: frozenset[str]) -> int | None:
    """Index of the first slot that admits an inline-code flag while options are still read;
    ``-1`` when there is no template; ``None`` when the template never admits one."""
    if cap.args is None:
        return -1
    samples = _samples(flags)
    for i, (slot, compiled) in enumerate(zip(cap.args, compile_slots(cap.args), strict=True)):
        if any(compiled.admits(s) for s in samples):
            return i
        alts = slot.alternatives
        if not slot.repeat and all(a.literal is not None and (
                not a.literal.startswith("-") or a.literal in stops) for a in alts):
            return None  # a script, a module flag or `--`: what follows is not the interpreter's
    return None


def unconstrained(cap: ProcCapability) -> bool:
    if cap.args is None:
        return True
    slots = compile_slots(cap.args)
    return bool(slots) and all(s.repeat and all(s.admits(a) for a in _ANYTHING) for s in slots)


def _procs(view: FileView) -> Iterator[tuple[RuleView, ProcCapability]]:
    for rv in rule_views(view):
        cap = rv.capabilities.get(CapabilityKind.PROC_EXEC)
        if rv.node.effect == "permit" and isinstance(cap, ProcCapability):
            yield rv, cap


def check_process(view: FileView, cfg: LintConfig) -> Iterator[Finding]:
    """SBP310 shells and launchers, SBP311 interpreters admitting inline code, SBP312 any args."""
    for rv, cap in _procs(view):
        clause = rv.tool()
        if clause is None:
            continue
        name = _basename(cap.tool)
        if name in SHELLS or name in LAUNCHERS:
            what = "a shell" if name in SHELLS else "a program that runs other programs"
            yield finding("SBP310", f"{where(rv)} permits `{cap.tool}`, {what}",
                          clause.tool.span, rv.anchor)
            continue
        interp = interpreter(cap.tool)
        if interp is not None:
            index = inline_slot(cap, *interp)
            if index == -1:
                yield finding("SBP311", f"{where(rv)} permits the interpreter `{cap.tool}` "
                              "with any arguments, so inline code too", clause.tool.span,
                              rv.anchor)
            elif index is not None and clause.args is not None:
                yield finding("SBP311", f"argument {index + 1} of {where(rv)} admits "
                              f"`{interp[0][0]}`: `{cap.tool}` would run inline code",
                              clause.args[index].span, rv.anchor)
            continue
        if unconstrained(cap):
            span = clause.args[0].span if clause.args else clause.tool.span
            yield finding("SBP312", f"{where(rv)} permits `{cap.tool}` with any arguments",
                          span, rv.anchor)


def check_env(view: FileView, cfg: LintConfig) -> Iterator[Finding]:
    """SBP313: an `env` list naming a variable the guard would otherwise refuse."""
    for rv, _cap in _procs(view):
        for clause in rv.node.clauses:
            if not isinstance(clause, ast.EnvClause):
                continue
            for alt in clause.names:
                if alt.literal is not None and is_hijack(alt.literal):
                    yield finding("SBP313", f"{where(rv)} lets a call set `{alt.literal}`, which "
                                  "can make the loader, an interpreter or the tool run other "
                                  "code", alt.span, rv.anchor)


CHECKS = (check_process, check_env)
