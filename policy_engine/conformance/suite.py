"""Runs the whole executor suite for one installed executor and returns its Report."""

from __future__ import annotations

import contextlib
import secrets
import shutil
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

from policy_engine.config import EngineConfig
from policy_engine.conformance import checks
from policy_engine.conformance.claims import (
    Canary,
    ClaimEnv,
    claim_probes,
    claim_results,
    started_mark,
)
from policy_engine.conformance.claims_proc import (
    Plants,
    plant,
    planted_variable,
    proc_claim_probes,
    proc_claim_results,
    refused_results,
)
from policy_engine.conformance.harness import (
    Harness,
    Run,
    SetupError,
    call_directly,
    workdir_paths,
)
from policy_engine.conformance.probes import Probe, ProbeEnv, default_probes, plugin_probes
from policy_engine.conformance.report import CheckResult, Report
from policy_engine.conformance.server import ProbeServer
from policy_engine.executor import ExecContext, ExecutorCapabilities
from policy_engine.model import OpKind
from policy_engine.plugin_manager import PluginManager

TIMEOUT_MS = 1000
"""The profile timeout the `timeout.honoured` check runs a slow probe under."""
CANCEL_AFTER_S = 0.3
"""When the `cancel.honoured` check cancels a slow probe."""
LIMITS_TIMEOUT_MS = 1000
"""The ``ctx.limits`` timeout the `limits.timeout` check hands the executor directly."""
GRACE_S = 1.0
"""How long an executor has to stop after its token fires (the orchestrator's grace)."""


def _inspect(name: str, env: ProbeEnv, options: Mapping[str, Mapping[str, Any]],
             extra_plugins: Sequence[object] = ()
             ) -> tuple[list[CheckResult], frozenset[OpKind], list[Probe] | None,
                        ExecutorCapabilities | None]:
    """Build the executor once through its plugin for the metadata checks and its probes."""
    manager = PluginManager.default()
    for i, plugin in enumerate(extra_plugins):
        manager.register(plugin, f"policy_engine_conformance_extra_{i}")
    config = EngineConfig(state_dir=env.workdir / "inspect", options=dict(options))
    manager.configure(config)
    comps = manager.components(config)
    try:
        executor = comps.executors.get(name)
        if executor is None:
            raise SetupError(f"no installed plugin provides an executor named `{name}`",
                             executors=tuple(sorted(comps.executors)),
                             load_errors=tuple(manager.load_errors))
        results = [checks.check_name(executor, name), checks.check_capabilities(executor)]
        try:
            probe = getattr(executor, "available", None)
            state = probe() if callable(probe) else True
        except Exception:  # check_capabilities reports it; the runs show what follows
            state = True
        if state is not True and isinstance(state, str | bool):
            # every runtime check would fail on the same refusal: say it once, check nothing
            raise SetupError(
                f"executor `{name}` is installed but unavailable on this host: "
                f"{state or 'it reports itself unavailable'}",
                hint="run the kit where the backend can run (its available() returns True); "
                     "calls here are refused with PROVIDER.UNAVAILABLE and this reason")
        caps = getattr(executor, "capabilities", None)
        kinds = frozenset(k for k in getattr(caps, "op_kinds", ()) if isinstance(k, OpKind))
        try:
            provided = plugin_probes(executor, env)
        except Exception as exc:  # the author's hook: report it, never a traceback
            raise SetupError(f"`{name}`.conformance_probes failed: "
                             f"{type(exc).__name__}: {exc}") from None
        return results, kinds, provided, caps if isinstance(caps, ExecutorCapabilities) else None
    finally:
        comps.close()


def _probes_by_kind(provided: list[Probe] | None, env: ProbeEnv) -> dict[OpKind, list[Probe]]:
    """The kit's default probes of every kind, then the executor's own probes added to them."""
    by_kind: dict[OpKind, list[Probe]] = {kind: default_probes(kind, env) for kind in OpKind}
    for probe in provided or ():
        by_kind[probe.kind].append(probe)
    return {k: v for k, v in by_kind.items() if v}


def run_suite(name: str, *, options: Mapping[str, Mapping[str, Any]] | None = None,
              timeout_ms: int = TIMEOUT_MS, workdir: Path | None = None,
              mode: Literal["strict", "compat"] = "strict",
              extra_plugins: Sequence[object] = (),
              probe_timeout_ms: int | None = None) -> Report:
    """Run every check against the installed executor ``name``.

    :param options: plugin options (``EngineConfig.options``), e.g. ``{"tmp": {...}}``.
    :param mode: ``compat`` runs a backend that lacks what a probe's profile needs degraded
        (and checks the evidence says so) instead of refusing it: for honest weak backends.
    :param extra_plugins: plugin objects registered besides the installed entry points (an
        embedding host's own executors).
    :param probe_timeout_ms: the profile timeout of every probe that is meant to finish (all
        but the timeout and cancellation checks' slow ones); ``None``: the system default
        (60 s). A probe the executor hangs on fails `claims.probes-run` or its check either
        way; a shorter one reports it sooner.
    :raises SetupError: the executor is not installed or the suite cannot start.
    """
    base = Path(tempfile.mkdtemp(prefix="policy-engine-conformance-", dir=workdir))
    secret = "pe-conformance-secret-" + secrets.token_hex(12)
    try:
        with ProbeServer(secret) as server:
            root, tmp = workdir_paths(base)
            env = ProbeEnv(workdir=base, root=root, tmp_dir=tmp, server=server, secret=secret)
            return _run(name, env, dict(options or {}), timeout_ms, mode, extra_plugins,
                        probe_timeout_ms)
    finally:
        shutil.rmtree(base, ignore_errors=True)


def _run(name: str, env: ProbeEnv, options: dict[str, Mapping[str, Any]],
         timeout_ms: int, mode: Literal["strict", "compat"],
         extra_plugins: Sequence[object], probe_timeout_ms: int | None = None) -> Report:
    results, declared, provided, caps = _inspect(name, env, options, extra_plugins)
    by_kind = _probes_by_kind(provided, env)
    all_probes = [p for probes in by_kind.values() for p in probes]
    claim_env = (ClaimEnv(env, secrets.token_hex(8), Canary())
                 if OpKind.PROC_EXEC in declared else None)
    attacks = claim_probes(claim_env) if claim_env is not None else {}
    plants = plant(claim_env) if claim_env is not None else Plants()
    if claim_env is not None:
        attacks.update(proc_claim_probes(claim_env, plants))
    harness = Harness(name, env, all_probes + list(attacks.values()), options=options,
                      mode=mode, extra_plugins=extra_plugins,
                      probe_timeout_ms=probe_timeout_ms)
    try:
        report = Report(executor=name, capabilities=caps.to_json() if caps else {},
                        results=results)
        # the attacks run first so the evidence checks of _exercise cover their records too
        claimed = _claims(harness, caps, claim_env, attacks, plants, timeout_ms)
        report.results.extend(_exercise(harness, declared, by_kind, timeout_ms))
        report.results.extend(claimed)
        report.results.append(checks.check_degraded(harness.runs, caps, mode))
        if caps is not None and OpKind.PROC_EXEC in declared and not caps.mandatory_denies:
            report.results = refused_results(caps, report.results)
    finally:
        closed = checks.check_close(harness)
        if claim_env is not None:
            claim_env.canary.close()
    report.results.append(closed)
    report.runs = len(harness.runs)
    return report


def _exercise(harness: Harness, declared: frozenset[OpKind],
              by_kind: dict[OpKind, list[Probe]], timeout_ms: int) -> list[CheckResult]:
    out: list[CheckResult] = []
    first: dict[OpKind, Probe] = {}
    for kind in sorted(declared, key=lambda k: k.value):
        runs: list[Run] = []
        for probe in by_kind.get(kind, []):
            if probe.role == "run":
                first.setdefault(kind, probe)
                runs.append(harness.run(probe, "run"))
        out.append(checks.check_runs(kind, runs, harness.target, covered=bool(runs)))
    for probes in by_kind.values():
        for probe in probes:
            if probe.role == "refuse" and probe.kind in declared:
                harness.run(probe, "refuse")
    undeclared = [harness.run(next(p for p in by_kind[k] if p.role == "run"), "undeclared",
                              routed=False)
                  for k in sorted(by_kind, key=lambda k: k.value)
                  if k not in declared and any(p.role == "run" for p in by_kind[k])]
    out.append(checks.check_undeclared(undeclared, declared))
    out.append(_wrong_kind(harness, undeclared))
    denials = [harness.run(p, "denial", with_capabilities=False, routed=False)
               for p in first.values()]
    out.append(checks.check_denials(denials))
    slow = next((p for k in sorted(declared, key=lambda k: k.value)
                 for p in by_kind.get(k, []) if p.role == "slow"), None)
    timed = harness.run(slow, "timeout", timeout_ms=timeout_ms) if slow else None
    cancelled = (harness.run(slow, "cancel", timeout_ms=60_000, cancel_after_s=CANCEL_AFTER_S)
                 if slow else None)
    out.append(checks.check_registry_codes(harness.runs))
    out.append(checks.check_evidence(harness.runs, harness.target))
    out.append(checks.check_secrets(harness.runs, harness.env.secret))
    out.append(checks.check_timeout(timed, GRACE_S))
    out.append(checks.check_cancel(cancelled, GRACE_S, CANCEL_AFTER_S))
    out.append(_limits_timeout(harness, timed))
    return out


def _limits_timeout(harness: Harness, timed: Run | None) -> CheckResult:
    """Call the executor directly on the slow probe with ``ctx.limits.timeout_ms`` 1 s under a
    profile saying 60 s: what a permit rule's `limits { timeout 1s }` hands it."""
    profile = timed.outcome.profile if timed is not None else None
    if timed is None or profile is None:
        return checks.check_limits_timeout(None, 0.0, 0.0, GRACE_S, "")
    slack = profile.limits.model_copy(update={"timeout_ms": 60_000})
    profile = profile.model_copy(update={"limits": slack, "timeout_ms": 60_000})
    timeout_s = LIMITS_TIMEOUT_MS / 1000
    ctx = ExecContext(profile=profile, deadline=time.monotonic() + timeout_s,
                      limits=slack.model_copy(update={"timeout_ms": LIMITS_TIMEOUT_MS}))
    started = time.monotonic()
    outcome = call_directly(harness.executor.inner, ctx, timed.probe.exec_op(),
                            timeout_s + GRACE_S + 2.0)
    return checks.check_limits_timeout(outcome, time.monotonic() - started, timeout_s, GRACE_S,
                                       timed.probe.label())


def _wrong_kind(harness: Harness, undeclared: list[Run]) -> CheckResult:
    """Hand the executor an op of a kind it does not declare, bypassing the orchestrator."""
    profile = next((r.outcome.profile for r in harness.runs if r.outcome.profile is not None),
                   None)
    if not undeclared or profile is None:
        return checks.check_wrong_kind(None, None)
    op = undeclared[0].probe.exec_op()
    ctx = ExecContext(profile=profile, deadline=time.monotonic() + 5.0)
    outcome = call_directly(harness.executor.inner, ctx, op, 5.0)
    return checks.check_wrong_kind(outcome, OpKind(op.kind))


def _claims(harness: Harness, caps: ExecutorCapabilities | None, claim_env: ClaimEnv | None,
            attacks: dict[str, Probe], plants: Plants, timeout_ms: int) -> list[CheckResult]:
    """Attack what a proc.exec executor declares (claims.* checks); n/a for other executors."""
    if claim_env is None or caps is None:
        return [checks.result(cid, (), na="the executor does not serve proc.exec")
                for cid, _t in checks.CATALOG if cid.startswith("claims.")]
    runs: dict[str, Run] = {}
    for key, probe in attacks.items():
        with planted_variable(plants) if key == "secrets" else contextlib.nullcontext():
            runs[key] = harness.run(probe, f"claims:{key}",
                                    timeout_ms=timeout_ms if probe.role == "slow" else None)
    try:
        return (claim_results(claim_env, caps, runs)
                + proc_claim_results(claim_env, caps, plants, runs, runs.get("orphans"),
                                     GRACE_S))
    finally:
        for key in attacks:
            with contextlib.suppress(OSError):
                started_mark(claim_env, key).unlink()
