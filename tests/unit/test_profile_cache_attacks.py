"""Outsider attack round 8 on the profile cache and per-call profiles: each finding fixed here
failed before its fix (findings F1-F9; F10 is in test_cel_schema.py). The oracle is always a
fresh builder (``build_uncached``) and a fresh guard."""

from __future__ import annotations

import math
import shutil
import warnings
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from policy_engine.compiler import compile_files
from policy_engine.compiler.loaders import load_grant, load_manifest
from policy_engine.graph import PolicySet
from policy_engine.guard import Guard
from policy_engine.model import FsReadOp, Grant, Limits, Manifest, Overrides, ProcExecOp, Settings
from policy_engine.profile import ProfileBuilder, ProfileCache
from policy_engine.profile.hashing import profile_hash

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
GIT = ProcExecOp(tool="git", args=["status"])


@pytest.fixture(scope="module")
def org() -> PolicySet:
    return compile_files([EXAMPLES / "policies" / "org.sbpolicy"])


@pytest.fixture(scope="module")
def shell() -> tuple[Grant, Manifest]:
    return (load_grant(EXAMPLES / "grants" / "shell-agent.json"),
            load_manifest(EXAMPLES / "manifests" / "shell.json"))


@pytest.mark.parametrize("update", [
    {"expires_at": 1},  # long expired
    {"consent": None},  # consent is required (Process side effect)
    {"capabilities": ()},  # nothing permitted
])
def test_f1_a_lookalike_keeping_a_cached_hash_is_decided_on_its_own(
        org: PolicySet, shell: tuple[Grant, Manifest], update: dict[str, Any]) -> None:
    profile = ProfileBuilder(org).build(*shell)
    guard = Guard(org)
    assert guard.decide(profile, GIT).decision == "allow"  # compiled and cached by its hash
    lookalike = profile.model_copy(update=update)  # keeps profile_hash
    got, fresh = guard.decide(lookalike, GIT), Guard(org).decide(lookalike, GIT)
    assert fresh.decision == "deny"
    assert (got.decision, got.code, got.reason) == (fresh.decision, fresh.code, fresh.reason)
    assert guard.decide(profile, GIT).decision == "allow"


def test_f1_tighter_limits_of_a_lookalike_apply(org: PolicySet,
                                               shell: tuple[Grant, Manifest]) -> None:
    profile = ProfileBuilder(org).build(*shell)
    guard = Guard(org)
    read = FsReadOp(path="/workspace/a.txt")
    guard.decide(profile, read)
    tight = profile.model_copy(update={
        "limits": profile.limits.model_copy(update={"max_bytes_in": 1, "timeout_ms": 1}),
        "timeout_ms": 1})
    got = guard.decide(tight, read)
    assert got.limits is not None
    assert got.limits == Guard(org).decide(tight, read).limits
    assert got.limits.max_bytes_in == 1


def test_f5_a_decision_names_its_own_limit_layers(org: PolicySet,
                                                 shell: tuple[Grant, Manifest]) -> None:
    """``limit_layers`` explains and is left out of the hash on purpose (docs/operations.md):
    two profiles differing only there share a hash, and each decision still names its own."""
    grant, manifest = shell
    data = manifest.model_dump()
    from_manifest = Manifest.model_validate({**data, "limits": {**data["limits"],
                                                                "max_files": 50}})
    b = ProfileBuilder(org)
    p_a = b.build(grant, from_manifest)
    p_b = b.build(grant, manifest, settings=Settings(limits=Limits(max_files=50)))
    assert p_a.limit_layers != p_b.limit_layers
    assert p_a.profile_hash == p_b.profile_hash
    op = FsReadOp(path="/workspace/a.txt")
    guard = Guard(org)
    guard.decide(p_a, op)
    assert guard.decide(p_b, op).limit_layers == Guard(org).decide(p_b, op).limit_layers


@pytest.mark.parametrize("update", [{"call_id": None}, {"call_id": 5},
                                    {"expires_at": 4102444800000.5}])
def test_f2_a_cached_shape_validates_call_fields_as_a_full_build(
        org: PolicySet, shell: tuple[Grant, Manifest], update: dict[str, Any]) -> None:
    grant, manifest = shell
    bad = grant.model_copy(update=update)  # skips validation
    with pytest.raises(ValidationError):
        ProfileBuilder(org).build_uncached(bad, manifest)
    builder = ProfileBuilder(org)
    builder.build(grant, manifest)  # the shape is cached
    with pytest.raises(ValidationError):
        builder.build(bad, manifest)


@pytest.mark.parametrize("cached", [True, False])
def test_f3_the_hash_is_the_references_for_an_unvalidated_call_field(
        org: PolicySet, shell: tuple[Grant, Manifest], cached: bool) -> None:
    grant, manifest = shell
    odd = grant.model_copy(update={"expires_at": True})
    b = ProfileBuilder(org)
    if cached:
        b.build(grant, manifest)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # pydantic warns serialising the unvalidated value
        p = b.build(odd, manifest) if cached else b.build_uncached(odd, manifest)
        assert p.profile_hash == profile_hash(p, org.version_hash, manifest.version)


@pytest.mark.parametrize("value", [math.inf, -math.inf, math.nan, 1e400])
def test_f4_a_limit_is_finite_so_none_can_serialise_as_unset(value: float) -> None:
    """JSON has no infinity: pydantic wrote ``cpu_cores=inf`` as ``null``, the key of an unset
    limit, so ``Overrides(limits={cpu_cores: inf})`` (refused: it widens) shared the cached
    shape of ``Overrides()`` (allowed)."""
    with pytest.raises(ValidationError, match="finite"):
        Limits(cpu_cores=value)
    with pytest.raises(ValidationError, match="finite"):
        Overrides.model_validate({"limits": {"cpu_cores": value}})


def test_f6_cache_sizes_are_checked_up_front(org: PolicySet) -> None:
    for bad in (-1, 0, True, 1.5):
        with pytest.raises(ValueError, match="cache_size"):
            Guard(org, cache_size=bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="identity"):
        ProfileCache(size=1, shape_size=1, identity_size=-1)
    assert ProfileCache(identity_size=0).stats() == {"identity": 0, "calls": 0, "shapes": 0}


def test_f9_a_cache_serves_one_policy_set(org: PolicySet, shell: tuple[Grant, Manifest],
                                          tmp_path: Path) -> None:
    for name in ("org.sbpolicy", "secrets.sbpolicy", "network.sbpolicy"):
        shutil.copy(EXAMPLES / "policies" / name, tmp_path / name)
    stricter = tmp_path / "org.sbpolicy"
    stricter.write_text(stricter.read_text().replace(
        'forbid "no-release-edits"',
        'forbid "no-workspace-reads" fs.read paths ["/workspace/**"]\n'
        'forbid "no-release-edits"'))
    other = compile_files([stricter])
    cache = ProfileCache(size=8, shape_size=8)
    ProfileBuilder(org, cache=cache).build(*shell)
    ProfileBuilder(org, cache=cache).build(*shell)  # the same policy set may share it
    with pytest.raises(ValueError, match="another policy set"):
        ProfileBuilder(other, cache=cache)


def test_f7_shared_limit_layers_cannot_be_edited(org: PolicySet,
                                                 shell: tuple[Grant, Manifest]) -> None:
    """Per-call profiles share their shape's ``limit_layers`` and decisions their compilation's:
    an edit through one would rewrite what every later call reports, so the maps refuse it."""
    import copy
    import json
    import pickle

    from policy_engine.model.readonly import ReadOnlyDict

    grant, manifest = shell
    b = ProfileBuilder(org)
    p1 = b.build(grant, manifest)
    p2 = b.build(grant.model_copy(update={"call_id": "call-2"}), manifest)
    decision = Guard(org).decide(p1, FsReadOp(path="/workspace/a.txt"))
    timed = Guard(org).decide(p1, ProcExecOp(tool="git", args=["status"], timeout_ms=5))
    for layers in (p1.limit_layers, p2.limit_layers, decision.limit_layers,
                   timed.limit_layers, *(c.limit_layers for c in p1.capabilities
                                         if c.limit_layers is not None)):
        assert isinstance(layers, ReadOnlyDict)
        with pytest.raises(TypeError, match="cannot change"):
            layers["max_files"] = "request"
        with pytest.raises(TypeError):
            layers.update(max_files="request")
        assert pickle.loads(pickle.dumps(layers)) == layers
        assert copy.deepcopy(layers) == layers
    assert p2.limit_layers == ProfileBuilder(org).build_uncached(
        grant.model_copy(update={"call_id": "call-2"}), manifest).limit_layers
    assert json.loads(p1.model_dump_json())["limit_layers"] == dict(p1.limit_layers)
    assert timed.limit_layers is not None
    assert timed.limit_layers["timeout_ms"] == "request"
