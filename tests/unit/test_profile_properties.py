"""Hypothesis: a profile admits only what grant, manifest and policy all admit; mandatory denies
survive anything; overrides never widen."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_profile_builder import SPAN, fs, grant, manifest, policyset, rule

from policy_engine.errors import ErrorCode, PolicyEngineError
from policy_engine.graph import NamedProfile
from policy_engine.model import (
    LIMIT_FIELDS,
    Capability,
    CapabilityKind,
    FsCapability,
    Limits,
    NetworkMode,
    Overrides,
    Profile,
)
from policy_engine.patterns.paths import PathGlob
from policy_engine.profile import ProfileBuilder

PROPS = settings(max_examples=300, deadline=None)
K = CapabilityKind
FS_KINDS = ("fs.read", "fs.write")

GLOB_SEGMENTS = ["w", "x", "src", "*", "*.py", "?", "**"]
PATHS = ["/"] + ["/" + "/".join(p) for n in range(1, 4)
                 for p in itertools.product(["w", "x", "src", "a.py", "y"], repeat=n)]
globs = st.lists(st.sampled_from(GLOB_SEGMENTS), max_size=3).map(lambda s: "/" + "/".join(s))
fs_caps = st.builds(
    lambda kind, paths: fs(kind, *paths),
    st.sampled_from(FS_KINDS), st.lists(globs, min_size=1, max_size=2),
)


def cap_admits(cap: Capability, kind: str, path: str) -> bool:
    return (isinstance(cap, FsCapability) and cap.kind == kind
            and any(PathGlob.of(g).matches(path) for g in cap.paths))


def profile_admits(profile: Profile, kind: str, path: str) -> bool:
    return any(pc.kind == kind and all(cap_admits(c, kind, path) for c in pc.all_of)
               for pc in profile.capabilities)


@PROPS
@given(st.lists(fs_caps, max_size=3), st.lists(fs_caps, max_size=3),
       st.lists(st.lists(globs, min_size=1, max_size=2), min_size=1, max_size=3))
def test_profile_admits_exactly_what_all_three_admit(
    granted: list[FsCapability], declared: list[FsCapability], permits: list[list[str]]
) -> None:
    rules = [rule(f"p{i}", "permit", {K(k): fs(k, *paths) for k in FS_KINDS}, line=i + 1)
             for i, paths in enumerate(permits)]
    profile = ProfileBuilder(policyset(rules)).build(grant(*granted), manifest(*declared))
    for kind, path in itertools.product(FS_KINDS, PATHS):
        by_grant = any(cap_admits(c, kind, path) for c in granted)
        by_manifest = any(cap_admits(c, kind, path) for c in declared)
        by_policy = any(cap_admits(r.capabilities[K(kind)], kind, path) for r in rules)
        # soundness is the security property; completeness holds because conjunctions are exact
        assert profile_admits(profile, kind, path) == (by_grant and by_manifest and by_policy)


limit_values = st.one_of(st.none(), st.integers(min_value=1, max_value=200_000))
limits = st.builds(Limits, timeout_ms=limit_values, pids=limit_values, max_files=limit_values,
                   max_bytes_out=limit_values)
networks = st.one_of(st.none(), st.sampled_from(list(NetworkMode)))
PROFILES = {
    "ro": NamedProfile("ro", SPAN, network=NetworkMode.OFF, fs_mode="read-only"),
    "narrow": NamedProfile("narrow", SPAN, writable=("/w/**",), limits=Limits(pids=8)),
}
SECRETS = policyset([
    # like the built-in rule: every fs kind, so the paths also enter the flat deny-list
    rule("secrets", "forbid", {k: fs(k.value, "~/.ssh/**", "**/.env")
                               for k in (K.FS_READ, K.FS_WRITE, K.FS_LIST)}, mandatory=True),
    rule("maybe", "forbid", {K.FS_WRITE: fs("fs.write", "/x/**")}),
    rule("all", "permit", {K.FS_READ: fs("fs.read", "/**"), K.FS_WRITE: fs("fs.write", "/**")}),
], profiles=PROFILES, network=NetworkMode.ON)


@PROPS
@given(st.lists(fs_caps, max_size=3), st.lists(fs_caps, max_size=3), limits, limits,
       st.one_of(st.none(), st.sampled_from(sorted(PROFILES))), networks)
def test_mandatory_denies_survive_everything(
    granted: list[FsCapability], declared: list[FsCapability], g_limits: Limits,
    m_limits: Limits, named: str | None, network: NetworkMode | None,
) -> None:
    profile = ProfileBuilder(SECRETS).build(
        grant(*granted, limits=g_limits), manifest(*declared, limits=m_limits, network=network),
        overrides=Overrides(profile=named))
    mandatory = [d for d in profile.denies if d.mandatory]
    assert [d.rule.id for d in mandatory] == ["secrets"]
    assert {"/root/.ssh/**", "/**/.env"} <= set(profile.deny.paths)
    # a forbid on fs.write alone stays rule-scoped: the flat list applies to every fs kind
    assert "/x/**" not in profile.deny.paths


@PROPS
@given(limits, limits, networks, networks, st.one_of(st.none(), st.sampled_from(sorted(PROFILES))))
def test_overrides_never_widen(
    m_limits: Limits, o_limits: Limits, m_network: NetworkMode | None,
    o_network: NetworkMode | None, named: str | None,
) -> None:
    builder = ProfileBuilder(SECRETS)
    m = manifest(limits=m_limits, network=m_network)
    base = builder.build(grant(), m, overrides=Overrides(profile=named))
    widening = [f for f in LIMIT_FIELDS if getattr(o_limits, f) is not None
                and getattr(o_limits, f) > getattr(base.limits, f)]
    widens_network = o_network is not None and o_network.rank > base.network.rank
    overrides = Overrides(limits=o_limits, network=o_network, profile=named)
    if widening or widens_network:
        with pytest.raises(PolicyEngineError) as exc:
            builder.build(grant(), m, overrides=overrides)
        assert exc.value.code is ErrorCode.PERMISSION_DENY
        field = f"`limits.{widening[0]}`" if widening else "`network`"
        assert field in exc.value.reason
        return
    narrowed = builder.build(grant(), m, overrides=overrides)
    for f in LIMIT_FIELDS:
        wanted = getattr(o_limits, f)
        assert getattr(narrowed.limits, f) == (getattr(base.limits, f) if wanted is None
                                               else wanted)
    assert narrowed.network == (o_network or base.network)
    assert narrowed.timeout_ms == narrowed.limits.timeout_ms
