"""The explain pipeline end to end on real compiled policies: profile errors, budgets, naming."""

from __future__ import annotations

from pathlib import Path

import pytest

from policy_engine.compiler import compile_files
from policy_engine.explain import ExplainRequest, explain
from policy_engine.graph import PolicySet
from policy_engine.model import (
    Grant,
    Manifest,
    NetHttpCapability,
    NetHttpOp,
    Overrides,
    Usage,
)

FAR = 4_102_444_800_000
NOW = 1_795_000_000_000


def compile_text(tmp_path: Path, text: str) -> PolicySet:
    path = tmp_path / "p.sbpolicy"
    path.write_text('policy "t" version "1.0.0"\n' + text)
    return compile_files([path])


def fetch(hosts: tuple[str, ...]) -> tuple[Manifest, Grant]:
    cap = NetHttpCapability(hosts=hosts, schemes=("https",), methods=("GET",))
    manifest = Manifest(name="fetch", version="1", permissions=(
        NetHttpCapability(hosts=("*",), schemes=("https",), methods=("GET",)),), network="on")
    grant = Grant(tenant="t", subject_id="agent:a", tool_name="fetch", call_id="c",
                  capabilities=(cap,), expires_at=FAR)
    return manifest, grant


def get(url: str, **extra: object) -> ExplainRequest:
    return ExplainRequest.model_validate({"op": NetHttpOp(url=url), "now_ms": NOW, **extra})


@pytest.mark.parametrize("url", [
    "https://169.254.169.254/latest/meta-data/",
    "https://2852039166/latest/meta-data/",
    "https://0xa9fea9fe/",
    "https://[::ffff:169.254.169.254]/",
])
def test_a_grant_naming_a_metadata_address_cannot_lift_the_refusal(
    tmp_path: Path, url: str,
) -> None:
    # The policy permits `*`, which never names a private address; the grant names the
    # metadata IP literally. The meet carries the grant's literal, but only a policy rule may
    # name a private address.
    ps = compile_text(tmp_path, 'permit "web" net.http hosts ["*"] schemes ["https"]\n')
    manifest, grant = fetch(("169.254.169.254", "::ffff:169.254.169.254", "api.github.com"))
    d = explain(ps, manifest, grant, get(url)).decision
    assert (d.decision, d.code) == ("deny", "SANDBOX.CAPABILITY_BLOCKED")


def test_a_policy_rule_naming_the_address_admits_it(tmp_path: Path) -> None:
    ps = compile_text(
        tmp_path, 'permit "lan" net.http hosts ["10.0.0.0/8"] schemes ["https"]\n')
    manifest, grant = fetch(("10.0.0.5",))
    d = explain(ps, manifest, grant, get("https://10.0.0.5/simple/")).decision
    assert (d.decision, d.rule.id if d.rule else None) == ("allow", "lan")


def test_a_public_host_is_admitted_by_a_wildcard_rule(tmp_path: Path) -> None:
    ps = compile_text(tmp_path, 'permit "web" net.http hosts ["*"] schemes ["https"]\n')
    manifest, grant = fetch(("api.github.com",))
    assert explain(ps, manifest, grant, get("https://api.github.com/")).decision.allowed


def test_a_widening_override_is_a_deny_naming_the_field(tmp_path: Path) -> None:
    ps = compile_text(tmp_path, 'permit "web" net.http hosts ["*"] schemes ["https"]\n')
    manifest, grant = fetch(("api.github.com",))
    req = get("https://api.github.com/", overrides=Overrides.model_validate(
        {"limits": {"max_bytes_in": 10**12}}))
    exp = explain(ps, manifest, grant, req)
    assert exp.profile is None
    assert exp.decision.code == "SANDBOX.PERMISSION_DENY"
    assert "`limits.max_bytes_in`" in exp.decision.reason
    assert exp.to_json()["trace"][0]["node"] == "profile"


def test_dry_run_budget_refuses_the_call_after_the_last_one(tmp_path: Path) -> None:
    ps = compile_text(tmp_path, 'permit "web" net.http hosts ["*"] schemes ["https"]\n')
    manifest, grant = fetch(("api.github.com",))
    grant = grant.model_copy(update={"budget": grant.budget.model_copy(update={"calls": 3})})
    ok = explain(ps, manifest, grant, get("https://api.github.com/", budget_used=Usage(calls=2)))
    over = explain(ps, manifest, grant,
                   get("https://api.github.com/", budget_used=Usage(calls=3)))
    assert ok.decision.allowed
    assert (over.decision.code, over.decision.http_status) == ("QUOTA.BUDGET_EXCEEDED", 429)
    assert over.decision.trace is not None
    assert over.decision.trace[-1].node == "budget"
