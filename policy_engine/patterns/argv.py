"""Argument templates: argv checked position by position against literals and anchored regexes."""

from __future__ import annotations

from dataclasses import dataclass

from policy_engine.model import ArgSlot
from policy_engine.patterns.regex import PolicyRegex, compile_policy_regex


def compile_arg_regex(pattern: str) -> PolicyRegex:
    """Compile an argument regex on RE2 (linear-time: the argument is the agent's); it must
    match the whole argument (``fullmatch``). ``check`` refuses what RE2 cannot run (SBP208)."""
    return compile_policy_regex(pattern)


@dataclass(frozen=True, slots=True)
class CompiledSlot:
    literals: frozenset[str]
    regexes: tuple[PolicyRegex, ...]
    repeat: bool

    def admits(self, arg: str) -> bool:
        if arg in self.literals:
            return True
        for rx in self.regexes:  # noqa: SIM110 — a loop: cheaper than any() over a generator
            if rx.fullmatch(arg):
                return True
        return False


def compile_slots(slots: tuple[ArgSlot, ...]) -> tuple[CompiledSlot, ...]:
    out = []
    for slot in slots:
        lits = frozenset(a.literal for a in slot.alternatives if a.literal is not None)
        rxs = tuple(compile_arg_regex(a.regex) for a in slot.alternatives if a.regex is not None)
        out.append(CompiledSlot(lits, rxs, slot.repeat))
    return tuple(out)


def first_mismatch(slots: tuple[CompiledSlot, ...], args: tuple[str, ...]) -> int | None:
    """Return ``None`` if ``args`` fit the template, else the index of the first bad argument.

    Repeating slots match zero or more arguments; matching backtracks so the reported index is
    the furthest position any assignment reached.
    """
    n_slots, n_args = len(slots), len(args)
    # reach[i] = set of slot indexes j such that args[:i] can be consumed leaving slots[j:]
    reach: list[set[int]] = [set() for _ in range(n_args + 1)]
    reach[0] = _skip_repeats(slots, {0})
    furthest = 0
    for i in range(n_args):
        nxt: set[int] = set()
        for j in reach[i]:
            if j < n_slots and slots[j].admits(args[i]):
                nxt.add(j if slots[j].repeat else j + 1)
        reach[i + 1] = _skip_repeats(slots, nxt)
        if not reach[i + 1]:
            return i
        furthest = i + 1
    if n_slots in reach[n_args]:
        return None
    return furthest


def _skip_repeats(slots: tuple[CompiledSlot, ...], starts: set[int]) -> set[int]:
    out = set(starts)
    stack = list(starts)
    while stack:
        j = stack.pop()
        if j < len(slots) and slots[j].repeat and j + 1 not in out:
            out.add(j + 1)
            stack.append(j + 1)
    return out
