"""Conditions see only the view fields they read (guard.viewfields): the same answers as with
the whole views, and a context whose size does not grow with the grant."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from policy_engine.compiler import compile_files
from policy_engine.dsl.cel import CelCondition, compile_condition
from policy_engine.errors import Span
from policy_engine.guard import Guard
from policy_engine.guard.compiled import static_views
from policy_engine.guard.viewfields import trim_views, view_fields
from policy_engine.model import FsReadOp, Grant, Manifest
from policy_engine.profile import ProfileBuilder

NOW = 1_795_000_000_000
FAR = 4_102_444_800_000


@pytest.mark.parametrize(("source", "want"), [
    ('grant.subject_id.startsWith("agent:")', {"grant": frozenset({"subject_id"})}),
    ("grant.budget.calls > 1 && profile.safety == 'Low'",
     {"grant": frozenset({"budget"}), "profile": frozenset({"safety"})}),
    ("grant . capabilities.exists(c, c.kind == 'fs.read')", {"grant": frozenset({"capabilities"})}),
    ('grant.exists(k, k == "budget")', {"grant": None}),  # a macro over the keys: whole view
    ("size(grant) > 1", {"grant": None}),
    ('grant["subject_id"] == "x"', {"grant": None}),
    ('"grant" == request.path', {"grant": None}),  # inside a string: cautious, whole view
    ("request.path.startsWith('/x') && now.getHours() > 1", {}),
    ("x.grantee == 1", {}),
])
def test_the_scan_names_fields_or_falls_back_to_the_whole_view(
        source: str, want: dict[str, Any]) -> None:
    assert dict(view_fields(source)) == want


POLICY = """\
policy "t/views" version "1.0.0"
defaults { timeout 60s  network on }
permit "read" fs.read  paths ["/workspace/**"]
  when `grant.subject_id.startsWith("agent:")`
"""


def _grant(n_caps: int) -> Grant:
    caps = [{"kind": "fs.read", "paths": ["/workspace/**"]}]
    caps += [{"kind": "fs.read", "paths": [f"/x{i}/**"]} for i in range(n_caps - 1)]
    return Grant.model_validate({
        "tenant": "acme", "subject_id": "agent:a", "tool_name": "t", "call_id": "c-1",
        "capabilities": caps, "expires_at": FAR,
        "budget": {"calls": 3}, "consent": {"granted_by": "u", "granted_at": 1,
                                            "expires_at": FAR}})


def _manifest() -> Manifest:
    return Manifest.model_validate({"name": "t", "version": "1.0.0", "side_effects": ["Read"],
                                    "permissions": [{"kind": "fs.read", "paths": ["/**"]}]})


@pytest.fixture(scope="module")
def builder(tmp_path_factory: pytest.TempPathFactory) -> ProfileBuilder:
    path: Path = tmp_path_factory.mktemp("views") / "p.sbpolicy"
    path.write_text(POLICY, encoding="utf-8")
    return ProfileBuilder(compile_files([str(path)], home="/home/agent"))


@pytest.mark.parametrize("source", [
    'grant.subject_id.startsWith("agent:")',
    "grant.capabilities.size() == 3 && grant.budget.calls == 3",
    "has(grant.nope)",
    "grant.nope == 1",  # an error with the whole view and with the trimmed one
    "size(grant) == 8",
    'grant.exists(k, k == "budget")',
    '"capabilities" in grant',
    'manifest.permissions.size() == 1 && profile.safety == "Low" && subject.id == "agent:a"',
    'grant.consent.granted_by == "u" && tenant.id == "acme" && manifest.nope == 2',
])
def test_trimmed_views_answer_as_the_whole_views(builder: ProfileBuilder, source: str) -> None:
    cond = compile_condition(source, Span("p", 1, 1))
    assert isinstance(cond, CelCondition)
    full = static_views(builder.build(_grant(3), _manifest()))
    trimmed = trim_views(full, [source])
    assert cond.evaluate_plain(trimmed) == cond.evaluate_plain(full)


def test_the_context_does_not_grow_with_the_grant(builder: ProfileBuilder) -> None:
    guard = Guard(builder.policyset, resolve_symlinks=False)
    op = FsReadOp(kind="fs.read", path="/workspace/a.txt")
    small, big = builder.build(_grant(1), _manifest()), builder.build(_grant(301), _manifest())
    for profile in (small, big):
        assert guard.decide(profile, op, now_ms=NOW).allowed
        assert guard.compiled(profile).views["grant"] == {"subject_id": "agent:a"}
    # a per-call copy of the big grant's shape carries the same trimmed view
    again = builder.build(_grant(301).model_copy(update={"call_id": "c-2"}), _manifest())
    assert guard.compiled(again).views["grant"] == {"subject_id": "agent:a"}
    assert guard.decide(again, op, now_ms=NOW).allowed


def test_only_variables_named_as_words_are_needed() -> None:
    from policy_engine.guard.compiled import guard_condition

    cond = compile_condition('profile.subject_id.startsWith("a") && now.getHours() > 1',
                             Span("p", 1, 1))
    assert isinstance(cond, CelCondition)
    assert "subject" in cond.variables  # the adapter's superset: `subject` in `subject_id`
    assert guard_condition(cond).needs == frozenset({"profile", "now"})
    both = compile_condition('subject.id == profile.subject_id', Span("p", 1, 1))
    assert isinstance(both, CelCondition)
    assert guard_condition(both).needs == frozenset({"profile", "subject"})
