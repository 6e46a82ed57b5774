"""Per-call profiles from a cached template (profile.shape, guard.shapes): equal to a full build,
never shared across grants, manifests or layers that differ, and decided as a fresh guard would."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

from policy_engine.compiler import compile_files
from policy_engine.graph import PolicySet
from policy_engine.guard import Guard
from policy_engine.guard.compiled import CompiledProfile
from policy_engine.model import (
    Budget,
    Consent,
    FsReadOp,
    Grant,
    Limits,
    Manifest,
    Overrides,
    Settings,
)
from policy_engine.profile import ProfileBuilder, ProfileCache
from policy_engine.profile.hashing import profile_hash

NOW = 1_795_000_000_000
FAR = 4_102_444_800_000

POLICY = """\
policy "t/shape" version "1.0.0"
defaults { timeout 60s  network off }
forbid mandatory "keys" fs.read, fs.write, fs.list  paths ["**/*.pem"]
forbid "no-private" fs.read  paths ["/workspace/private/**"]
permit "read-ok" fs.read, fs.list  paths ["/workspace/**"]
  when `grant.call_id.startsWith("ok-")`
permit "read-docs" fs.read  paths ["/docs/**"]
permit "write" fs.write  paths ["/workspace/out/**"]
permit "git" proc.exec  tool "git"
require consent when `"Write" in profile.side_effects`
"""


@pytest.fixture(scope="module")
def ps(tmp_path_factory: pytest.TempPathFactory) -> PolicySet:
    path: Path = tmp_path_factory.mktemp("shape") / "p.sbpolicy"
    path.write_text(POLICY, encoding="utf-8")
    return compile_files([str(path)], home="/home/agent")


def grant(call_id: str = "ok-1", **over: Any) -> Grant:
    data: dict[str, Any] = {
        "tenant": "acme", "subject_id": "agent:a", "tool_name": "t", "call_id": call_id,
        "capabilities": [{"kind": "fs.read", "paths": ["/workspace/**", "/docs/**"]},
                         {"kind": "fs.write", "paths": ["/workspace/out/**"]},
                         {"kind": "proc.exec", "tool": "git"}],
        "expires_at": FAR,
        "consent": {"granted_by": "user:d", "granted_at": 0, "expires_at": FAR},
    }
    data.update(over)
    return Grant.model_validate(data)


def manifest(**over: Any) -> Manifest:
    data: dict[str, Any] = {
        "name": "t", "version": "1.0.0",
        "permissions": [{"kind": "fs.read", "paths": ["/**"]},
                        {"kind": "fs.write", "paths": ["/workspace/**"]},
                        {"kind": "proc.exec", "tool": "git"}],
        "side_effects": ["Read", "Write"], "safety_class": "Low",
    }
    data.update(over)
    return Manifest.model_validate(data)


CALL_VARIANTS: list[dict[str, Any]] = [
    {},
    {"expires_at": NOW + 5},
    {"consent": None},
    {"consent": {"granted_by": "user:é\u2028\"x", "granted_at": 7, "expires_at": 9}},
    {"budget": {"calls": 3, "cpu_ms": 10}},
    {"decision_key_fingerprint": "fp-2"},
]


@pytest.mark.parametrize("over", CALL_VARIANTS)
def test_a_per_call_copy_equals_a_full_build(ps: PolicySet, over: dict[str, Any]) -> None:
    b = ProfileBuilder(ps)
    b.build(grant("ok-template"), manifest())  # the template
    g = grant('call "ünïcode" \u2028 2', **over)
    copy = b.build(g, manifest())
    full = ProfileBuilder(ps).build_uncached(g, manifest())
    assert copy == full
    assert copy.profile_hash == full.profile_hash
    assert copy.profile_hash == profile_hash(copy, ps.version_hash, "1.0.0")
    assert b.cache.stats()["shapes"] == 1  # it was a copy, not a second meet


def test_a_new_call_id_skips_the_meet(ps: PolicySet, monkeypatch: pytest.MonkeyPatch) -> None:
    b = ProfileBuilder(ps)
    b.build(grant("ok-1"), manifest())
    meets: list[str] = []
    real = b.build_uncached

    def counted(g: Grant, m: Manifest, **kw: Any) -> Any:
        meets.append(g.call_id)
        return real(g, m, **kw)

    monkeypatch.setattr(b, "build_uncached", counted)
    for i in range(5):
        b.build(grant(f"ok-{i + 2}", expires_at=FAR - i), manifest())
    assert meets == []


SHAPE_VARIANTS: list[tuple[str, Any]] = [
    ("subject", lambda: (grant(subject_id="agent:b"), manifest(), None, None)),
    ("tenant", lambda: (grant(tenant="other"), manifest(), None, None)),
    ("capability", lambda: (grant(capabilities=[{"kind": "fs.read", "paths": ["/docs/**"]}]),
                            manifest(), None, None)),
    ("grant limits", lambda: (grant(limits={"pids": 3}), manifest(), None, None)),
    ("grant cpu 1.5", lambda: (grant(limits={"cpu_cores": 1.5}), manifest(), None, None)),
    ("manifest version", lambda: (grant(), manifest(version="1.0.1"), None, None)),
    ("manifest side effects", lambda: (grant(), manifest(side_effects=["Read"]), None, None)),
    ("settings", lambda: (grant(), manifest(), Settings(limits=Limits(pids=2)), None)),
    ("settings cpu", lambda: (grant(), manifest(), Settings(limits=Limits(cpu_cores=0.5)), None)),
    ("settings root", lambda: (grant(), manifest(), Settings(root_fs="/srv"), None)),
    ("overrides", lambda: (grant(), manifest(), None, Overrides(limits=Limits(max_files=1)))),
]


def test_the_cache_never_answers_for_other_inputs(ps: PolicySet) -> None:
    # one builder sees every variant (each after the base shape is cached): each answer must
    # be what a builder that never saw another input builds
    b = ProfileBuilder(ps)
    b.build(grant(), manifest())
    b.build(grant(limits={"cpu_cores": 1}), manifest())
    for name, make in SHAPE_VARIANTS * 2:  # twice: the second round hits the cache
        g, m, s, o = make()
        got = b.build(g, m, settings=s, overrides=o)
        want = ProfileBuilder(ps).build_uncached(g, m, settings=s, overrides=o)
        assert got == want, name
        assert got.profile_hash == want.profile_hash, name
    hashes = {b.build(*make()[:2], settings=make()[2], overrides=make()[3]).profile_hash
              for _, make in SHAPE_VARIANTS}
    assert len(hashes) == len(SHAPE_VARIANTS)


def test_the_shape_key_leaves_out_none_and_stays_one_to_one() -> None:
    """``None`` fields are left out of the key: ``None`` and a falsy value stay apart, and a
    field spelled ``None`` equals it left unset (the same content)."""
    from policy_engine.profile.shape import grant_shape_key

    def key(cap: dict[str, Any], **over: Any) -> bytes:
        return grant_shape_key(grant(capabilities=[cap], **over))

    assert key({"kind": "tmp.use"}) != key({"kind": "tmp.use", "max_bytes": 0})
    assert key({"kind": "tmp.use"}) == key({"kind": "tmp.use", "max_bytes": None})
    assert key({"kind": "proc.exec", "tool": "git"}) != key(
        {"kind": "proc.exec", "tool": "git", "args": []})
    assert key({"kind": "tmp.use"}) != key({"kind": "tmp.use"}, limits={"pids": 1})
    assert key({"kind": "tmp.use"}, limits={"cpu_cores": 1}) != key(
        {"kind": "tmp.use"}, limits={"cpu_cores": 1.5})


def test_profile_cache_is_a_bounded_lru(ps: PolicySet) -> None:
    b = ProfileBuilder(ps, cache=ProfileCache(size=3, shape_size=2))
    for i in range(10):
        b.build(grant(subject_id=f"agent:{i}"), manifest())
    assert b.cache.stats() == {"identity": 3, "calls": 3, "shapes": 2}
    with pytest.raises(ValueError, match="at least 1"):
        ProfileCache(size=0)


def _decide(guard: Guard, b: ProfileBuilder, g: Grant, path: str, now: int = NOW) -> Any:
    return guard.decide(b.build(g, manifest()), FsReadOp(kind="fs.read", path=path), now_ms=now)


def _expiry_and_consent_calls() -> list[tuple[Grant, str]]:
    """Calls differing in their expiry and consent only: deny, allow, deny, deny."""
    return [
        (grant("ok-4", expires_at=NOW - 1), "/docs/x"),  # expired
        (grant("ok-5", expires_at=NOW + 1), "/docs/x"),
        (grant("ok-6", consent=None), "/docs/x"),  # Write side effect: consent required
        (grant("ok-7", consent={"granted_by": "u", "granted_at": 0, "expires_at": NOW}),
         "/docs/x"),  # consent no longer current
    ]


def _each_as_a_fresh_guard_decides(ps: PolicySet, guard: Guard, b: ProfileBuilder,
                                   cases: list[tuple[Grant, str]]) -> list[str]:
    """Decide each (grant, path) read with ``guard`` and ``b``; each answer and hash must be a
    fresh builder's and guard's. Returns the decisions."""
    for g, path in cases:
        got = _decide(guard, b, g, path)
        fresh = Guard(ps, resolve_symlinks=False).decide(
            ProfileBuilder(ps).build_uncached(g, manifest()), FsReadOp(kind="fs.read", path=path),
            now_ms=NOW)
        assert got == fresh, g.call_id
        assert got.profile_hash == b.build(g, manifest()).profile_hash
    return [_decide(guard, b, g, p).decision for g, p in cases]


def test_guard_decides_each_call_on_its_own_fields(ps: PolicySet) -> None:
    # the shape's first profile is call "ok-1" (allowed); later calls of the same shape differ
    # only in call fields, which conditions, expiry and consent read
    b, guard = ProfileBuilder(ps), Guard(ps, resolve_symlinks=False)
    assert _decide(guard, b, grant("ok-1"), "/workspace/a.txt").decision == "allow"
    cases = [
        (grant("no-2"), "/workspace/a.txt"),  # condition reads grant.call_id
        (grant("ok-3"), "/workspace/a.txt"),
        *_expiry_and_consent_calls(),
        (grant("ok-8"), "/workspace/private/k"),
    ]
    decisions = _each_as_a_fresh_guard_decides(ps, guard, b, cases)
    assert decisions == ["deny", "allow", "deny", "allow", "deny", "deny", "deny"]


@pytest.fixture(scope="module")
def ps_plain(tmp_path_factory: pytest.TempPathFactory) -> PolicySet:
    """The policy above with conditions that read ``grant`` but none of its call fields."""
    path: Path = tmp_path_factory.mktemp("shape-plain") / "p.sbpolicy"
    path.write_text(POLICY.replace('grant.call_id.startsWith("ok-")',
                                   'grant.subject_id.startsWith("agent:")'), encoding="utf-8")
    return compile_files([str(path)], home="/home/agent")


def test_a_call_of_a_cached_shape_is_decided_on_it_with_its_own_fields(
        ps_plain: PolicySet) -> None:
    """No condition reads a call field: the guard decides a new call on its shape's compilation
    (no per-call copy), with the call's own expiry, consent window and hash."""
    ps = ps_plain
    b, guard = ProfileBuilder(ps), Guard(ps, resolve_symlinks=False)
    assert _decide(guard, b, grant("ok-1"), "/workspace/a.txt").decision == "allow"
    compiled = len(guard._cache)
    cases = [
        (grant("ok-3"), "/workspace/a.txt"),
        *_expiry_and_consent_calls(),
        (grant("ok-8", consent={"granted_by": "u", "granted_at": NOW + 1,
                                "expires_at": FAR}), "/docs/x"),  # not yet valid
        (grant("ok-9"), "/workspace/private/k"),
        (grant("ok-10"), "/elsewhere"),
    ]
    decisions = _each_as_a_fresh_guard_decides(ps, guard, b, cases)
    assert decisions == ["allow", "deny", "allow", "deny", "deny", "deny", "deny", "deny"]
    assert len(guard._cache) == compiled  # every call above took the shape's compilation


def test_traced_decisions_match_too(ps: PolicySet) -> None:
    b, guard = ProfileBuilder(ps), Guard(ps, resolve_symlinks=False)
    _decide(guard, b, grant("ok-1"), "/workspace/a.txt")
    for call in ("no-2", "ok-3"):
        g = grant(call)
        op = FsReadOp(kind="fs.read", path="/workspace/a.txt")
        got = guard.decide(b.build(g, manifest()), op, now_ms=NOW, trace=True)
        fresh = Guard(ps, resolve_symlinks=False).decide(
            ProfileBuilder(ps).build_uncached(g, manifest()), op, now_ms=NOW, trace=True)
        assert got == fresh


def test_derived_compilation_equals_a_fresh_one(ps: PolicySet) -> None:
    b, guard = ProfileBuilder(ps), Guard(ps)
    guard.compiled(b.build(grant("ok-1"), manifest()))
    g = grant("ok-2", expires_at=NOW + 9, consent={"granted_by": "u", "granted_at": 1,
                                                   "expires_at": NOW + 8},
              budget={"calls": 4})
    p = b.build(g, manifest())
    derived = guard.compiled(p)
    fresh = Guard(ps).compiled(p)
    for f in dataclasses.fields(CompiledProfile):
        if f.name in ("caps", "forbids", "granted", "declared", "permit_index"):
            continue  # compiled matchers: compared through decisions above
        assert getattr(derived, f.name) == getattr(fresh, f.name), f.name
    assert derived.caps.keys() == fresh.caps.keys()


def test_forbids_are_compiled_once_per_policy(ps: PolicySet) -> None:
    b, guard = ProfileBuilder(ps), Guard(ps)
    a = guard.compiled(b.build(grant(subject_id="agent:a"), manifest()))
    c = guard.compiled(b.build(grant(subject_id="agent:c"), manifest(version="2.0.0")))
    assert a.profile_hash != c.profile_hash
    assert a.forbids is c.forbids


def test_a_hand_built_lookalike_has_another_shape(ps: PolicySet) -> None:
    # only identity of every shape field shares a compilation, never looks, never one field
    b, guard = ProfileBuilder(ps), Guard(ps, resolve_symlinks=False)
    p = b.build(grant("ok-1"), manifest())
    read = FsReadOp(kind="fs.read", path="/docs/a.md")
    assert guard.decide(p, read, now_ms=NOW).decision == "allow"
    twin = type(p).model_validate(p.model_dump()).model_copy(update={"profile_hash": ""})
    assert twin.mappings is not p.mappings
    assert guard.compiled(twin) is not guard.compiled(p)
    # shares every object but the capabilities (the entry's key object too): its own compile
    bare = p.model_copy(update={"capabilities": (), "profile_hash": ""})
    assert bare.mappings is p.mappings
    assert guard.decide(bare, read, now_ms=NOW).decision == "deny"
    assert guard.decide(p, read, now_ms=NOW).decision == "allow"
    # a call of p's shape still derives from p's compilation
    later = b.build(grant("ok-2"), manifest())
    assert guard.compiled(later).caps is guard.compiled(p).caps


def test_budget_and_consent_objects_round_trip_in_the_hash(ps: PolicySet) -> None:
    b = ProfileBuilder(ps)
    b.build(grant(), manifest())
    g = grant("ok-9").model_copy(update={"budget": Budget(calls=1),
                                         "consent": Consent(granted_by="x", granted_at=1,
                                                            expires_at=2)})
    p = b.build(g, manifest())
    assert p.profile_hash == profile_hash(p, ps.version_hash, "1.0.0")


def test_the_two_level_hash_covers_every_field(ps: PolicySet) -> None:
    """``profile_hash`` hashes the call fields next to a digest of the rest: a change to any
    field it does not leave out on purpose (``limit_layers``, ``profile_hash``) changes it, and
    the builder's copies hash as the reference does."""
    import warnings

    from policy_engine.model import Profile

    p = ProfileBuilder(ps).build(grant(), manifest())
    base = profile_hash(p, ps.version_hash, "1.0.0")
    assert base == p.profile_hash
    for name, value in p.__dict__.items():
        if name in ("limit_layers", "profile_hash"):
            continue
        other: Any = ("x" if value is None else None if not isinstance(value, bool)
                      else not value)
        with warnings.catch_warnings():  # an off-type value serialises with a warning
            warnings.simplefilter("ignore")
            changed = profile_hash(p.model_copy(update={name: other}), ps.version_hash, "1.0.0")
        assert changed != base, name
    assert profile_hash(p, ps.version_hash, "1.0.1") != base
    assert profile_hash(p, "other", "1.0.0") != base
    assert set(Profile.model_fields) >= set(p.__dict__)


def test_profile_cache_size_is_configured_and_checked(ps: PolicySet, tmp_path: Path) -> None:
    from policy_engine.config import EngineConfig
    from policy_engine.orchestrator import Orchestrator

    config = EngineConfig.from_mapping({"profile_cache_size": 2, "state_dir": str(tmp_path),
                                        "revocation": "memory", "budget_meter": "memory",
                                        "evidence_sinks": []})
    orch = Orchestrator(ps, config=config)
    try:
        builder = orch.builder
        assert isinstance(builder, ProfileBuilder)
        for i in range(5):
            builder.build(grant(subject_id=f"agent:{i}"), manifest())
        # shapes: a quarter of the size, at least 16
        assert builder.cache.stats() == {"identity": 2, "calls": 2, "shapes": 5}
    finally:
        orch.close()
    for bad in (0, -1, True, "10", 1.5):
        with pytest.raises(ValueError, match="profile_cache_size"):
            EngineConfig.from_mapping({"profile_cache_size": bad})


def test_the_identity_level_keeps_no_grant_alive(ps: PolicySet) -> None:
    import gc
    import weakref

    b = ProfileBuilder(ps)
    m = manifest()
    g = grant("ok-1")
    assert b.build(g, m) is b.build(g, m)  # an identity hit
    ref = weakref.ref(g)
    del g
    gc.collect()
    assert ref() is None
    # new grants (one may get the dead one's id) each get their own call's profile
    for i in range(200):
        assert b.build(grant(f"ok-n{i}"), m).call_id == f"ok-n{i}"


def test_a_profile_only_condition_runs_once_per_profile_view(
        ps: PolicySet, monkeypatch: pytest.MonkeyPatch) -> None:
    # `require consent when "Write" in profile.side_effects` reads the profile alone: every call
    # of one shape shares the view, so the condition runs once; another view runs it again
    cond = ps.consent_rules[0].condition
    assert cond is not None
    runs: list[object] = []
    real = type(cond).evaluate_plain

    def counted(self: Any, ctx: Any) -> Any:
        runs.append(ctx.get("profile"))
        return real(self, ctx)

    monkeypatch.setattr(type(cond), "evaluate_plain", counted)
    b, guard = ProfileBuilder(ps), Guard(ps, resolve_symlinks=False)
    read_only = manifest(side_effects=["Read"], permissions=[
        {"kind": "fs.read", "paths": ["/**"]}])
    for i in range(5):
        d = guard.decide(b.build(grant(f"ok-{i}", consent=None), read_only),
                         FsReadOp(kind="fs.read", path="/docs/a"), now_ms=NOW)
        assert d.decision == "allow"  # no Write: the rule does not require consent
    assert len(runs) == 1
    d = guard.decide(b.build(grant("ok-9", consent=None), manifest()),
                     FsReadOp(kind="fs.read", path="/docs/a"), now_ms=NOW)
    assert d.decision == "deny"  # Write side effect: consent required, none recorded
    assert "consent" in d.reason
    assert len(runs) == 2


def test_an_equal_grant_in_another_object_gets_the_very_profile(ps: PolicySet) -> None:
    """The call level: a grant parsed anew with the same content (each service request's own)
    gets the profile the first one got (so the guard finds its compilation by identity); any
    difference, a call field included, is another profile; a grant built without validation
    (a call field of another type) is not looked up there and still gets its fields checked."""
    b = ProfileBuilder(ps)
    first = b.build(grant(), manifest())
    again = b.build(Grant.model_validate_json(grant().model_dump_json()), manifest())
    assert again is first
    other = b.build(grant(call_id="ok-2"), manifest())
    assert other is not first
    assert other.call_id == "ok-2"
    assert other.profile_hash != first.profile_hash
    later = b.build(grant(expires_at=first.expires_at + 1), manifest())
    assert later is not first
    assert later.expires_at == first.expires_at + 1
    loose = grant().model_copy(update={"expires_at": True})
    assert b.cache.call_key(loose, ("", "", "")) is None
    assert b.build(loose, manifest()).expires_at == 1  # validated as a full build does
    assert b.build(grant(), manifest(version="1.0.1")) is not first  # another manifest


def test_the_call_key_tells_apart_every_grant_its_dropped_nulls_could_confuse(
        ps: PolicySet) -> None:
    """The call level's key is the grant's JSON without its `null` members: grants that differ
    only in a field set against one left unset (a limit, a budget, an argument template, one
    alternative's literal against its regex, consent) each have their own key and profile;
    equal grants share one; a grant whose JSON is long is keyed by its digest."""
    b = ProfileBuilder(ps)
    proc = {"kind": "proc.exec", "tool": "git"}
    variants = [
        grant(), grant(consent=None), grant(limits={"max_bytes_in": 0}),
        grant(limits={"max_files": 0}), grant(budget={"calls": 0}),
        grant(budget={"bytes_in": 0}),
        grant(capabilities=[proc]), grant(capabilities=[{**proc, "args": []}]),
        grant(capabilities=[{**proc, "args": [{"alternatives": [{"literal": "x"}]}]}]),
        grant(capabilities=[{**proc, "args": [{"alternatives": [{"regex": "x"}]}]}]),
    ]
    keys = [b.cache.call_key(g, ("", "", "")) for g in variants]
    assert None not in keys
    assert len(set(keys)) == len(variants)
    profiles = [b.build(g, manifest()) for g in variants]
    assert len({id(p) for p in profiles}) == len(variants)
    assert len({p.profile_hash for p in profiles}) == len(variants)
    again = Grant.model_validate_json(variants[8].model_dump_json())
    assert b.cache.call_key(again, ("", "", "")) == keys[8]
    assert b.build(again, manifest()) is profiles[8]
    long = grant(capabilities=[{"kind": "fs.read", "paths": [f"/d{i}/**" for i in range(60)]}])
    long_key = b.cache.call_key(long, ("", "", ""))
    assert long_key is not None
    assert long_key[0].startswith(b"#")
    assert len(long_key[0]) == 33
