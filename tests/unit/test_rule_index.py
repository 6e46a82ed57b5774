"""The permit index (profile.rule_index) changes which rules the meet visits, never the profile:
built with and without it, every generated grant gets the same profile, byte for byte."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest

from policy_engine.compiler import compile_files
from policy_engine.graph import PolicySet
from policy_engine.model import CapabilityKind, FsCapability, Grant, Manifest
from policy_engine.patterns.meet import decompose, meet_atom_sets
from policy_engine.profile import ProfileBuilder
from policy_engine.profile.rule_index import KindIndex

SEGS = ["data", "Data", "t1", "t2", "out", "*", "**", "?", "t?", "*.txt", "private", ".x"]
NAMES = ["svc1.example.com", "svc2.example.com", "example.com", "api.github.com",
         "a.b.example.com", "xn--bcher-kva.example", "localhost"]
HOSTS = [*NAMES, "*.example.com", "*.b.example.com", "*.github.com", "*", "10.0.0.0/8",
         "10.1.2.3", "::1", "*.com"]
TOOLS = ["git", "ls", "python3", "tool1"]


def _glob(rng: random.Random) -> str:
    if rng.random() < 0.08:
        return rng.choice(["/", "/**", "~/**", "**/*.pem"])
    return "/" + "/".join(rng.choice(SEGS) for _ in range(rng.randint(1, 4)))


def _rule(rng: random.Random, i: int) -> str:
    kind = rng.choice(["fs.read", "fs.write", "fs.list", "net.http", "browser.use", "proc.exec",
                       "tmp.use"])
    effect = "forbid" if rng.random() < 0.15 else "permit"
    if kind.startswith("fs."):
        paths = ", ".join(f'"{_glob(rng)}"' for _ in range(rng.randint(1, 2)))
        return f'{effect} "r{i}" {kind}  paths [{paths}]'
    if kind in ("net.http", "browser.use"):
        hosts = ", ".join(f'"{h}"' for h in rng.sample(HOSTS, rng.randint(1, 2)))
        extra = '  schemes ["https"]' if rng.random() < 0.5 else ""
        return f'{effect} "r{i}" {kind}  hosts [{hosts}]{extra}'
    if kind == "proc.exec":
        return f'{effect} "r{i}" proc.exec  tool "{rng.choice(TOOLS)}"'
    return f'permit "r{i}" tmp.use  max_bytes {rng.randint(1, 9)}MiB'


def _cap(rng: random.Random) -> dict[str, Any]:
    kind = rng.choice(["fs.read", "fs.write", "fs.list", "net.http", "browser.use", "proc.exec",
                       "tmp.use"])
    if kind.startswith("fs."):
        return {"kind": kind, "paths": [_glob(rng) for _ in range(rng.randint(1, 2))]}
    if kind in ("net.http", "browser.use"):
        return {"kind": kind, "hosts": rng.sample(HOSTS, rng.randint(1, 2))}
    if kind == "proc.exec":
        return {"kind": kind, "tool": rng.choice(TOOLS)}
    return {"kind": "tmp.use"}


WIDE = [{"kind": k, "paths": ["/**"]} for k in ("fs.read", "fs.write", "fs.list")] + [
    {"kind": "net.http", "hosts": ["*"], "schemes": ["https", "http"]},
    {"kind": "browser.use", "hosts": ["*"], "schemes": ["https", "http"]},
    *({"kind": "proc.exec", "tool": t} for t in TOOLS), {"kind": "tmp.use"},
]


def _policy(tmp: Path, seed: int) -> PolicySet:
    rng = random.Random(seed)
    rules = [_rule(rng, i) for i in range(rng.randint(5, 60))]
    path = tmp / f"p{seed}.sbpolicy"
    path.write_text(f'policy "t/idx{seed}" version "1.0.0"\n' + "\n".join(rules) + "\n",
                    encoding="utf-8")
    return compile_files([str(path)], home="/home/agent")


@pytest.mark.parametrize("seed", range(40))
def test_index_builds_the_same_profiles(tmp_path: Path, seed: int) -> None:
    ps = _policy(tmp_path, seed)
    rng = random.Random(seed * 7919)
    manifest = Manifest.model_validate({"name": "t", "version": "1", "permissions": WIDE,
                                        "side_effects": ["Read"], "safety_class": "Low"})
    indexed, plain = ProfileBuilder(ps), ProfileBuilder(ps, index=False)
    for n in range(25):
        grant = Grant.model_validate({
            "tenant": "a", "subject_id": "s", "tool_name": "t", "call_id": f"c{n}",
            "expires_at": 1, "capabilities": [_cap(rng) for _ in range(rng.randint(1, 4))]})
        want = plain.build_uncached(grant, manifest)
        got = indexed.build_uncached(grant, manifest)
        assert got == want, (seed, n, grant.capabilities)
        assert got.profile_hash == want.profile_hash


def test_index_skips_rules_that_cannot_meet(tmp_path: Path) -> None:
    # the point of the index: with many rules, a narrow grant visits only its own
    lines = [f'permit "r{i}" fs.read  paths ["/data/t{i}/**"]' for i in range(200)]
    lines.append('permit "all" fs.read  paths ["/**/*.md"]')
    path = tmp_path / "many.sbpolicy"
    path.write_text('policy "t/many" version "1"\n' + "\n".join(lines) + "\n", encoding="utf-8")
    ps = compile_files([str(path)], home="/home/agent")
    idx = KindIndex(ps.permits_by_kind[CapabilityKind.FS_READ], CapabilityKind.FS_READ,
                    ps.home)
    base = decompose(FsCapability(kind="fs.read", paths=("/data/t7/src/**",)), ps.home)
    got = [idx.rules[i].id for i in idx.candidates(base)]
    assert got == ["r7", "all"]
    # and every rule it skipped has an empty meet
    for i, rule in enumerate(idx.rules):
        if rule.id not in got:
            assert meet_atom_sets(base, idx.atoms[i]) == (), rule.id
