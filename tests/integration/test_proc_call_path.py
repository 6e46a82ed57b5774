"""The proc call path's kept answers (issue 27 item 4): the system trees and the top-level links
kept while ``/`` is unchanged, one look at a profile's binds per call, and a result assembled
without validation that is exactly the validated one."""

from __future__ import annotations

import base64
import hashlib
import os
import time
import uuid
from pathlib import Path

import pytest
from pydantic import BaseModel

from plugins.executor_proc import bwrap, spec
from plugins.executor_proc.executor import ProcExecutor
from policy_engine.capture import HeadTail
from policy_engine.executor import ExecContext
from policy_engine.guard.binds import bound_paths, one_view
from policy_engine.model import ProcExecOp
from tests.integration.test_proc_sandbox import fs_cap, make_profile


def _same(model: BaseModel) -> None:
    """``model`` is what validating its given fields builds (as test_orchestration_records)."""
    again = type(model)(**{k: getattr(model, k) for k in model.model_fields_set})
    assert model.__dict__ == again.__dict__
    assert list(model.__dict__) == list(type(model).model_fields)
    assert model.model_fields_set == again.model_fields_set
    assert model.model_dump_json() == again.model_dump_json()


def test_the_assembled_result_and_side_effect_are_the_validated_ones(
        tmp_path: Path, bwrap_proc: ProcExecutor) -> None:
    root = tmp_path / "root"
    (root / "out").mkdir(parents=True)
    (root / "home" / ".ssh").mkdir(parents=True)
    (root / ".env").write_text("SECRET=1\n")  # masked: the result names it
    ctx = ExecContext(profile=make_profile(root), deadline=time.monotonic() + 30)
    op = ProcExecOp(tool="sh", args=("-c", "echo out; echo err >&2; exit 3"))
    res = bwrap_proc.execute(ctx, op)
    assert res.ok
    assert res.out["exit_code"] == 3
    assert res.out["stdout"] == "out\n"
    assert res.out["stderr"] == "err\n"
    assert res.out["stdout_digest"] == {
        "algo": "sha256", "b64": base64.b64encode(hashlib.sha256(b"out\n").digest()).decode(),
        "size": 4}
    assert str(root / ".env") in res.out["masked"]
    assert res.out["limits"]["memory"].startswith("cgroup memory=")
    assert res.used.cpu_ms == res.out["cpu_ms"]
    for model in (res, res.used, *ctx.side_effects):
        _same(model)
    effect = ctx.side_effects[-1].meta
    assert list(effect) == ["op", "tool", "argc", "argv_digest", "exit_code", "backend"]
    assert effect["exit_code"] == 3
    assert effect["argc"] == 3


def test_a_digest_built_directly_is_the_models_dump() -> None:
    for data in (b"", b"x", b"y" * 100_000):
        ht = HeadTail(16)
        ht.feed(data)
        assert ht.digest_fields() == ht.digest().model_dump()


def test_a_name_added_to_the_root_changes_its_stamp() -> None:
    before = spec.root_stamp()
    name = f"/pe-test-stamp-{uuid.uuid4().hex[:8]}"
    os.mkdir(name)  # an empty directory of a moment: no sandbox binds it
    try:
        assert spec.root_stamp() != before
    finally:
        os.rmdir(name)


def test_the_system_trees_are_looked_up_again_once_the_root_changes(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    stamp = [(1, 2, 3, 4)]
    monkeypatch.setattr(spec, "SYSTEM_RO", (str(a), str(b)))
    monkeypatch.setattr(spec, "root_stamp", lambda: stamp[0])
    monkeypatch.setattr(spec, "_ROOT", [])
    first = spec.system_trees()
    assert first[0] == str(a)
    assert str(b) not in first
    b.mkdir()
    assert spec.system_trees() == first  # kept: the root says nothing changed
    stamp[0] = (1, 2, 3, 5)
    again = spec.system_trees()
    assert again[:2] == [str(a), str(b)]
    extra = tmp_path / "extra"
    assert str(extra) not in spec.system_trees([str(extra)])
    extra.mkdir()  # extras are looked at every time
    assert spec.system_trees([str(extra)])[-1] == str(extra)


def test_a_top_level_link_replaced_is_seen_by_the_next_argv() -> None:
    link = f"/pe-test-link-{uuid.uuid4().hex[:8]}"
    os.symlink("usr/lib", link)
    try:
        assert bwrap._system_args([link]) == ["--symlink", "usr/lib", link]
        assert bwrap._system_args([link]) == ["--symlink", "usr/lib", link]  # kept
        os.unlink(link)
        os.symlink("usr/bin", link)  # the root's entries changed: asked again
        assert bwrap._system_args([link]) == ["--symlink", "usr/bin", link]
        os.unlink(link)
        os.mkdir(link)
        assert bwrap._system_args([link]) == ["--ro-bind", link, link]
    finally:
        if os.path.islink(link):
            os.unlink(link)
        elif os.path.isdir(link):
            os.rmdir(link)


def test_one_view_sees_a_profiles_binds_once(tmp_path: Path) -> None:
    root = tmp_path / "root"
    (root / "p1" / "out").mkdir(parents=True)
    profile = make_profile(root).model_copy(update={"capabilities": (
        fs_cap("fs.read", f"{root}/*/out/**"),)})
    assert bound_paths(profile)[0] == [str(root / "p1" / "out")]
    with one_view():
        first = bound_paths(profile)
        (root / "p2" / "out").mkdir(parents=True)  # a match appearing mid-call
        assert bound_paths(profile) == first  # the check and the plan bind the same
        first[0].append("/x")
        assert bound_paths(profile)[0] == [str(root / "p1" / "out")]  # a copy each time
        with one_view():  # nested: the outer call's view
            assert bound_paths(profile) == ([str(root / "p1" / "out")], [])
    assert bound_paths(profile)[0] == [str(root / "p1" / "out"), str(root / "p2" / "out")]
