"""The permits of one kind indexed by resource, so a decision tests only those that can admit it.

The guard takes the first permit (in profile order) whose members all admit the resource; with
thousands of permits of a kind, a path no permit admits was tested against every one
(≈ 0.2 µs each). This index answers "which permits could admit this resource", in profile order,
and may answer too many, never too few: every permit it leaves out is one whose ``test`` is
false, so the untraced scan finds the same first match, the same refused conditions and the same
default deny. A traced decision scans every permit as before (its trace names each one).
``tests/unit/test_guard_permit_index.py`` compares the two on generated permits and paths.

- fs kinds: a permit's first path matcher whose globs are all literal paths or ``P/**`` subtrees
  admits only paths whose leading segments are one of those literals; it is filed under them in
  a segment trie. Any other glob (``/**``, ``**/x``, ``/a/*/b``) makes it a candidate always.
- proc.exec: a permit whose first member names a tool admits only that tool.
- other kinds are not indexed.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from policy_engine.guard.matchers import FsMatcher, Matcher, ProcMatcher

MIN_PERMITS = 24
"""Below this many permits of a kind a plain scan is cheaper than a lookup."""

_FS_KINDS = frozenset({"fs.read", "fs.write", "fs.list"})


class _Node:
    __slots__ = ("here", "children")

    def __init__(self) -> None:
        self.here: list[int] = []
        self.children: dict[str, _Node] = {}


class PermitIndex:
    """Candidates among ``len(members)`` permits of one kind (``members[i]``: permit ``i``'s)."""

    __slots__ = ("kind", "always", "root", "by_tool")

    def __init__(self, kind: str, members: Sequence[Sequence[Matcher]]) -> None:
        self.kind = kind
        self.always: list[int] = []
        self.root = _Node()
        self.by_tool: dict[str, list[int]] = {}
        for i, ms in enumerate(members):
            if not self._file(i, ms):
                self.always.append(i)

    def _file(self, i: int, members: Sequence[Matcher]) -> bool:
        """File permit ``i`` under the keys that bound it; ``False`` when nothing does."""
        if self.kind in _FS_KINDS:
            m = next((m for m in members if isinstance(m, FsMatcher)), None)
            if m is None:
                return False
            gs = m.globs
            if gs.everything or gs.tails or gs.regex is not None:
                return False
            for head in _outermost(set(gs.exact) | {p[:-1] for p in gs.prefixes}):
                node = self.root
                for seg in head.split("/"):
                    if seg:
                        node = node.children.setdefault(seg, _Node())
                node.here.append(i)
            return True  # no glob at all: it admits nothing, a candidate for nothing
        if self.kind == "proc.exec":
            p = next((m for m in members if isinstance(m, ProcMatcher)), None)
            if p is None:
                return False
            self.by_tool.setdefault(p.tool, []).append(i)
            return True
        return False

    def candidates(self, res: Any) -> list[int] | None:
        """Ascending indexes of the permits that may admit ``res``; ``None``: all of them."""
        if self.kind in _FS_KINDS:
            if type(res) is not str:
                return None
            node = self.root
            parts = [self.always, node.here]  # `here` at the root: the glob `/` alone
            for seg in res.split("/"):
                if not seg:
                    continue
                child = node.children.get(seg)
                if child is None:
                    break
                node = child
                if node.here:
                    parts.append(node.here)
        elif self.kind == "proc.exec":
            tool = res[0] if type(res) is tuple and res else None
            if type(tool) is not str:
                return None
            parts = [self.always, self.by_tool.get(tool, [])]
        else:
            return None
        found = [i for part in parts for i in part]
        if len(found) > 1 and sum(1 for part in parts if part) > 1:
            found.sort()  # each part is ascending: only a merge of two or more needs it
        return found


def _outermost(heads: set[str]) -> list[str]:
    """``heads`` without those beneath another one (so a path meets a permit at most once)."""
    kept: list[str] = []
    for h in sorted(heads, key=len):
        if not any(h == k or h.startswith(k + "/") or k == "/" for k in kept):
            kept.append(h)
    return kept


def permit_index(kind: str, members: Sequence[Sequence[Matcher]]) -> PermitIndex | None:
    """An index over the permits of ``kind`` when there are enough of them and it can help."""
    if len(members) < MIN_PERMITS or (kind not in _FS_KINDS and kind != "proc.exec"):
        return None
    return PermitIndex(kind, members)
