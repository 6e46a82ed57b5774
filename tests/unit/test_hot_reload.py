"""Hot reload: calls keep running while the policy file changes; none sees a half-loaded policy.

Real orchestrator, real tmp executor, real files rewritten on disk by a writer thread while two
caller threads run calls; each call's decision is checked against the version its own evidence
says it ran under.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

from policy_engine.compiler import compile_files
from policy_engine.compiler.loaders import load_grant, load_manifest
from policy_engine.config import EngineConfig
from policy_engine.model import TmpAllocOp
from policy_engine.orchestrator import Orchestrator
from policy_engine.rollout.reload import PolicyReloader

# A allows a 4 KiB scratch allocation, B does not: which one decided is visible in the outcome
A = ('policy "reload/p" version "1.0.0"\n\nimport "limits.sbpolicy"\n\n'
     'permit "big" tmp.use max_bytes 1MiB\n')
B = ('policy "reload/p" version "2.0.0"\n\nimport "limits.sbpolicy"\n\n'
     'permit "small" tmp.use max_bytes 1KiB\n')
LIMITS = ('policy "reload/limits" version "1.0.0"\n\n'
          'forbid "no-fs" fs.write paths ["/nowhere/**"]\n')
GRANT = {"tenant": "acme", "subject_id": "agent:1", "tool_name": "scratch", "call_id": "c1",
         "expires_at": 4_000_000_000_000, "capabilities": [{"kind": "tmp.use"}]}
MANIFEST = {"name": "scratch", "version": "1.0", "permissions": [{"kind": "tmp.use"}]}


def setup(tmp: Path) -> tuple[Orchestrator, Path]:
    (tmp / "limits.sbpolicy").write_text(LIMITS)
    entry = tmp / "p.sbpolicy"
    entry.write_text(A)
    (tmp / "g.json").write_text(json.dumps(GRANT))
    (tmp / "m.json").write_text(json.dumps(MANIFEST))
    config = EngineConfig(state_dir=tmp / "state", budget_meter="memory", revocation="memory")
    return Orchestrator(compile_files([entry]), config=config), entry


def test_reload_under_load_never_mixes_two_policies_in_a_call(tmp_path: Path) -> None:
    orch, entry = setup(tmp_path)
    hash_a = orch.policyset.version_hash
    reloader = PolicyReloader(orch, [entry])
    grant, manifest = load_grant(tmp_path / "g.json"), load_manifest(tmp_path / "m.json")
    stop = threading.Event()
    outcomes: list[tuple[str, bool, str | None]] = []
    lock = threading.Lock()

    def caller() -> None:
        while not stop.is_set():
            out = orch.run(grant, manifest, TmpAllocOp(size_bytes=4096))
            with lock:
                outcomes.append((out.end.policy_version_hash or "", out.result.ok,
                                 out.end.rule.id if out.end.rule else None))

    threads = [threading.Thread(target=caller) for _ in range(2)]
    for t in threads:
        t.start()
    versions = {hash_a}
    try:
        for i in range(12):  # flip A <-> B; each flip needs two polls to settle
            entry.write_text(B if i % 2 == 0 else A)
            assert reloader.check() is False  # first sighting: wait for it to settle
            assert reloader.check() is True
            versions.add(orch.policyset.version_hash)
            # let calls run under this version (a first call compiles it): flips, not the
            # machine's speed, decide how many calls straddle a reload
            with lock:
                seen = len(outcomes)
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                with lock:
                    if len(outcomes) >= seen + 2:
                        break
                time.sleep(0.001)
    finally:
        stop.set()
        for t in threads:
            t.join(30)
        orch.close()
    assert reloader.reloads == 12
    assert len(versions) == 2
    hash_b = (versions - {hash_a}).pop()
    assert len(outcomes) > 20
    for version, ok, rule in outcomes:
        # the decision matches the version recorded for that very call
        if version == hash_a:
            assert (ok, rule) == (True, "big")
        else:
            assert version == hash_b
            assert (ok, rule) == (False, "small")
    assert {v for v, _, _ in outcomes} == {hash_a, hash_b}


def test_a_broken_bundle_keeps_the_old_policy_and_is_reported(tmp_path: Path) -> None:
    orch, entry = setup(tmp_path)
    before = orch.policyset.version_hash
    reloader = PolicyReloader(orch, [entry])
    grant, manifest = load_grant(tmp_path / "g.json"), load_manifest(tmp_path / "m.json")
    # an imported file of the bundle breaks: the watcher follows imports, not only the entry
    (tmp_path / "limits.sbpolicy").write_text(
        'policy "reload/limits" version "1.0.0"\npermit oops\n')
    assert reloader.check() is False
    assert reloader.check() is False
    assert orch.policyset.version_hash == before
    health = reloader.health()
    assert health["status"] == "degraded"
    assert "limits.sbpolicy:2:" in health["reload_error"]
    assert orch.metrics.sample("sandbox_policy_reload_total", {"result": "failed"}) == 1.0
    assert reloader.check() is False  # the same broken content is not retried
    assert orch.metrics.sample("sandbox_policy_reload_total", {"result": "failed"}) == 1.0
    assert orch.run(grant, manifest, TmpAllocOp(size_bytes=4096)).result.ok  # still A
    (tmp_path / "limits.sbpolicy").write_text(LIMITS)  # fixed: back to the loaded content
    assert reloader.check() is False
    assert reloader.health()["status"] == "ok"
    entry.write_text(B)
    assert reloader.check() is False
    assert reloader.check() is True
    assert reloader.health()["status"] == "ok"
    out = orch.run(grant, manifest, TmpAllocOp(size_bytes=4096))
    assert out.result.code == "SANDBOX.CAPABILITY_BLOCKED"
    assert out.end.policy_version_hash == orch.policyset.version_hash != before
    orch.close()


def test_the_background_watcher_swaps_within_a_few_intervals(tmp_path: Path) -> None:
    orch, entry = setup(tmp_path)
    reloader = PolicyReloader(orch, [entry])
    reloader.start(interval_s=0.02)
    try:
        entry.write_text(B)
        for _ in range(200):
            if reloader.reloads:
                break
            threading.Event().wait(0.02)
    finally:
        reloader.stop()
        orch.close()
    assert reloader.reloads == 1
    assert orch.policyset.version == "2.0.0"
