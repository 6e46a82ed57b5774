"""ProfileBuilder: the DESIGN.md §2 meet, the layered chain, named profiles, hashing and caching."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import timeit
from collections.abc import Mapping
from pathlib import Path
from typing import Literal

import pytest

from policy_engine.compiler import compile_files
from policy_engine.compiler.loaders import load_grant, load_manifest
from policy_engine.errors import ErrorCode, PolicyEngineError, Span
from policy_engine.graph import CompiledRule, ConsentRule, NamedProfile, PolicySet
from policy_engine.guard import Guard
from policy_engine.model import (
    ArgAlternative,
    ArgSlot,
    Capability,
    CapabilityKind,
    FsCapability,
    FsReadOp,
    FsWriteOp,
    Grant,
    Limits,
    Manifest,
    NetHttpCapability,
    NetHttpOp,
    NetworkMode,
    Overrides,
    ProcCapability,
    ProfileCapability,
    RuleRef,
    SafetyClass,
    Settings,
    SideEffect,
)
from policy_engine.profile import ProfileBuilder

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"

K = CapabilityKind
SPAN = Span("acme.sbpolicy", 1, 1)


class FakeCondition:
    """A stand-in for a compiled CEL condition; the builder only reads ``source``."""

    def __init__(self, source: str) -> None:
        self.source = source
        self.span = SPAN

    def evaluate(self, context: Mapping[str, object]) -> tuple[bool, str | None]:
        return True, None


def rule(
    rid: str, effect: Literal["permit", "forbid"], caps: Mapping[CapabilityKind, Capability],
    *, line: int = 1, limits: Limits | None = None, condition: str | None = None,
    mandatory: bool = False,
) -> CompiledRule:
    return CompiledRule(
        id=rid, effect=effect, capabilities=dict(caps),
        ref=RuleRef(id=rid, file="acme.sbpolicy", line=line, column=1), span=SPAN,
        limits=limits, condition=FakeCondition(condition) if condition else None,
        mandatory=mandatory,
    )


def policyset(
    rules: list[CompiledRule], *, profiles: Mapping[str, NamedProfile] | None = None,
    consent: tuple[ConsentRule, ...] = (), network: NetworkMode = NetworkMode.ON,
    defaults: Limits | None = None,
) -> PolicySet:
    permits: dict[CapabilityKind, tuple[CompiledRule, ...]] = {}
    forbids: dict[CapabilityKind, tuple[CompiledRule, ...]] = {}
    for r in rules:
        index = permits if r.effect == "permit" else forbids
        for kind in r.kinds:
            index[kind] = (*index.get(kind, ()), r)
    return PolicySet(
        name="acme/agents", version="1.4.0", version_hash="v" * 64, files=("acme.sbpolicy",),
        defaults=defaults or Limits(timeout_ms=60_000, max_bytes_in=10 * 1024 * 1024),
        network=network, rules=tuple(rules), permits_by_kind=permits, forbids_by_kind=forbids,
        consent_rules=consent, profiles=dict(profiles or {}), tools={}, home="/root",
    )


def fs(kind: str, *paths: str) -> FsCapability:
    return FsCapability(kind=kind, paths=paths)


SECRETS = ("~/.ssh/**", "~/.aws/**", "**/.env", "/etc/shadow")
ACME = policyset([
    rule("forbid-secrets", "forbid",
         {K.FS_READ: fs("fs.read", *SECRETS), K.FS_WRITE: fs("fs.write", *SECRETS),
          K.FS_LIST: fs("fs.list", *SECRETS)},
         mandatory=True),
    rule("read-ws", "permit", {K.FS_READ: fs("fs.read", "/workspace/**")}, line=3),
    rule("write-work", "permit", {K.FS_WRITE: fs("fs.write", "/workspace/work/**")}, line=4,
         condition='grant.subject_id.startsWith("agent:")'),
    rule("github", "permit", {K.NET_HTTP: NetHttpCapability(
        hosts=("api.github.com",), schemes=("https",), ports=(443,), methods=("GET", "HEAD"),
        mime=("application/json",))}, line=6),
    rule("git", "permit", {K.PROC_EXEC: ProcCapability(tool="git", args=(ArgSlot(
        alternatives=(ArgAlternative(literal="status"), ArgAlternative(literal="log"))),))},
        line=8, limits=Limits(timeout_ms=30_000, pids=64)),
], profiles={
    "safe-readonly": NamedProfile("safe-readonly", SPAN, network=NetworkMode.OFF,
                                  fs_mode="read-only"),
    "work-only": NamedProfile("work-only", SPAN, fs_mode="read-write",
                              writable=("/workspace/work/out/**",), limits=Limits(pids=32)),
}, consent=(ConsentRule(RuleRef(id="consent", file="acme.sbpolicy", line=9, column=1), SPAN,
                        None),))


def grant(*caps: Capability, tool: str = "coder", **kw: object) -> Grant:
    return Grant(tenant="t1", subject_id="agent:1", tool_name=tool, call_id="c1",
                 capabilities=caps, expires_at=2_000_000_000_000, **kw)


def manifest(*caps: Capability, **kw: object) -> Manifest:
    return Manifest(name="coder", version="2.0.0", permissions=caps, **kw)


def caps_of(
    profile_caps: tuple[ProfileCapability, ...], kind: CapabilityKind
) -> list[tuple[Capability, ...]]:
    return [pc.all_of for pc in profile_caps if pc.kind == kind]


def test_fs_meet_takes_the_narrower_glob() -> None:
    p = ProfileBuilder(ACME).build(grant(fs("fs.read", "/**")),
                                   manifest(fs("fs.read", "/workspace/src/**")))
    assert caps_of(p.capabilities, K.FS_READ) == [(fs("fs.read", "/workspace/src/**"),)]
    (pc,) = p.capabilities
    assert pc.rule is not None
    assert pc.rule.id == "read-ws"
    assert p.allow.paths == ("/workspace/src/**",)
    assert p.granted == (fs("fs.read", "/**"),)
    assert p.declared == (fs("fs.read", "/workspace/src/**"),)


def test_disjoint_paths_give_no_capability() -> None:
    p = ProfileBuilder(ACME).build(grant(fs("fs.read", "/a/**")), manifest(fs("fs.read", "/b/**")))
    assert p.capabilities == ()


def test_write_rule_carries_its_condition_and_the_manifest_narrows_it() -> None:
    p = ProfileBuilder(ACME).build(grant(fs("fs.write", "/workspace/**")),
                                   manifest(fs("fs.write", "/workspace/work/tmp/**")))
    (pc,) = p.capabilities
    assert pc.all_of == (fs("fs.write", "/workspace/work/tmp/**"),)
    assert pc.condition == 'grant.subject_id.startsWith("agent:")'


def test_unrelated_globs_are_kept_as_a_conjunction() -> None:
    p = ProfileBuilder(ACME).build(grant(fs("fs.read", "/workspace/**")),
                                   manifest(fs("fs.read", "**/*.py")))
    assert caps_of(p.capabilities, K.FS_READ) == [
        (fs("fs.read", "/**/*.py"), fs("fs.read", "/workspace/**")),
    ]


def test_hosts_and_http_sets_meet() -> None:
    p = ProfileBuilder(ACME).build(
        grant(NetHttpCapability(hosts=("*.github.com",), methods=("GET", "POST"))),
        manifest(NetHttpCapability(hosts=("api.github.com", "example.com"))),
    )
    (pc,) = p.capabilities
    (cap,) = pc.all_of
    assert isinstance(cap, NetHttpCapability)
    assert cap.hosts == ("api.github.com",)
    assert cap.methods == ("GET",)  # {GET, POST} ∧ default {GET, HEAD} ∧ {GET, HEAD}
    assert cap.ports == (443,)
    assert cap.mime == ("application/json",)
    assert p.allow.domains == ("api.github.com",)


def test_proc_needs_the_same_tool_and_keeps_the_template_and_rule_limits() -> None:
    b = ProfileBuilder(ACME)
    assert b.build(grant(ProcCapability(tool="rm")), manifest(ProcCapability(tool="rm"))
                   ).capabilities == ()
    p = b.build(grant(ProcCapability(tool="git")), manifest(ProcCapability(tool="git")))
    (pc,) = p.capabilities
    (cap,) = pc.all_of
    assert isinstance(cap, ProcCapability)
    assert cap.args is not None
    assert pc.limits is not None
    assert (pc.limits.timeout_ms, pc.limits.pids, pc.limits.max_files) == (30_000, 64, 100)
    assert p.allow.tools == ("git",)


def test_mandatory_denies_are_always_present() -> None:
    p = ProfileBuilder(ACME).build(grant(fs("fs.read", "/**")), manifest(fs("fs.read", "/**")),
                                   overrides=Overrides(profile="safe-readonly"))
    (deny,) = p.denies
    assert deny.mandatory
    assert deny.kinds == (K.FS_READ, K.FS_WRITE, K.FS_LIST)
    assert "/root/.ssh/**" in p.deny.paths
    assert "/**/.env" in p.deny.paths


def test_grant_for_another_tool_is_refused() -> None:
    with pytest.raises(PolicyEngineError) as exc:
        ProfileBuilder(ACME).build(grant(tool="other"), manifest())
    assert exc.value.code is ErrorCode.DENY_TOOL
    assert exc.value.reason == "grant is for tool `other` but the manifest is `coder`"


def test_override_widening_a_limit_is_refused_naming_the_field() -> None:
    b = ProfileBuilder(ACME)
    m = manifest(limits=Limits(timeout_ms=30_000))
    with pytest.raises(PolicyEngineError) as exc:
        b.build(grant(), m, overrides=Overrides(limits=Limits(timeout_ms=60_000)))
    assert exc.value.code is ErrorCode.PERMISSION_DENY
    assert exc.value.reason == "override would widen `limits.timeout_ms` from 30000 to 60000"
    p = b.build(grant(), m, overrides=Overrides(limits=Limits(timeout_ms=10_000)))
    assert (p.limits.timeout_ms, p.timeout_ms) == (10_000, 10_000)


def test_override_cannot_turn_the_network_on_and_settings_only_cap_it() -> None:
    off = policyset([], network=NetworkMode.OFF)
    with pytest.raises(PolicyEngineError, match="override would widen `network` from off to on"):
        ProfileBuilder(off).build(grant(), manifest(), overrides=Overrides(network="on"))
    # settings are the operator's ceiling: they never raise what the call starts from
    assert ProfileBuilder(off).build(
        grant(), manifest(), settings=Settings(network="restricted")).network is NetworkMode.OFF
    on = policyset([], network=NetworkMode.ON)
    assert ProfileBuilder(on).build(
        grant(), manifest(), settings=Settings(network="restricted")
    ).network is NetworkMode.RESTRICTED


@pytest.mark.parametrize(("policy_default", "manifest_wants", "expected"), [
    (NetworkMode.OFF, None, NetworkMode.OFF),
    (NetworkMode.OFF, NetworkMode.ON, NetworkMode.RESTRICTED),
    (NetworkMode.OFF, NetworkMode.RESTRICTED, NetworkMode.RESTRICTED),
    (NetworkMode.RESTRICTED, NetworkMode.ON, NetworkMode.RESTRICTED),
    (NetworkMode.ON, NetworkMode.ON, NetworkMode.ON),
    (NetworkMode.ON, NetworkMode.OFF, NetworkMode.OFF),
    (NetworkMode.ON, None, NetworkMode.ON),
])
def test_unrestricted_network_needs_the_policy_to_default_to_on(
    policy_default: NetworkMode, manifest_wants: NetworkMode | None, expected: NetworkMode,
) -> None:
    ps = policyset([], network=policy_default)
    p = ProfileBuilder(ps).build(grant(), manifest(network=manifest_wants))
    assert p.network is expected


def test_manifest_asking_for_more_is_clipped_silently() -> None:
    p = ProfileBuilder(ACME).build(grant(), manifest(limits=Limits(timeout_ms=999_999),
                                                     network=NetworkMode.RESTRICTED))
    assert p.limits.timeout_ms == 60_000
    assert p.network is NetworkMode.RESTRICTED
    assert all(getattr(p.limits, f) is not None for f in Limits.model_fields)


def test_settings_narrow_and_set_mappings() -> None:
    p = ProfileBuilder(ACME).build(grant(limits=Limits(pids=100)), manifest(), settings=Settings(
        limits=Limits(pids=128, max_files=10), root_fs="/srv/ws"))
    assert (p.limits.pids, p.limits.max_files) == (100, 10)
    assert (p.mappings.root_fs, p.mappings.tmp_dir, p.mappings.home) == (
        "/srv/ws", "/tmp/policy-engine", "/root")


def test_named_profile_read_only_drops_writes_and_turns_network_off() -> None:
    g = grant(fs("fs.read", "/workspace/**"), fs("fs.write", "/workspace/**"))
    m = manifest(fs("fs.read", "/workspace/**"), fs("fs.write", "/workspace/**"),
                 profile="safe-readonly")
    p = ProfileBuilder(ACME).build(g, m)
    assert [pc.kind for pc in p.capabilities] == [K.FS_READ]
    assert (p.network, p.name) == (NetworkMode.OFF, "safe-readonly")


def test_named_profile_writable_narrows_fs_write_and_limits() -> None:
    g = grant(fs("fs.write", "/workspace/**"))
    p = ProfileBuilder(ACME).build(g, manifest(fs("fs.write", "/workspace/**")),
                                   overrides=Overrides(profile="work-only"))
    assert caps_of(p.capabilities, K.FS_WRITE) == [(fs("fs.write", "/workspace/work/out/**"),)]
    assert p.limits.pids == 32


def test_unknown_named_profile_is_a_schema_error() -> None:
    with pytest.raises(PolicyEngineError) as exc:
        ProfileBuilder(ACME).build(grant(), manifest(profile="nope"))
    assert exc.value.code is ErrorCode.SCHEMA_VALIDATION_FAILED
    assert "`nope`" in exc.value.reason


def test_safety_side_effects_and_builtin_consent() -> None:
    b = ProfileBuilder(ACME)
    low = b.build(grant(), manifest(side_effects=(SideEffect.READ, SideEffect.NONE)))
    assert low.side_effects == (SideEffect.NONE, SideEffect.READ)
    assert not low.consent_required
    high = b.build(grant(), manifest(safety_class=SafetyClass.HIGH))
    assert high.safety is SafetyClass.HIGH
    assert high.consent_required
    assert b.build(grant(), manifest(side_effects=(SideEffect.WRITE,))).consent_required


def test_a_conditional_consent_rule_is_left_to_the_guard() -> None:
    # A CEL consent rule depends on the request: the profile must not mark consent as always
    # required (the guard evaluates the rule per call), and without the built-in rule even a
    # High-safety tool needs none from the profile.
    ps = policyset([], consent=(ConsentRule(RuleRef(id="c", file="f", line=1, column=1), SPAN,
                                            FakeCondition("request.size > 10")),))
    assert not ProfileBuilder(ps).build(grant(), manifest()).consent_required
    assert not ProfileBuilder(ps).build(grant(), manifest(
        safety_class=SafetyClass.HIGH)).consent_required
    assert not ProfileBuilder(policyset([])).build(grant(), manifest(
        safety_class=SafetyClass.HIGH)).consent_required


def test_cache_returns_the_same_object_for_the_same_inputs_and_equal_for_equal() -> None:
    b = ProfileBuilder(ACME)
    g, m = grant(fs("fs.read", "/workspace/**")), manifest(fs("fs.read", "/workspace/**"))
    first = b.build(g, m)
    assert b.build(g, m) is first
    again = b.build(grant(fs("fs.read", "/workspace/**")), manifest(
        fs("fs.read", "/workspace/**")))
    assert again == first
    assert again.profile_hash == first.profile_hash
    assert b.cache.stats()["shapes"] == 1  # equal inputs: one meet
    other = b.build(g, m, overrides=Overrides(limits=Limits(pids=1)))
    assert other.profile_hash != first.profile_hash


def test_cached_build_is_fast() -> None:
    b = ProfileBuilder(ACME)
    g, m = grant(fs("fs.read", "/workspace/**")), manifest(fs("fs.read", "/workspace/**"))
    b.build(g, m)
    per_call = min(timeit.repeat(lambda: b.build(g, m), number=2000, repeat=5)) / 2000
    assert per_call < 20e-6  # the benchmark target is 2 µs; leave room for slow CI machines


def test_concurrent_builds_share_one_shape() -> None:
    b = ProfileBuilder(ACME)
    results: list[object] = []

    def work() -> None:
        results.append(b.build(grant(fs("fs.read", "/workspace/**")),
                               manifest(fs("fs.read", "/workspace/**"))))

    threads = [threading.Thread(target=work) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(results) == 8
    assert all(r == results[0] for r in results)
    assert b.cache.stats()["shapes"] == 1  # one template kept, whichever thread stored it


_HASH_SCRIPT = """
import sys
sys.path.insert(0, {path!r})
import test_profile_builder as t
p = t.ProfileBuilder(t.ACME).build(t.grant(t.fs("fs.read", "/workspace/**")),
                                   t.manifest(t.fs("fs.read", "/workspace/**")))
print(p.profile_hash)
"""


def test_profile_hash_is_stable_across_processes() -> None:
    p = ProfileBuilder(ACME).build(grant(fs("fs.read", "/workspace/**")),
                                   manifest(fs("fs.read", "/workspace/**")))
    assert len(p.profile_hash) == 64
    here = str(__import__("pathlib").Path(__file__).parent)
    out = subprocess.run([sys.executable, "-c", _HASH_SCRIPT.format(path=here)],
                         capture_output=True, text=True, check=True,
                         env={"PYTHONHASHSEED": "12345", "PATH": ""})
    assert out.stdout.strip() == p.profile_hash


def test_profile_hash_changes_with_inputs_and_round_trips() -> None:
    b = ProfileBuilder(ACME)
    p1 = b.build(grant(), manifest())
    p2 = b.build(grant(), manifest(limits=Limits(pids=2)))
    assert p1.profile_hash != p2.profile_hash
    assert json.loads(p1.model_dump_json())["profile_hash"] == p1.profile_hash


def test_narrow_forbids_stay_out_of_the_flat_deny_lists() -> None:
    """The deny-lists apply to every fs kind / every request to a host; a forbid on fs.write
    only, or on POST only, must not refuse reads or GETs (it stays a rule-scoped ProfileDeny)."""
    ps = compile_files([EXAMPLES / "policies" / "org.sbpolicy"])
    editor = load_manifest(EXAMPLES / "manifests" / "file-editor.sbpolicy")
    p = ProfileBuilder(ps).build(load_grant(EXAMPLES / "grants" / "editor-agent.json"), editor)
    assert "/workspace/work/release/**" not in p.deny.paths
    assert "/root/.ssh/**" in p.deny.paths
    assert any(d.rule.id == "no-release-edits" for d in p.denies)
    guard = Guard(ps)
    release = "/workspace/work/release/notes.md"
    assert guard.decide(p, FsReadOp(path=release)).decision == "allow"
    write = guard.decide(p, FsWriteOp(path=release, bytes_b64="aGk="))
    assert (write.decision, write.rule.id if write.rule else None) == ("deny", "no-release-edits")

    fetch = ProfileBuilder(ps).build(load_grant(EXAMPLES / "grants" / "fetch-agent.json"),
                                     load_manifest(EXAMPLES / "manifests" / "http-fetch.yaml"))
    assert "gist.githubusercontent.com" not in fetch.deny.domains
    url = "https://gist.githubusercontent.com/acme/1/raw"
    assert guard.decide(fetch, NetHttpOp(method="GET", url=url)).decision == "allow"
    post = guard.decide(fetch, NetHttpOp(method="POST", url=url))
    assert (post.decision, post.rule.id if post.rule else None) == ("deny", "no-gist-writes")
