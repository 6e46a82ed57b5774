"""Permit rules indexed by resource, so the meet visits only rules that can meet the grant.

The profile builder meets the grant ∩ manifest atoms of a kind with every permit rule of that
kind; with a thousand rules that is a thousand atom meets per kind, almost all of them empty.
This index, built once per policy and kind, answers "which rules could have a non-empty meet with
these atoms" and may answer too many, never too few. Each skip is one the exact meet would also
have found empty, so the profile (and its hash) is the same with or without the index
(``tests/unit/test_rule_index.py`` compares the two on generated policies):

- fs: a path atom's leading literal segments (before the first ``*``/``?`` segment) must agree
  with the rule's wherever both have one: two different literal segments at the same depth admit
  no common path, and ``path_meet.disjoint`` is exact, so the meet is empty too;
- net.http and browser.use: an exact name meets another exact name only when equal, and a
  ``*.suffix`` only when it ends with it; every other pattern (``*``, IPs, CIDRs) is always a
  candidate;
- proc.exec: the tools must be equal (the meet compares them as strings);
- every other kind: every rule is a candidate.

Rule atoms are decomposed here once, not on every build.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass, field

from policy_engine.graph import CompiledRule, PolicySet
from policy_engine.model import CapabilityKind
from policy_engine.patterns.hosts import HostPattern
from policy_engine.patterns.meet import Atom, BrowserAtom, FsAtom, NetAtom, ProcAtom, decompose
from policy_engine.patterns.path_meet import segments


def _literal_head(globs: Sequence[str]) -> tuple[str, ...]:
    """The longest leading run of literal segments among ``globs`` (each bounds the atom)."""
    best: tuple[str, ...] = ()
    for g in globs:
        head: list[str] = []
        for seg in segments(g):
            if "*" in seg or "?" in seg:
                break
            head.append(seg)
        if len(head) > len(best):
            best = tuple(head)
    return best


def _exact_name(hosts: Sequence[str]) -> str | None:
    """An exact host name the atom is bounded by (any one of a conjunction), or ``None``."""
    for h in hosts:
        p = HostPattern.of(h)
        if p.kind == "exact":
            return p.value
    return None


@dataclass
class _Trie:
    rules: set[int] = field(default_factory=set)
    children: dict[str, _Trie] = field(default_factory=dict)

    def add(self, path: tuple[str, ...], pos: int) -> None:
        node = self
        for seg in path:
            node = node.children.setdefault(seg, _Trie())
        node.rules.add(pos)

    def collect(self, path: tuple[str, ...], out: set[int]) -> None:
        """Rules whose head is a prefix of ``path``, or extends it."""
        node = self
        out |= node.rules
        for seg in path:
            child = node.children.get(seg)
            if child is None:
                return
            node = child
            out |= node.rules
        stack = list(node.children.values())
        while stack:
            n = stack.pop()
            out |= n.rules
            stack.extend(n.children.values())


class KindIndex:
    """The permit rules of one kind with their atoms, and the lookups that bound a meet."""

    def __init__(self, rules: Sequence[CompiledRule], kind: CapabilityKind, home: str) -> None:
        self.rules = tuple(rules)
        self.atoms: tuple[tuple[Atom, ...], ...] = tuple(
            decompose(r.capabilities[kind], home) for r in self.rules)
        self._always: set[int] = set()
        self._paths = _Trie()
        self._names: dict[str, set[int]] = {}
        self._suffixes: dict[str, set[int]] = {}
        self._tools: dict[str, set[int]] = {}
        for pos, atoms in enumerate(self.atoms):
            for atom in atoms:
                self._add(pos, atom)

    def _add(self, pos: int, atom: Atom) -> None:
        if isinstance(atom, FsAtom):
            self._paths.add(_literal_head(atom.globs), pos)
        elif isinstance(atom, NetAtom | BrowserAtom) and len(atom.hosts) == 1:
            p = HostPattern.of(atom.hosts[0])
            if p.kind == "exact":
                self._names.setdefault(p.value, set()).add(pos)
            elif p.kind == "suffix":
                self._suffixes.setdefault(p.value, set()).add(pos)
            else:
                self._always.add(pos)
        elif isinstance(atom, ProcAtom):
            self._tools.setdefault(atom.tool, set()).add(pos)
        else:
            self._always.add(pos)

    def candidates(self, base: Sequence[Atom]) -> list[int]:
        """Positions (in policy order) of the rules whose meet with ``base`` may be non-empty."""
        out = set(self._always)
        for atom in base:
            if isinstance(atom, FsAtom):
                self._paths.collect(_literal_head(atom.globs), out)
            elif isinstance(atom, NetAtom | BrowserAtom):
                name = _exact_name(atom.hosts)
                if name is None:
                    return list(range(len(self.rules)))
                out |= self._names.get(name, set())
                labels = name.split(".")
                for i in range(len(labels)):
                    out |= self._suffixes.get(".".join(labels[i:]), set())
            elif isinstance(atom, ProcAtom):
                out |= self._tools.get(atom.tool, set())
            else:
                return list(range(len(self.rules)))
        return sorted(out)


class RuleIndex:
    """Per kind, the :class:`KindIndex` of a policy's permits, built on first use."""

    def __init__(self, policyset: PolicySet) -> None:
        self._ps = policyset
        self._lock = threading.Lock()
        self._kinds: dict[CapabilityKind, KindIndex] = {}

    def kind(self, kind: CapabilityKind) -> KindIndex:
        found = self._kinds.get(kind)
        if found is None:
            with self._lock:
                found = self._kinds.get(kind)
                if found is None:
                    found = KindIndex(self._ps.permits_by_kind.get(kind, ()), kind,
                                      self._ps.home)
                    self._kinds[kind] = found
        return found
