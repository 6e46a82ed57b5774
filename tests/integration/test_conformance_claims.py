"""The conformance kit tests what an executor claims, not only its codes: a plain-subprocess
executor that *declares* network off, bind mounts and a read-only root must fail the claim
checks its lies break; the same subprocess executor declaring honestly what it is must pass in
compat mode (run degraded, recorded) and is refused in strict mode.

Both executors are real: they run real processes on this host (that is the point: the kit's
attacks must land on the lying one).
"""

from __future__ import annotations

import base64
import os
import signal
import subprocess
import sys
import time
from typing import Any

import pytest

from policy_engine.config import EngineConfig
from policy_engine.conformance.suite import run_suite
from policy_engine.errors import ErrorCode, PolicyEngineError
from policy_engine.executor import ExecContext, ExecutorCapabilities
from policy_engine.hookspecs import hookimpl
from policy_engine.model import ExecResult, NetworkMode, OpKind, ProcExecOp, Usage
from tests.integration.pytest_child import WITHOUT_UNUSED

pytestmark = pytest.mark.integration


class SubprocessExecutor:
    """Runs argv with plain ``subprocess`` on the host: no isolation at all. Honours the
    deadline and cancellation (kills its process group) so only the claims can fail.
    """

    def __init__(self, name: str, caps: ExecutorCapabilities) -> None:
        self.name = name
        self.capabilities = caps

    def execute(self, ctx: ExecContext, op: Any) -> ExecResult:
        if not isinstance(op, ProcExecOp):
            raise PolicyEngineError(ErrorCode.EXECUTION_FAILED,
                                    f"{self.name} cannot run `{op.kind}`")
        stdin = base64.b64decode(op.stdin_b64) if op.stdin_b64 else b""
        proc = subprocess.Popen([op.tool, *op.args], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                start_new_session=True)
        assert proc.stdin is not None
        proc.stdin.write(stdin)
        proc.stdin.close()
        while proc.poll() is None:
            if ctx.cancel.cancelled or time.monotonic() >= ctx.deadline:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                code = (ErrorCode.EXECUTION_FAILED if ctx.cancel.cancelled
                        else ErrorCode.TIMEOUT)
                raise PolicyEngineError(code, "killed")
            time.sleep(0.02)
        assert proc.stdout is not None
        out = proc.stdout.read()
        return ExecResult(ok=True, out={"exit_code": proc.returncode,
                                        "stdout": out.decode(errors="replace")},
                          used=Usage(calls=1))

    def close(self) -> None:
        """Nothing pooled."""


class Plugin:
    def __init__(self, executor: SubprocessExecutor) -> None:
        self.executor = executor

    @hookimpl
    def policy_engine_executors(self, config: EngineConfig) -> list[SubprocessExecutor]:
        return [self.executor]


LIAR = SubprocessExecutor("liar-proc", ExecutorCapabilities(
    op_kinds=frozenset({OpKind.PROC_EXEC}), network_modes=frozenset(NetworkMode),
    bind_mounts=True, readonly_rootfs=True, resource_limits=True, env_filtering=True,
    mandatory_denies=True))
HONEST = SubprocessExecutor("weak-proc", ExecutorCapabilities(
    op_kinds=frozenset({OpKind.PROC_EXEC}), network_modes=frozenset({NetworkMode.ON})))


def statuses(name: str, executor: SubprocessExecutor, mode: str) -> dict[str, Any]:
    report = run_suite(name, extra_plugins=(Plugin(executor),),
                       mode=mode)  # type: ignore[arg-type]
    return {r.id: r for r in report.results}


def test_an_executor_lying_about_isolation_fails_the_claims_it_breaks(
        tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    # a home of the test's own, so the kit finds a ~/.ssh key to compare without the host's
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    (home / ".ssh" / "id_ed25519").write_text("-----BEGIN OPENSSH PRIVATE KEY----- planted\n")
    monkeypatch.setenv("HOME", str(home))
    results = statuses("liar-proc", LIAR, "strict")
    failed = {cid for cid, r in results.items() if r.status == "fail"}
    assert {"claims.network-off", "claims.writes-confined", "claims.no-setid-plant",
            "claims.not-host-root", "claims.no-orphans", "claims.ipc-isolated",
            "claims.mandatory-denies", "claims.env-filtering",
            "claims.resource-limits"} <= failed
    assert "canary" in results["claims.network-off"].message
    assert "outside the profile's writable paths" in results["claims.writes-confined"].message
    assert "host uid 0" in results["claims.not-host-root"].message
    # the lying executor handed the planted secrets back through run
    denies = results["claims.mandatory-denies"].message
    assert f"the tool read `{home / '.ssh' / 'id_ed25519'}`" in denies
    assert "/root/.env` (its SHA-256 came back through run)" in denies
    assert "/root/secrets/credentials.json`" in denies
    assert "reached the tool" in results["claims.env-filtering"].message
    limits = results["claims.resource-limits"].message
    assert "processes under a 16-pid limit" in limits
    assert "MiB under a 96 MiB memory limit" in limits
    # what it does honestly still passes: it runs, honours timeouts and cancellation
    for cid in ("capabilities.runs[proc.exec]", "timeout.honoured", "cancel.honoured",
                "evidence.complete", "refusal.registry-codes"):
        assert results[cid].status == "pass", results[cid].message


@pytest.mark.parametrize("mode", ["compat", "strict"])
def test_an_honest_weak_executor_is_told_what_it_may_run(mode: str) -> None:
    """A plain subprocess cannot enforce the mandatory denies (secrets, host control sockets),
    and those never degrade: both modes refuse its proc.exec. The kit says so once, with what
    compat mode would degrade and what to build, instead of three failures on one refusal."""
    results = statuses("weak-proc", HONEST, mode)
    failed = {cid: r.message for cid, r in results.items() if r.status == "fail"}
    assert list(failed) == ["claims.mandatory-denies"]
    advice = failed["claims.mandatory-denies"]
    assert "refuses every proc.exec routed to it, in strict and in compat mode" in advice
    assert "runs proc.exec without bind_mounts, readonly_rootfs, resource_limits, " \
           "env_filtering, network mode `off` degraded" in advice
    assert "declare mandatory_denies=True" in advice
    for cid in ("capabilities.runs[proc.exec]", "timeout.honoured", "cancel.honoured",
                "claims.env-filtering", "claims.resource-limits"):
        assert results[cid].status == "n/a"
        assert "see claims.mandatory-denies" in results[cid].message


def test_an_honest_weak_first_party_backend_passes_in_compat_mode() -> None:
    """proc-landlock has no mount namespace of its own (no bind mounts): strict mode refuses
    it, compat mode runs it degraded, records that, and every claim it makes holds."""
    report = run_suite("proc-landlock", mode="compat")
    statuses_ = {r.id: r for r in report.results}
    failing = {cid: r.message for cid, r in statuses_.items() if r.status == "fail"}
    assert failing == {}
    assert statuses_["compat.degraded-recorded"].status == "pass"
    assert statuses_["claims.ipc-isolated"].status == "pass"
    assert statuses_["claims.not-host-root"].status == "pass"


# ---- the evidence-sink kit -------------------------------------------------------------------


class ForgetfulSink:
    """Stores begin records verbatim (with the content they never carry) but drops every end
    of a failed call: the kit must see both faults in what it reads back.
    """

    name = "forgetful"

    def __init__(self) -> None:
        self.stored: list[dict[str, Any]] = []

    def begin(self, ev: Any) -> None:
        self.stored.append(ev.model_dump(mode="json"))

    def end(self, ev: Any) -> None:
        if ev.status == "ok" or ev.status == "denied":
            self.stored.append(ev.model_dump(mode="json"))

    def read_records(self) -> list[dict[str, Any]]:
        return list(self.stored)

    def stored_text(self) -> list[str]:
        return [str(r) for r in self.stored]

    def close(self) -> None:
        """Nothing to flush: the records live in memory (so `sink.durable` fails too)."""


class SinkPlugin:
    @hookimpl
    def policy_engine_evidence_sinks(self, config: EngineConfig) -> list[ForgetfulSink]:
        return [ForgetfulSink()] if config.wants_sink("forgetful") else []


def test_sink_kit_finds_lost_and_volatile_records() -> None:
    from policy_engine.conformance.sinks import run_sink_suite

    report = run_sink_suite("forgetful", extra_plugins=(SinkPlugin(),))
    results = {r.id: r for r in report.results}
    assert results["sink.readable"].status == "pass"
    assert results["sink.complete"].status == "fail"
    assert "one begin then one end required" in results["sink.complete"].message
    assert results["sink.durable"].status == "fail"


@pytest.mark.parametrize("sink", ["jsonl", "sqlite"])
def test_first_party_sinks_pass_the_sink_kit_through_pytest(sink: str, tmp_path: Any) -> None:
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           *WITHOUT_UNUSED, "--pe-sink", sink, "-k", "conformance",
                           "--rootdir", str(tmp_path)],
                          capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "4 passed" in proc.stdout


class RefusingExecutor(SubprocessExecutor):
    """Declares every claim and refuses every program with a registry code (issue 32 attack
    H1, in its simplest form): it never runs anything, so nothing it claims is shown."""

    def execute(self, ctx: ExecContext, op: Any) -> ExecResult:
        ctx.started()
        raise PolicyEngineError(ErrorCode.CAPABILITY_BLOCKED, "refused by the sandbox")


def test_an_executor_refusing_the_probes_fails_every_claim_it_makes() -> None:
    refuser = RefusingExecutor("refusing-proc", LIAR.capabilities)
    results = statuses("refusing-proc", refuser, "strict")
    for cid in ("claims.probes-run", "claims.network-off", "claims.writes-confined",
                "claims.no-setid-plant", "claims.not-host-root", "claims.no-orphans",
                "claims.ipc-isolated", "claims.mandatory-denies", "claims.env-filtering",
                "claims.resource-limits"):
        assert results[cid].status == "fail", (cid, results[cid])
        assert "did not run the" in results[cid].message
        assert "SANDBOX.CAPABILITY_BLOCKED" in results[cid].message
    assert "refusing a program that looks like an attack is not isolation" in \
        results["claims.probes-run"].message


# ---- the probe timeout -----------------------------------------------------------------------


class DeadlineRecorder(SubprocessExecutor):
    """The subprocess executor (declaring what the liar does, so the guard routes the probe to
    it), recording the timeout each call's profile was built with."""

    def __init__(self) -> None:
        super().__init__("deadline-proc", LIAR.capabilities)
        self.timeouts: list[int] = []

    def execute(self, ctx: ExecContext, op: Any) -> ExecResult:
        self.timeouts.append(ctx.profile.timeout_ms)
        return super().execute(ctx, op)


def test_the_probe_timeout_is_the_profile_timeout_of_probes_without_their_own(
        tmp_path: Any) -> None:
    """`--probe-timeout-ms` (``run_suite(probe_timeout_ms=...)``): a probe run without a
    timeout of its own gets it; the timeout and cancellation checks keep theirs; unset, the
    system default (60 s) applies as before."""
    from policy_engine.conformance.harness import Harness, workdir_paths
    from policy_engine.conformance.probes import ProbeEnv, default_probes
    from policy_engine.conformance.server import ProbeServer

    root, tmp = workdir_paths(tmp_path)
    with ProbeServer("s3cret") as server:
        env = ProbeEnv(workdir=tmp_path, root=root, tmp_dir=tmp, server=server, secret="s3cret")
        probe = next(p for p in default_probes(OpKind.PROC_EXEC, env) if p.role == "run")
        executor = DeadlineRecorder()
        for probe_timeout, explicit, want in ((2_500, None, 2_500), (2_500, 1_000, 1_000),
                                              (None, None, 60_000)):
            harness = Harness(executor.name, env, [probe], extra_plugins=(Plugin(executor),),
                              probe_timeout_ms=probe_timeout)
            try:
                run = harness.run(probe, "run", timeout_ms=explicit)
            finally:
                harness.close()
            assert run.calls, run.outcome.result
            assert executor.timeouts[-1] == want, (probe_timeout, explicit)
