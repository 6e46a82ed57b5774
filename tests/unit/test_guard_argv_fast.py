"""The proc matcher's left-to-right argv test (a template repeating only its last slot) admits
exactly what the backtracking ``first_mismatch`` admits, on generated templates and argv."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from policy_engine.guard.matchers import ProcMatcher
from policy_engine.model import ArgAlternative, ArgSlot, ProcCapability
from policy_engine.patterns import first_mismatch

WORDS = ["a", "b", "-x", "--stat", "--oneline", "log", ""]
_ALT = st.one_of(
    st.sampled_from(WORDS).map(lambda w: ArgAlternative(literal=w)),
    st.sampled_from(["^--(oneline|stat)$", "^-[a-z]$", "^[ab]+$"]).map(
        lambda r: ArgAlternative(regex=r)),
)
_SLOT = st.builds(ArgSlot, alternatives=st.lists(_ALT, min_size=1, max_size=3).map(tuple),
                  repeat=st.booleans())


@settings(max_examples=400, deadline=None)
@given(slots=st.lists(_SLOT, max_size=4), args=st.lists(st.sampled_from(WORDS), max_size=6))
def test_fast_argv_test_agrees_with_the_backtracking_one(slots: list[ArgSlot],
                                                         args: list[str]) -> None:
    m = ProcMatcher(ProcCapability(tool="git", args=tuple(slots)))
    assert m.slots is not None
    want = first_mismatch(m.slots, tuple(args)) is None
    assert m.admits(("git", tuple(args))) is want
    assert m.admits(("gitx", tuple(args))) is False


def test_a_template_repeating_a_middle_slot_still_backtracks() -> None:
    rep = ArgSlot(alternatives=(ArgAlternative(regex="^-[a-z]$"),), repeat=True)
    end = ArgSlot(alternatives=(ArgAlternative(literal="-x"),))
    m = ProcMatcher(ProcCapability(tool="git", args=(rep, end)))
    assert m.admits(("git", ("-a", "-x")))
    assert m.admits(("git", ("-x",)))
    assert not m.admits(("git", ("-a",)))
