"""Finite automata for the exact diff: regexes and globs to NFAs, the cells of their Venn diagram.

A dimension whose values are strings (paths, host names, one argument) is split into *cells*:
the non-empty regions of the Venn diagram of every pattern either policy version names there.
Two values in one cell are matched by exactly the same patterns, so every rule decides them
alike; one shortest witness per cell therefore covers the whole dimension. The cells are found
by a breadth-first walk of the product of the patterns' NFAs (subset construction on the fly),
over an alphabet compressed to the elementary intervals that the patterns' character sets cut
out of Unicode. The walk is bounded (:data:`MAX_STATES`); past it the dimension is reported as
too complex to decide exactly, never as unchanged.

Regexes are read with CPython's own parser (``re._parser``) under RE2's meaning of the classes
(``\\d``, ``\\w``, ``\\s`` are ASCII; ``.`` is any code point but newline), which is the syntax
``policy_engine.patterns.regex`` accepts; a construct outside regular languages (backreferences,
lookaround) or a flag that changes matching is refused as too complex.
"""

from __future__ import annotations

import importlib
import re
from collections import deque
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

# CPython's own regex parser and opcode table (no stubs: private modules, stable since 3.11)
sre: Any = importlib.import_module("re._parser")
C: Any = importlib.import_module("re._constants")

MAX_STATES = 20_000
"""Product states one Venn walk may visit before it gives up (documented in docs/cli.md)."""
MAX_WORK = 4_000_000
"""Product states times patterns one walk may visit: with many patterns the state bound shrinks,
so a walk's time stays bounded too (each state steps every pattern)."""
MAX_UNICODE = 0x10FFFF

Interval = tuple[int, int]
CharSet = tuple[Interval, ...]


class TooComplex(Exception):
    """The automaton would exceed :data:`MAX_STATES`, or the pattern is not a regular language."""


_DIGIT: CharSet = ((0x30, 0x39),)
_WORD: CharSet = ((0x30, 0x39), (0x41, 0x5A), (0x5F, 0x5F), (0x61, 0x7A))
_SPACE: CharSet = ((0x09, 0x0A), (0x0C, 0x0D), (0x20, 0x20))
_ANY_BUT_NL: CharSet = ((0, 0x09), (0x0B, MAX_UNICODE))
ANY: CharSet = ((0, MAX_UNICODE),)


def negate(cs: CharSet) -> CharSet:
    out: list[Interval] = []
    nxt = 0
    for lo, hi in sorted(cs):
        if lo > nxt:
            out.append((nxt, lo - 1))
        nxt = max(nxt, hi + 1)
    if nxt <= MAX_UNICODE:
        out.append((nxt, MAX_UNICODE))
    return tuple(out)


def chars(text: str) -> CharSet:
    return tuple((ord(c), ord(c)) for c in text)


@dataclass
class NFA:
    """States are ints; ``moves`` are (source, char set or symbol set, target); 0 is the start.

    A symbol NFA (argv templates over argument cells) labels moves with frozensets of symbols.
    """

    accept: set[int] = field(default_factory=set)
    eps: dict[int, set[int]] = field(default_factory=dict)
    moves: list[tuple[int, CharSet | frozenset[Hashable], int]] = field(default_factory=list)
    size: int = 1

    def new(self) -> int:
        self.size += 1
        if self.size > MAX_STATES:
            raise TooComplex(f"more than {MAX_STATES} automaton states")
        return self.size - 1

    def link(self, a: int, b: int) -> None:
        self.eps.setdefault(a, set()).add(b)


# ---- regexes -----------------------------------------------------------------------------------

_CATEGORY = {C.CATEGORY_DIGIT: _DIGIT, C.CATEGORY_NOT_DIGIT: negate(_DIGIT),
             C.CATEGORY_WORD: _WORD, C.CATEGORY_NOT_WORD: negate(_WORD),
             C.CATEGORY_SPACE: _SPACE, C.CATEGORY_NOT_SPACE: negate(_SPACE)}


def _in_set(items: list[tuple[Any, Any]]) -> CharSet:
    out: list[Interval] = []
    neg = False
    for op, av in items:
        if op is C.NEGATE:
            neg = True
        elif op is C.LITERAL:
            out.append((int(av), int(av)))
        elif op is C.RANGE:
            lo, hi = av
            out.append((lo, hi))
        elif op is C.CATEGORY and av in _CATEGORY:
            out.extend(_CATEGORY[av])
        else:
            raise TooComplex(f"character class item `{op}` is not supported")
    return negate(tuple(out)) if neg else tuple(out)


def regex_nfa(pattern: str) -> NFA:
    """An NFA accepting exactly the strings ``pattern`` fully matches (RE2 semantics).

    :raises TooComplex: a construct that is not regular here, or too many states.
    """
    try:
        parsed = sre.parse(pattern)
    except re.error as exc:
        raise TooComplex(f"regex `{pattern}` does not parse: {exc}") from None
    except RecursionError:
        raise TooComplex(f"regex `{pattern[:40]}` nests too deeply") from None
    if parsed.state.flags & ~(C.SRE_FLAG_UNICODE):
        raise TooComplex(f"regex `{pattern}` uses a flag the exact engine does not model")
    nfa = NFA()
    end = _seq(nfa, list(parsed), 0, top=True)
    nfa.accept.add(end)
    return nfa


def _seq(nfa: NFA, items: list[tuple[Any, Any]], start: int, *, top: bool = False) -> int:
    cur = start
    for i, (op, av) in enumerate(items):
        if op is C.AT:
            # ``^`` first and ``$``/``\z`` last are implied by the full match; elsewhere they
            # make the language depend on position: not modelled
            if top and ((i == 0 and av in (C.AT_BEGINNING, C.AT_BEGINNING_STRING)) or
                        (i == len(items) - 1 and av in (C.AT_END, C.AT_END_STRING))):
                continue
            raise TooComplex("an anchor inside the regex is not supported")
        cur = _item(nfa, op, av, cur)
    return cur


def _edge(nfa: NFA, cur: int, cs: CharSet) -> int:
    nxt = nfa.new()
    nfa.moves.append((cur, cs, nxt))
    return nxt


def _item(nfa: NFA, op: Any, av: Any, cur: int) -> int:
    if op is C.LITERAL:
        return _edge(nfa, cur, ((int(av), int(av)),))
    if op is C.NOT_LITERAL:
        return _edge(nfa, cur, negate(((int(av), int(av)),)))
    if op is C.ANY:
        return _edge(nfa, cur, _ANY_BUT_NL)
    if op is C.IN:
        return _edge(nfa, cur, _in_set(list(av)))
    if op is C.SUBPATTERN:
        _group, add, sub, body = av
        if add or sub:
            raise TooComplex("inline flags are not supported")
        return _seq(nfa, list(body), cur)
    if op is C.BRANCH:
        _, alts = av
        end = nfa.new()
        for alt in alts:
            nfa.link(_seq(nfa, list(alt), cur), end)
        return end
    if op in (C.MAX_REPEAT, C.MIN_REPEAT, C.POSSESSIVE_REPEAT):
        lo, hi, body = av
        return _repeat(nfa, list(body), cur, lo, None if hi is C.MAXREPEAT else hi)
    raise TooComplex(f"regex construct `{op}` is not supported")


def _repeat(nfa: NFA, body: list[tuple[Any, Any]], cur: int, lo: int,
            hi: int | None) -> int:
    if lo + (hi or 0) > 256:
        raise TooComplex("a counted repetition above 256 is not supported")
    for _ in range(lo):
        cur = _seq(nfa, body, cur)
    if hi is None:
        loop = nfa.new()
        nfa.link(cur, loop)
        back = _seq(nfa, body, loop)
        nfa.link(back, loop)
        return loop
    end = nfa.new()
    nfa.link(cur, end)
    for _ in range(hi - lo):
        cur = _seq(nfa, body, cur)
        nfa.link(cur, end)
    return end


def literal_nfa(text: str) -> NFA:
    nfa = NFA()
    cur = 0
    for c in text:
        cur = _edge(nfa, cur, ((ord(c), ord(c)),))
    nfa.accept.add(cur)
    return nfa


def union(parts: Sequence[NFA]) -> NFA:
    """One NFA accepting what any of ``parts`` accepts (the empty union accepts nothing)."""
    out = NFA()
    for part in parts:
        base = out.size
        out.size += part.size
        if out.size > MAX_STATES:
            raise TooComplex(f"more than {MAX_STATES} automaton states")
        out.link(0, base)
        for a, bs in part.eps.items():
            for b in bs:
                out.link(a + base, b + base)
        out.moves += [(a + base, lab, b + base) for a, lab, b in part.moves]
        out.accept |= {s + base for s in part.accept}
    return out


# ---- the Venn walk -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Cell:
    """One non-empty region: the indexes of the patterns matching it, and a shortest member."""

    inside: frozenset[int]
    witness: tuple[object, ...]


def _atoms(nfas: Sequence[NFA]) -> list[Interval]:
    cuts = {0, MAX_UNICODE + 1}
    for nfa in nfas:
        for _, lab, _ in nfa.moves:
            for lo, hi in cast(CharSet, lab):
                cuts.add(lo)
                cuts.add(hi + 1)
    pts = sorted(cuts)
    return list(zip(pts, [p - 1 for p in pts[1:]], strict=False))


def _merged(atoms: list[Interval], nfas: Sequence[NFA]) -> list[Interval]:
    """One atom per class of atoms no move tells apart (fewer letters to walk), the most
    readable of each class kept as its witness."""
    labels = {cast(CharSet, lab) for n in nfas for _, lab, _ in n.moves}
    classes: dict[tuple[bool, ...], Interval] = {}
    for lo, hi in atoms:
        sig = tuple(any(x <= lo <= y for x, y in lab) for lab in labels)
        best = classes.get(sig)
        if best is None or _rank(_representative(lo, hi)) < _rank(_representative(*best)):
            classes[sig] = (lo, hi)
    return list(classes.values())


_PREFERRED = "abcdefghijklmnopqrstuvwxyz0123456789-_ABCDEFGHIJKLMNOPQRSTUVWXYZ"


def _representative(lo: int, hi: int) -> str:
    for c in _PREFERRED:
        if lo <= ord(c) <= hi:
            return c
    for code in range(max(lo, 0x21), min(hi, 0x7E) + 1):
        return chr(code)
    if lo <= 0xE9 <= hi:
        return "é"
    return chr(lo if not 0xD800 <= lo <= 0xDFFF else 0xE000)


def _rank(label: object) -> int:
    i = _PREFERRED.find(str(label))
    return i if i >= 0 else len(_PREFERRED) + ord(str(label)[0])


class _Runner:
    """One NFA determinised on the fly: subset states get int ids, moves a table per id."""

    def __init__(self, nfa: NFA, atoms: Sequence[Hashable], char: bool) -> None:
        self.nfa = nfa
        self.n_atoms = len(atoms)
        self.by_state: dict[int, list[tuple[frozenset[int], int]]] = {}
        for a, lab, b in nfa.moves:
            if char:
                ranges, spans = cast(CharSet, lab), cast(Sequence[Interval], atoms)
                hit = frozenset(i for i, (lo, _) in enumerate(spans)
                                if any(x <= lo <= y for x, y in ranges))
            else:
                symbols = cast(frozenset[Hashable], lab)
                hit = frozenset(i for i, s in enumerate(atoms) if s in symbols)
            self.by_state.setdefault(a, []).append((hit, b))
        self.ids: dict[frozenset[int], int] = {}
        self.sets: list[frozenset[int]] = []
        self.table: list[list[int]] = []
        self.accepting: list[bool] = []
        self.dead = self.intern(frozenset())
        self.start = self.intern(self.closure({0}))

    def intern(self, states: frozenset[int]) -> int:
        got = self.ids.get(states)
        if got is None:
            got = self.ids[states] = len(self.sets)
            self.sets.append(states)
            self.table.append([-1] * self.n_atoms)
            self.accepting.append(bool(states & self.nfa.accept))
        return got

    def closure(self, states: set[int]) -> frozenset[int]:
        stack, seen = list(states), set(states)
        while stack:
            for b in self.nfa.eps.get(stack.pop(), ()):
                if b not in seen:
                    seen.add(b)
                    stack.append(b)
        return frozenset(seen)

    def step(self, sid: int, atom: int) -> int:
        row = self.table[sid]
        got = row[atom]
        if got < 0:
            nxt = {b for s in self.sets[sid] for hit, b in self.by_state.get(s, ())
                   if atom in hit}
            got = row[atom] = self.intern(self.closure(nxt)) if nxt else self.dead
        return got


def venn(universe: NFA, patterns: Sequence[NFA], *, symbols: Sequence[Hashable] | None = None,
         max_states: int = MAX_STATES, stop: frozenset[int] | None = None) -> list[Cell]:
    """Every non-empty cell of the patterns' Venn diagram within ``universe``, with a witness.

    Char NFAs yield witnesses as tuples of one-character strings; symbol NFAs (``symbols`` given)
    as tuples of symbols. ``stop``: return as soon as that cell is found (an emptiness test).
    :raises TooComplex: more than ``max_states`` product states.
    """
    char = symbols is None
    max_states = min(max_states, MAX_WORK // max(1, len(patterns)))
    atoms: Sequence[Hashable] = (_merged(_atoms([universe, *patterns]), [universe, *patterns])
                                 if char else list(symbols or ()))
    labels: list[object] = ([_representative(lo, hi) for lo, hi in cast(list[Interval], atoms)]
                            if char else list(atoms))
    uni = _Runner(universe, atoms, char)
    runners = [_Runner(n, atoms, char) for n in patterns]
    start = (uni.start, *(r.start for r in runners))
    parent: dict[tuple[int, ...], tuple[tuple[int, ...] | None, int]] = {start: (None, -1)}
    queue = deque([start])
    found: dict[frozenset[int], tuple[int, ...]] = {}
    # readable witnesses: letters before digits before punctuation, at equal length
    order = sorted(range(len(atoms)), key=lambda a: _rank(labels[a]) if char else a)
    pairs = list(enumerate(runners))
    tables = [r.table for r in runners]
    while queue:
        state = queue.popleft()
        if uni.accepting[state[0]]:
            inside = frozenset(i for i, r in pairs if r.accepting[state[i + 1]])
            found.setdefault(inside, state)
            if inside == stop:
                break
        for a in order:
            u = uni.step(state[0], a)
            if u == uni.dead:
                continue
            # the common case reads the tables directly (a call per pattern costs ~2x here)
            row = [t[q][a] for t, q in zip(tables, state[1:], strict=True)]
            if -1 in row:
                row = [r.step(q, a) for r, q in zip(runners, state[1:], strict=True)]
            nxt = (u, *row)
            if nxt not in parent:
                if len(parent) >= max_states:
                    raise TooComplex(f"more than {max_states} product states")
                parent[nxt] = (state, a)
                queue.append(nxt)
    cells = []
    for inside, fstate in found.items():
        word: list[object] = []
        cur: tuple[int, ...] | None = fstate
        while cur is not None:
            prev, a = parent[cur]
            if a >= 0:
                word.append(labels[a])
            cur = prev
        cells.append(Cell(inside, tuple(reversed(word))))
    return sorted(cells, key=lambda c: (len(c.witness), sorted(c.inside)))


def intersects(universe: NFA, a: NFA, b: NFA) -> bool:
    """Whether some member of ``universe`` is accepted by both ``a`` and ``b``."""
    both = frozenset({0, 1})
    return any(c.inside == both for c in venn(universe, [a, b], stop=both))
