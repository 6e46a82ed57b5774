"""Path-glob algebra: sound containment, exact disjointness and the meet of two globs.

Globs are absolute and home-expanded (see :mod:`policy_engine.patterns.paths`). The model here
is the one :func:`~policy_engine.patterns.paths.glob_regex` implements: a normalized path other
than ``/`` is a non-empty list of non-empty segments; ``**`` matches zero or more segments and
``*``/``?`` stay inside one segment. The root path ``/`` is the one odd case (the regex sees it
as a single empty segment, which ``/*`` and ``/**`` admit), so it is decided separately by the
regex itself and every answer is checked against it.

Guarantees: :func:`contains` is sound (``True`` ⇒ every path ``b`` admits, ``a`` admits);
:func:`disjoint` is exact; :func:`meet_globs` returns ``EMPTY`` only when provably disjoint, a
single glob only when it admits exactly the paths both admit, and the pair otherwise.
"""

from __future__ import annotations

from collections.abc import Iterable
from functools import cache, lru_cache
from itertools import combinations

from policy_engine.patterns.paths import glob_regex

DS = "**"
EMPTY: tuple[str, ...] = ()
"""The empty conjunction result: no path is admitted."""

_MAX_EXPANSIONS = 64
"""Beyond this many ways to spread ``**`` over a fixed length we stop trying to fold the meet."""


def segments(pattern: str) -> tuple[str, ...]:
    """Split a glob into segments, dropping empty ones and collapsing ``**/**`` (same language)."""
    out: list[str] = []
    for seg in pattern.split("/"):
        if seg and not (seg == DS and out and out[-1] == DS):
            out.append(seg)
    return tuple(out)


def join(segs: tuple[str, ...]) -> str:
    return "/" + "/".join(segs)


def canonical_glob(pattern: str) -> str:
    """The canonical spelling of an absolute glob (no empty segments, no repeated ``**``)."""
    return join(segments(pattern))


@lru_cache(maxsize=8192)
def admits_root(pattern: str) -> bool:
    return glob_regex(pattern).match("/") is not None


# --- one segment ------------------------------------------------------------------------------


def _is_literal(seg: str) -> bool:
    return "*" not in seg and "?" not in seg


@lru_cache(maxsize=8192)
def seg_matches(glob: str, text: str) -> bool:
    """Whether the segment glob admits the literal segment ``text``."""
    return glob_regex("/" + glob).match("/" + text) is not None


@lru_cache(maxsize=8192)
def seg_intersects(x: str, y: str) -> bool:
    """Exact: some non-empty segment is admitted by both ``x`` and ``y`` (product automaton)."""
    seen: set[tuple[int, int, bool]] = set()
    stack = [(0, 0, False)]
    while stack:
        state = stack.pop()
        if state in seen:
            continue
        seen.add(state)
        i, j, consumed = state
        # epsilon moves: a `*` may match nothing
        if i < len(x) and x[i] == "*":
            stack.append((i + 1, j, consumed))
        if j < len(y) and y[j] == "*":
            stack.append((i, j + 1, consumed))
        if i == len(x) and j == len(y) and consumed:
            return True
        if i < len(x) and j < len(y):
            cx, cy = x[i], y[j]
            if cx in "*?" or cy in "*?" or cx == cy:
                stack.append((i if cx == "*" else i + 1, j if cy == "*" else j + 1, True))
    return False


@lru_cache(maxsize=8192)
def seg_contains(x: str, y: str) -> bool:
    """Sound: every segment ``y`` admits, ``x`` admits (an alignment of ``y`` under ``x``)."""
    if x == y or x == "*":
        return True
    if _is_literal(y):
        return seg_matches(x, y)

    @cache
    def cover(i: int, j: int) -> bool:
        if i == len(x):
            return j == len(y)
        if x[i] == "*":
            return cover(i + 1, j) or (j < len(y) and cover(i, j + 1))
        if j == len(y) or y[j] == "*":
            return False
        if x[i] == "?" or x[i] == y[j]:
            return cover(i + 1, j + 1)
        return False

    return cover(0, 0)


_UNKNOWN = "\x00unknown"


def seg_meet(x: str, y: str) -> str | None:
    """One segment glob for ``x ∧ y``, ``None`` if disjoint, or ``_UNKNOWN``."""
    if not seg_intersects(x, y):
        return None
    if x == y or seg_contains(y, x):
        return x
    if seg_contains(x, y):
        return y
    if "*" not in x and "*" not in y and len(x) == len(y):
        # same length, only `?` wildcards: the meet is position-wise
        return "".join(b if a == "?" else a for a, b in zip(x, y, strict=True))
    return _UNKNOWN


# --- segment sequences (non-root paths) -------------------------------------------------------


@lru_cache(maxsize=8192)
def seq_intersects(a: tuple[str, ...], b: tuple[str, ...]) -> bool:
    """Exact: some non-root path is admitted by both segment sequences."""
    seen: set[tuple[int, int, bool]] = set()
    stack = [(0, 0, False)]
    while stack:
        state = stack.pop()
        if state in seen:
            continue
        seen.add(state)
        i, j, consumed = state
        if i < len(a) and a[i] == DS:
            stack.append((i + 1, j, consumed))
        if j < len(b) and b[j] == DS:
            stack.append((i, j + 1, consumed))
        if i == len(a) and j == len(b) and consumed:
            return True
        if i < len(a) and j < len(b):
            x, y = a[i], b[j]
            # INVARIANT: every segment glob admits some non-empty segment, so `**` vs a glob is
            # always satisfiable; two globs need a common segment
            if x == DS or y == DS or seg_intersects(x, y):
                stack.append((i if x == DS else i + 1, j if y == DS else j + 1, True))
    return False


@lru_cache(maxsize=8192)
def seq_contains(a: tuple[str, ...], b: tuple[str, ...]) -> bool:
    """Sound: an alignment maps every element of ``b`` under ``a`` (``**`` absorbs anything)."""

    @cache
    def cover(i: int, j: int) -> bool:
        if j == len(b):
            return all(s == DS for s in a[i:])
        if i == len(a):
            return False
        if a[i] == DS:
            return cover(i + 1, j) or cover(i, j + 1)
        if b[j] == DS:
            return False
        return seg_contains(a[i], b[j]) and cover(i + 1, j + 1)

    return cover(0, 0)


def _expansions(g: tuple[str, ...], n: int) -> list[tuple[str, ...]]:
    """Every way to spread ``g``'s ``**`` over exactly ``n`` segments (each becomes ``*``s)."""
    fixed = sum(1 for s in g if s != DS)
    stars = sum(1 for s in g if s == DS)
    spare = n - fixed
    if spare < 0:
        return []
    out: list[tuple[str, ...]] = []

    def spread(k: int, left: int, counts: list[int]) -> None:
        if len(out) > _MAX_EXPANSIONS:
            return
        if k == stars - 1:
            counts.append(left)
            segs: list[str] = []
            it = iter(counts)
            for s in g:
                segs.extend(["*"] * next(it) if s == DS else [s])
            out.append(tuple(segs))
            counts.pop()
            return
        for c in range(left + 1):
            counts.append(c)
            spread(k + 1, left - c, counts)
            counts.pop()

    spread(0, spare, [])
    return out


def _segwise(a: tuple[str, ...], b: tuple[str, ...]) -> tuple[str, ...] | str | None:
    out: list[str] = []
    for x, y in zip(a, b, strict=True):
        m = DS if x == y == DS else seg_meet(x, y)
        if m is None:
            return None
        if m == _UNKNOWN:
            return _UNKNOWN
        out.append(m)
    return tuple(out)


@lru_cache(maxsize=8192)
def seq_meet(a: tuple[str, ...], b: tuple[str, ...]) -> tuple[str, ...] | str | None:
    """A single sequence for the non-root intersection, ``None`` if disjoint, or ``_UNKNOWN``."""
    if not seq_intersects(a, b):
        return None
    if a == b or seq_contains(b, a):
        return a
    if seq_contains(a, b):
        return b
    a_var, b_var = DS in a, DS in b
    if not a_var and not b_var:
        return _segwise(a, b)
    if a_var and b_var:
        # one `**` at the same place with as many fixed segments around it: both absorb the
        # same number of segments on any path, so the meet is position-wise
        if a.count(DS) == b.count(DS) == 1 and len(a) == len(b) and a.index(DS) == b.index(DS):
            return _segwise(a, b)
        return _UNKNOWN
    fixed, var = (b, a) if a_var else (a, b)
    expansions = _expansions(var, len(fixed))
    if len(expansions) > _MAX_EXPANSIONS:
        return _UNKNOWN
    results: set[tuple[str, ...]] = set()
    for e in expansions:
        m = _segwise(fixed, e)
        if m == _UNKNOWN:
            return _UNKNOWN
        if isinstance(m, tuple):
            results.add(m)
    # several distinct fixed patterns are a union, which one glob cannot say
    return results.pop() if len(results) == 1 else (None if not results else _UNKNOWN)


# --- whole globs ------------------------------------------------------------------------------


def contains(a: str, b: str) -> bool:
    """Sound containment: ``True`` only if every path glob ``b`` admits, glob ``a`` admits."""
    if admits_root(b) and not admits_root(a):
        return False
    return seq_contains(segments(a), segments(b))


def disjoint(a: str, b: str) -> bool:
    """Exact: no normalized path is admitted by both globs."""
    if admits_root(a) and admits_root(b):
        return False
    return not seq_intersects(segments(a), segments(b))


@lru_cache(maxsize=8192)
def meet_globs(a: str, b: str) -> tuple[str, ...]:
    """The meet of two globs as a conjunction: ``()`` (disjoint), ``(c,)`` or ``(a, b)``."""
    # sorted operands make the answer structurally commutative, not just equal as sets
    a, b = sorted((canonical_glob(a), canonical_glob(b)))
    if a == b:
        return (a,)
    both_root = admits_root(a) and admits_root(b)
    m = seq_meet(segments(a), segments(b))
    if m is None:
        # only the root path can be common; the glob `/` admits exactly that
        return ("/",) if both_root else EMPTY
    if isinstance(m, tuple):
        c = join(m)
        # the single glob must agree with both on `/` too, or it is not the meet
        if admits_root(c) == both_root:
            return (c,)
    return tuple(sorted((a, b)))


def simplify_globs(globs: Iterable[str]) -> tuple[str, ...]:
    """Fold a conjunction of globs pairwise; ``()`` if it provably admits nothing.

    :param globs: a non-empty conjunction.
    """
    work = sorted({canonical_glob(g) for g in globs})
    changed = True
    while changed and len(work) > 1:
        changed = False
        for x, y in combinations(work, 2):
            m = meet_globs(x, y)
            if not m:
                return EMPTY
            if len(m) == 1:
                work = sorted({*(g for g in work if g not in (x, y)), m[0]})
                changed = True
                break
    return tuple(work)
