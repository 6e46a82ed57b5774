"""Outsider round 39, F02: ``spec.system_trees`` (commit 8341ea2) keeps which system trees exist
while ``/``'s own stamp is unchanged; but a top-level system name that is a link (``/lib64 ->
usr/lib64``, ``/bin -> usr/bin`` on merged-/usr systems) exists or not by its *target*, which
lives below ``/`` and changes without ``/`` changing. A link that dangled when first asked (the
``usr/lib64`` tree not installed yet) stays left out of every later sandbox after its target
appears — until something unrelated changes ``/`` (an engine restart): every dynamically linked
binary whose loader is ``/lib64/ld-linux-x86-64.so.2`` then fails to start in the sandbox. Before
the commit each plan asked ``os.path.exists`` again.

The real names (``/lib64``, ``/usr/lib64``) are system trees this test must not touch: it adds
one uniquely named top-level link to ``SYSTEM_RO`` (the list the planner reads; the same way
``test_proc_call_path`` exercises this cache), whose target it creates under its own tmp dir, and
removes the link in a ``finally``. Both calls run in the real proc-bwrap sandbox.
"""

from __future__ import annotations

import os
import time
import uuid
from pathlib import Path

import pytest

from plugins.executor_proc import spec
from plugins.executor_proc.executor import ProcExecutor
from policy_engine.executor import ExecContext
from policy_engine.model import ProcExecOp
from tests.integration.test_proc_sandbox import make_profile

pytestmark = pytest.mark.integration


def test_a_system_link_whose_target_appears_is_bound_by_the_next_call(
        tmp_path: Path, bwrap_proc: ProcExecutor, monkeypatch: pytest.MonkeyPatch) -> None:
    root = tmp_path / "root"
    (root / "out").mkdir(parents=True)
    profile = make_profile(root)
    target = tmp_path / "installed-later"
    link = f"/pe-a39-lib-{uuid.uuid4().hex[:10]}"
    os.symlink(str(target), link)  # dangling: the tree it names is not installed yet
    try:
        monkeypatch.setattr(spec, "SYSTEM_RO", (*spec.SYSTEM_RO, link))
        probe = ProcExecOp(tool="sh", args=("-c", f"readlink {link} || echo absent"))

        def seen() -> str:
            ctx = ExecContext(profile=profile, deadline=time.monotonic() + 60)
            res = bwrap_proc.execute(ctx, probe)
            assert res.ok, res.out
            assert res.out["exit_code"] == 0, res.out
            return str(res.out["stdout"]).strip()

        assert seen() == "absent"  # a dangling link is no system tree: right
        target.mkdir()  # the tree is installed below `/`; `/` itself is unchanged
        assert link in spec.system_trees(), \
            "the link's target exists now, but the kept answer still leaves it out"
        assert seen() == str(target), "the sandbox still lacks the system link"
    finally:
        os.unlink(link)
