"""The guard's remembered answers (a repeated deny, a default refusal, a forbid set's verdict per
path, a checked method) and its refusals answered without raising never change an answer."""

from __future__ import annotations

from typing import Any

import pytest

from policy_engine.errors import ErrorCode, PolicyEngineError
from policy_engine.guard import Guard, stages, steps, verdict
from policy_engine.guard.compiled import CompiledProfile
from policy_engine.guard.fields import GOOD_METHODS
from policy_engine.guard.paths import normalize_path, quote
from policy_engine.model import (
    ArgAlternative,
    ArgSlot,
    BrowserNavOp,
    FsReadOp,
    FsWriteOp,
    NetHttpCapability,
    NetHttpOp,
    ProcCapability,
    ProcExecOp,
)
from tests.unit.guard_fixtures import NOW, forbid, fs, make_profile, permit
from tests.unit.test_guard_paths import _spellings


def _answer(d: Any) -> tuple[Any, ...]:
    return d.decision, d.code, d.http_status, d.reason, d.rule, d.profile_hash, d.limits


@pytest.mark.parametrize("variant", ["plain", "cel"])
@pytest.mark.parametrize("symlinks", [False, True])
def test_repeated_untraced_answers_equal_the_traced_one_on_the_corpus(variant: str,
                                                                      symlinks: bool) -> None:
    # a traced call never reads or fills a memo: every untraced answer, the first (which fills
    # them) and the repeats (which read them), must be the traced call's, trace aside
    from benchmarks.peers import common, policy_engine_peer

    cases = common.load_cases(variant)
    engine = policy_engine_peer.Engine(variant, cases, resolve_symlinks=symlinks)
    # the benchmark's guard (no disk facts: the corpus's answers), and one reading this host's
    for guard in (engine.guard, Guard(engine.policyset, resolve_symlinks=symlinks)):
        for _ in range(2):  # the second round finds every memo filled by the first
            for case in cases:
                profile, op, now = engine.prepare(case)
                traced = guard.decide(profile, op, now_ms=now, trace=True)
                for _ in range(3):
                    got = guard.decide(profile, op, now_ms=now)
                    assert got.trace is None
                    assert _answer(got) == _answer(traced), case.label
                    if guard is engine.guard:
                        assert got.allowed is case.want, case.label


def test_a_repeated_deny_is_one_object_per_reason_rule_code_and_profile() -> None:
    prof = make_profile(capabilities=(permit("fs.read", fs("fs.read", "/workspace/**")),),
                        profile_hash="h1")
    other = prof.model_copy(update={"profile_hash": "h2"})
    g = Guard()
    first = g.decide(prof, FsReadOp(path="/etc/passwd"), now_ms=NOW)
    assert not first.allowed
    assert g.decide(prof, FsReadOp(path="/etc/passwd"), now_ms=NOW) is first
    # another profile's hash: its own deny naming it, equal otherwise
    second = g.decide(other, FsReadOp(path="/etc/passwd"), now_ms=NOW)
    assert second is not first
    assert second.profile_hash == "h2"
    assert (second.code, second.reason) == (first.code, first.reason)
    # one entry per reason: the first profile's deny is built again, equal, then remembered
    again = g.decide(prof, FsReadOp(path="/etc/passwd"), now_ms=NOW)
    assert again == first
    # traced: a fresh deny carrying its trace, never the remembered one
    traced = g.decide(prof, FsReadOp(path="/etc/passwd"), now_ms=NOW, trace=True)
    assert traced is not again
    assert traced.trace
    assert g.decide(prof, FsReadOp(path="/etc/passwd"), now_ms=NOW) is again
    # another resource: another reason, another object
    assert g.decide(prof, FsReadOp(path="/etc/group"), now_ms=NOW).reason != first.reason


def test_the_deny_memo_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(verdict, "_DENIES", {})
    monkeypatch.setattr(verdict, "_DENIES_MAX", 8)
    prof = make_profile(capabilities=(permit("fs.read", fs("fs.read", "/workspace/**")),),
                        profile_hash="h")
    g = Guard()
    for i in range(50):
        assert not g.decide(prof, FsReadOp(path=f"/etc/f{i}"), now_ms=NOW).allowed
        assert len(verdict._DENIES) <= 8


@pytest.mark.parametrize(("op", "code"), [
    (FsReadOp(path="/workspace/../etc/shadow"), ErrorCode.CAPABILITY_BLOCKED),
    (FsReadOp(path="workspace/a"), ErrorCode.CAPABILITY_BLOCKED),
    (FsReadOp(path="/workspace/a\x00b"), ErrorCode.CAPABILITY_BLOCKED),
    (FsWriteOp(path="/workspace/w/../../etc/x"), ErrorCode.CAPABILITY_BLOCKED),
    (BrowserNavOp(url="file:///etc/passwd"), ErrorCode.CAPABILITY_BLOCKED),
    (BrowserNavOp(url="https://user@example.com/"), ErrorCode.CAPABILITY_BLOCKED),
    (NetHttpOp(url="https://example.com/", method="GE T"), ErrorCode.SCHEMA_VALIDATION_FAILED),
    (ProcExecOp(tool="git status; rm -rf /"), ErrorCode.DENY_TOOL),
    (ProcExecOp(tool="git", args=("a\x00",)), ErrorCode.SCHEMA_VALIDATION_FAILED),
])
def test_a_refusal_answered_without_raising_keeps_its_code_and_reason(op: Any,
                                                                     code: ErrorCode) -> None:
    # untraced, the resolve step answers these itself (no exception through the chain);
    # traced, they raise as before and ``decide`` answers them: both the same deny
    prof = make_profile(capabilities=(
        permit("fs.read", fs("fs.read", "/**")), permit("fs.write", fs("fs.write", "/**")),
    ), profile_hash="h")
    g = Guard(resolve_symlinks=False)
    traced = g.decide(prof, op, now_ms=NOW, trace=True)
    assert traced.code == code.value
    assert [s.node for s in traced.trace or ()][-2:] == ["resolve", "decision"]
    for _ in range(2):
        untraced = g.decide(prof, op, now_ms=NOW)
        assert _answer(untraced) == _answer(traced)


def test_a_non_string_path_is_refused_as_normalize_path_refuses_it() -> None:
    prof = make_profile(capabilities=(permit("fs.read", fs("fs.read", "/**")),))
    op = FsReadOp.model_construct(kind="fs.read", path=b"/workspace/a", offset=None, len=None)
    with pytest.raises(PolicyEngineError) as exc:
        normalize_path(op.path)
    for trace in (False, True):
        d = Guard(resolve_symlinks=False).decide(prof, op, now_ms=NOW, trace=trace)
        assert (d.code, d.reason) == (exc.value.code.value, exc.value.reason)


def test_the_fs_step_normalizes_every_spelling_as_normalize_path() -> None:
    # ``stages.resolve`` spells normalize_path's fast path out: every spelling is either the
    # path normalize_path answers (the trace's resolve step names it) or its refusal
    prof = make_profile(capabilities=(permit("fs.read", fs("fs.read", "/**")),))
    g = Guard(resolve_symlinks=False)
    for raw in _spellings():
        op = FsReadOp.model_construct(kind="fs.read", path=raw, offset=None, len=None)
        want = _normalized(raw)
        if isinstance(want, tuple):  # refused: the same code and reason, traced or not
            for trace in (False, True):
                d = g.decide(prof, op, now_ms=NOW, trace=trace)
                assert (d.code, d.reason) == want, raw
            continue
        d = g.decide(prof, op, now_ms=NOW, trace=True)
        assert d.allowed, raw
        resolved = [s for s in d.trace or () if s.node == "resolve"]
        assert resolved[0].detail == quote(want), raw


def _normalized(raw: str) -> str | tuple[str, str]:
    """``normalize_path(raw)``, or the code and reason it refuses ``raw`` with."""
    try:
        return normalize_path(raw)
    except PolicyEngineError as exc:
        return exc.code.value, exc.reason


def _proc_profile() -> Any:
    status = ArgSlot(alternatives=(ArgAlternative(literal="status"),))
    git = ProcCapability(tool="git", args=(status,))
    return make_profile(capabilities=(permit("proc.exec", git),),
                        granted=(ProcCapability(tool="git"),),
                        declared=(ProcCapability(tool="git"),), profile_hash="p")


def test_a_default_refusal_is_remembered_by_exact_resource_only() -> None:
    class Odd(str):
        """A str subclass: it could compare equal to an argument it does not spell."""

    g = Guard()
    prof = _proc_profile()
    d = g.decide(prof, ProcExecOp(tool="git", args=("push",)), now_ms=NOW)
    assert d.reason == "no rule permits `proc.exec` on `git`"
    cp: CompiledProfile = g.compiled(prof)
    assert ("git", ("push",)) in cp.refusals["proc.exec"]
    op = ProcExecOp.model_construct(kind="proc.exec", tool="git", args=(Odd("log"),),
                                    timeout_ms=None, cwd=None, env={}, stdin_b64=None)
    odd = g.decide(prof, op, now_ms=NOW)
    assert odd.reason == d.reason
    assert len(cp.refusals["proc.exec"]) == 1  # the subclass was diagnosed, not remembered
    # a tool not granted: its own diagnosis, remembered beside the first
    rm = g.decide(prof, ProcExecOp(tool="rm", args=("-rf", "/")), now_ms=NOW)
    assert rm.reason == "capability not granted: `proc.exec` on `rm`"
    assert g.decide(prof, ProcExecOp(tool="rm", args=("-rf", "/")), now_ms=NOW) is rm


def test_a_url_refusal_is_remembered_by_the_parsed_url_object() -> None:
    g = Guard()
    cap = NetHttpCapability(hosts=("api.github.com",), schemes=("https",))
    prof = make_profile(capabilities=(permit("net.http", cap),), profile_hash="n")
    a = g.decide(prof, NetHttpOp(url="https://example.com/", method="GET"), now_ms=NOW)
    b = g.decide(prof, NetHttpOp(url="https://example.com/", method="POST"), now_ms=NOW)
    assert a.reason == "capability not granted: `net.http` on `GET https://example.com/`"
    assert b.reason == "capability not granted: `net.http` on `POST https://example.com/`"
    memo = g.compiled(prof).refusals["net.http"]
    assert len(memo) == 2
    for key, entry in memo.items():  # keyed by the URL's identity, the entry keeping it alive
        assert key[0] == id(entry[3])
    # a method as sent is checked once, then looked up upper-cased
    for _ in range(2):
        low = g.decide(prof, NetHttpOp(url="https://example.com/", method="get"), now_ms=NOW)
        assert low.reason == a.reason
    assert GOOD_METHODS["get"] == "GET"


def test_a_forbid_set_remembers_paths_only_without_conditions() -> None:
    secrets = forbid(("fs.read",), fs("fs.read", "/workspace/secret/**"), rule="secrets")
    plain = make_profile(capabilities=(permit("fs.read", fs("fs.read", "/workspace/**")),),
                         denies=(secrets,), profile_hash="f")
    g = Guard()
    d = g.decide(plain, FsReadOp(path="/workspace/secret/k"), now_ms=NOW)
    assert d.code == ErrorCode.CAPABILITY_BLOCKED.value
    fset = g.compiled(plain).forbids["fs.read"]
    assert fset.seen == {"/workspace/secret/k": (d.reason, d.rule)}
    assert g.decide(plain, FsReadOp(path="/workspace/secret/k"), now_ms=NOW) is d
    conditional = forbid(("fs.read",), fs("fs.read", "/workspace/secret/**"), rule="secrets",
                         condition="request.path != ''")
    cond = make_profile(capabilities=(permit("fs.read", fs("fs.read", "/workspace/**")),),
                        denies=(conditional,), profile_hash="c")
    g2 = Guard()
    g2.decide(cond, FsReadOp(path="/workspace/secret/k"), now_ms=NOW)
    assert g2.compiled(cond).forbids["fs.read"].seen is None


def test_default_refusal_answers_as_diagnose() -> None:
    g = Guard()
    prof = _proc_profile()
    cp = g.compiled(prof)
    for res in [("git", ("push",)), ("rm", ()), ("git", ())]:
        rv = stages.RESOLVERS["proc.exec"](ProcExecOp(tool=res[0], args=res[1]))
        want = steps.diagnose(cp, "proc.exec", rv.res, rv.describe(), [], None)
        for _ in range(2):
            assert steps.default_refusal(cp, "proc.exec", rv.res, None, rv, None) == want
