"""Compiler output: the realistic fixture policy, built-ins, indices, ids, home, version hash."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from policy_engine.compiler import STAGES, compile_files
from policy_engine.compiler.builtins import MANDATORY_DENY_ID, MANDATORY_DENY_PATHS
from policy_engine.errors import DiagnosticsError
from policy_engine.graph import PolicySet
from policy_engine.model import (
    CapabilityKind,
    FsCapability,
    NetHttpCapability,
    NetworkMode,
    ProcCapability,
    TmpCapability,
)

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "policies"
ORG = FIXTURES / "org.sbpolicy"
HOME = "/home/agent"


@pytest.fixture(scope="module")
def org() -> PolicySet:
    return compile_files([ORG], home=HOME)


def test_header_defaults_and_files(org: PolicySet) -> None:
    assert (org.name, org.version) == ("acme/agents", "1.4.0")
    assert org.network is NetworkMode.OFF
    assert org.defaults.timeout_ms == 60_000
    assert org.defaults.max_bytes_in == 10 * 1024 * 1024
    assert org.defaults.max_concurrency == 4
    assert [Path(f).name for f in org.files] == ["network.sbpolicy", "org.sbpolicy"]
    assert org.home == HOME
    assert len(org.version_hash) == 64


def test_rule_order_ids_and_refs(org: PolicySet) -> None:
    ids = [r.id for r in org.rules]
    # built-ins, then the imported file, then the importing file, each in source order
    assert ids == [MANDATORY_DENY_ID, "github-api", "network:5", "network:8", "org:13",
                   "org:15", "read-workspace", "org:18", "org:21", "org:24", "org:25"]
    read = next(r for r in org.rules if r.id == "read-workspace")
    assert (Path(read.ref.file).name, read.ref.line, read.ref.column) == ("org.sbpolicy", 17, 1)
    assert read.span.line == 17
    assert read.kinds == (CapabilityKind.FS_READ, CapabilityKind.FS_LIST)


def test_indices_put_mandatory_forbids_first(org: PolicySet) -> None:
    forbid_read = [r.id for r in org.forbids_by_kind[CapabilityKind.FS_READ]]
    assert forbid_read == [MANDATORY_DENY_ID, "org:13", "org:15"]
    assert [r.mandatory for r in org.forbids_by_kind[CapabilityKind.FS_READ]] == [
        True, True, False]
    assert [r.id for r in org.permits_by_kind[CapabilityKind.FS_READ]] == ["read-workspace"]
    assert [r.id for r in org.forbids_by_kind[CapabilityKind.NET_HTTP]] == ["network:8"]
    assert set(org.permits_by_kind) == set(CapabilityKind)
    assert org.permits_by_kind[CapabilityKind.FS_WRITE][0].condition is not None


def test_capabilities_are_built_and_home_expanded(org: PolicySet) -> None:
    builtin = org.rules[0]
    cap = builtin.capabilities[CapabilityKind.FS_READ]
    assert isinstance(cap, FsCapability)
    assert f"{HOME}/.ssh/**" in cap.paths
    assert "/**/.env" in cap.paths
    assert len(cap.paths) == len(MANDATORY_DENY_PATHS)
    assert set(builtin.kinds) == {CapabilityKind.FS_READ, CapabilityKind.FS_WRITE,
                                  CapabilityKind.FS_LIST}
    assert builtin.ref.file == "<builtin>"
    by_id = {r.id: r for r in org.rules}
    net = by_id["github-api"].capabilities[CapabilityKind.NET_HTTP]
    assert isinstance(net, NetHttpCapability)
    assert net.ports == (443,)
    assert net.methods == ("GET", "HEAD")
    assert net.schemes == ("https",)
    proc = by_id["org:21"].capabilities[CapabilityKind.PROC_EXEC]
    assert isinstance(proc, ProcCapability)
    assert proc.tool == "git"
    assert proc.args is not None
    assert proc.args[1].repeat
    assert proc.args[1].alternatives[0].regex == "^--(oneline|stat)$"
    limits = by_id["org:21"].limits
    assert limits is not None
    assert limits.memory_bytes == 512 * 1024**2
    assert limits.pids == 64
    assert limits.timeout_ms == 30_000
    assert limits.cpu_cores == 1.0
    tmp = by_id["org:24"].capabilities[CapabilityKind.TMP_USE]
    assert isinstance(tmp, TmpCapability)
    assert tmp.max_bytes == 64 * 1024**2
    user_mandatory = by_id["org:13"].capabilities[CapabilityKind.FS_LIST]
    assert isinstance(user_mandatory, FsCapability)
    assert user_mandatory.paths == (f"{HOME}/.kube/**", "/**/id_rsa")


def test_profiles_builtin_and_defined(org: PolicySet) -> None:
    assert set(org.profiles) == {"safe-readonly", "workspace-write", "networked-dev",
                                 "high-isolation", "ci-runner"}
    assert org.profiles["safe-readonly"].span.file.endswith("org.sbpolicy")
    ci = org.profiles["ci-runner"]
    assert ci.network is NetworkMode.RESTRICTED
    assert ci.fs_mode == "read-write"
    assert ci.writable == ("/workspace/work/**", f"{HOME}/cache/**")
    assert ci.limits.timeout_ms == 300_000
    assert ci.limits.memory_bytes == 2 * 1024**3
    iso = org.profiles["high-isolation"]
    assert iso.limits.timeout_ms == 10_000
    assert iso.limits.cpu_cores == 0.5
    assert iso.fs_mode == "read-only"
    assert iso.network is NetworkMode.OFF
    assert org.profiles["workspace-write"].writable == ("/workspace/**",)
    assert org.profiles["networked-dev"].network is NetworkMode.ON


def test_consent_rules(org: PolicySet, tmp_path: Path) -> None:
    (rule,) = org.consent_rules
    assert rule.condition is not None
    assert rule.ref.line == 27
    ok, _ = rule.condition.evaluate({"profile": {"safety": "Low", "side_effects": ["Write"]}})
    assert ok
    plain = tmp_path / "p.sbpolicy"
    plain.write_text('policy "p" version "1"\n')
    (default,) = compile_files([plain], home=HOME).consent_rules
    assert default.condition is None
    assert default.ref.file == "<builtin>"
    plain.write_text('policy "p" version "1"\nrequire consent\n')
    (always,) = compile_files([plain], home=HOME).consent_rules
    assert always.condition is not None
    assert always.condition.evaluate({}) == (True, None)


def test_tool_blocks_become_manifests(tmp_path: Path) -> None:
    src = (FIXTURES / "tools" / "git-helper.sbpolicy").read_text()
    policy = tmp_path / "p.sbpolicy"
    policy.write_text('policy "p" version "1"\n' + src)
    ps = compile_files([policy], home=HOME)
    manifest = ps.tools["git-helper"]
    assert manifest.profile == "workspace-write"
    assert manifest.limits.timeout_ms == 20_000
    fs = manifest.permissions[1]
    assert isinstance(fs, FsCapability)
    assert fs.paths == ("/workspace/**", f"{HOME}/.gitconfig")
    assert all(r.id == MANDATORY_DENY_ID for r in ps.rules)  # tool permits are not org rules


def test_policy_defined_profile_overrides_the_seed_one(tmp_path: Path) -> None:
    p = tmp_path / "p.sbpolicy"
    p.write_text('policy "p" version "1"\nprofile "high-isolation" { timeout 1s }\n')
    ps = compile_files([p], home=HOME)
    assert ps.profiles["high-isolation"].limits.timeout_ms == 1000
    assert ps.profiles["high-isolation"].limits.pids is None


def test_several_files_are_merged_in_order(tmp_path: Path) -> None:
    a, b = tmp_path / "a.sbpolicy", tmp_path / "b.sbpolicy"
    a.write_text('policy "set" version "2"\npermit fs.read paths ["/a/**"]\n')
    b.write_text('permit fs.read paths ["/b/**"]\n')
    ps = compile_files([a, b], home=HOME)
    assert ps.name == "set"
    assert [r.id for r in ps.rules[1:]] == ["a:2", "b:1"]


def test_stage_table_is_ordered_and_named() -> None:
    names = [name for name, _, _ in STAGES]
    assert names[0] == "ResolveImports"
    assert names[-1] == "BuildRuleIndices"
    assert names.index("CompileConditions") < names.index("CheckTypes")
    assert names.index("AddBuiltins") < names.index("ComputeVersionHash")
    assert names.index("ComputeVersionHash") < names.index("ExpandHome")


def test_errors_raise_with_every_diagnostic(tmp_path: Path) -> None:
    p = tmp_path / "p.sbpolicy"
    p.write_text('policy "p" version "1"\npermit fs.read hosts ["x.com"] paths ["rel"]\n'
                 "permit fs.bogus\n")
    with pytest.raises(DiagnosticsError) as info:
        compile_files([p], home=HOME)
    assert sorted(d.id for d in info.value.diagnostics) == ["SBP206", "SBP212", "SBP214"]


# ---- version hash ------------------------------------------------------------------------


def test_version_hash_is_stable_and_location_independent(tmp_path: Path, org: PolicySet) -> None:
    assert compile_files([ORG], home=HOME).version_hash == org.version_hash
    # a different home does not change the version (paths are hashed before `~` expands)
    assert compile_files([ORG], home="/root").version_hash == org.version_hash
    moved = tmp_path / "elsewhere"
    shutil.copytree(FIXTURES, moved)
    assert compile_files([moved / "org.sbpolicy"], home=HOME).version_hash == org.version_hash


def test_version_hash_is_the_same_in_a_fresh_interpreter(org: PolicySet) -> None:
    code = ("from policy_engine.compiler import compile_files; import sys; "
            "print(compile_files([sys.argv[1]], home='/x').version_hash)")
    out = subprocess.run([sys.executable, "-c", code, str(ORG)], capture_output=True,
                         text=True, check=True, env={"PYTHONHASHSEED": "123", "PATH": ""})
    assert out.stdout.strip() == org.version_hash


def test_version_hash_changes_with_the_policy(tmp_path: Path, org: PolicySet) -> None:
    moved = tmp_path / "copy"
    shutil.copytree(FIXTURES, moved)
    net = moved / "common" / "network.sbpolicy"
    net.write_text(net.read_text().replace("[443]", "[8443]"))
    assert compile_files([moved / "org.sbpolicy"], home=HOME).version_hash != org.version_hash
