"""Runs probes through the real Orchestrator with the executor under test observed and the
evidence recorded, so checks can compare what the executor did with what the contract says.

Nothing here is a fake: the policy is compiled from text, profiles come from the real builder,
decisions from the real guard, and the executor is the instance its plugin's hook returned,
wrapped only to timestamp its calls.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from policy_engine.compiler import compile_files
from policy_engine.config import EngineConfig
from policy_engine.conformance.probes import Probe, ProbeEnv, policy_text
from policy_engine.errors import DiagnosticsError
from policy_engine.executor import CancelToken, ExecContext, Executor
from policy_engine.hookspecs import hookimpl
from policy_engine.model import (
    EvidenceBegin,
    EvidenceEnd,
    ExecOp,
    ExecResult,
    Grant,
    Limits,
    Manifest,
    NetworkMode,
    OpKind,
    Settings,
)
from policy_engine.orchestrator import Orchestrator, RunOutcome
from policy_engine.plugin_manager import Components, LoadError, PluginManager

SINK_NAME = "conformance-recorder"
_NETWORK_CLIENTS = frozenset({OpKind.NET_HTTP, OpKind.BROWSER_NAV, OpKind.BROWSER_SCREENSHOT})


def probe_manifest(probe: Probe, timeout_ms: int | None = None) -> Manifest:
    """The manifest of the probing tool: the probe's capabilities, network on for the kinds
    whose executor is the network client (the guard's host rules govern those).
    """
    network = NetworkMode.ON if probe.kind in _NETWORK_CLIENTS else None
    limits = Limits.model_validate(probe.limits or {}) if not isinstance(probe.limits, Limits) \
        else probe.limits
    if timeout_ms is not None:
        limits = limits.model_copy(update={"timeout_ms": timeout_ms})
    return Manifest(name="conformance-probe", version="1.0", permissions=probe.caps(),
                    limits=limits, network=network)


class SetupError(Exception):
    """The suite cannot run: unknown executor, a probe that does not compile, a plugin that
    fails to load. Reported with exit code 2, never as a check failure.
    """

    def __init__(self, message: str, *, executors: tuple[str, ...] = (),
                 load_errors: tuple[LoadError, ...] = (), hint: str | None = None) -> None:
        super().__init__(message)
        self.executors = executors
        self.load_errors = load_errors
        self.hint = hint  # what to do instead of "install the plugin", when that is wrong


@dataclass(slots=True)
class Call:
    """One ``execute`` call the executor under test received."""

    op: ExecOp
    ctx: ExecContext
    started: float
    ended: float | None = None
    result: object = None
    exc: BaseException | None = None
    done: threading.Event = field(default_factory=threading.Event)

    def wait(self, timeout: float) -> bool:
        return self.done.wait(timeout)


class ObservedExecutor:
    """The executor under test, unchanged, with every ``execute`` call timestamped.

    Optional members (``local``, ``available``, ``enforces_deadline``, ``conformance_probes``)
    are forwarded, so the orchestrator treats it exactly like the wrapped executor.
    """

    def __init__(self, inner: Executor) -> None:
        self.inner = inner
        self.name = inner.name
        self.capabilities = inner.capabilities
        self.calls: list[Call] = []
        self.close_error: BaseException | None = None
        self._lock = threading.Lock()

    def __getattr__(self, item: str) -> Any:
        return getattr(self.inner, item)

    def execute(self, ctx: ExecContext, op: ExecOp) -> ExecResult:
        call = Call(op=op, ctx=ctx, started=time.monotonic())
        with self._lock:
            self.calls.append(call)
        try:
            result = self.inner.execute(ctx, op)
            call.result = result
            return result
        except BaseException as exc:
            call.exc = exc
            raise
        finally:
            call.ended = time.monotonic()
            call.done.set()

    def close(self) -> None:
        try:
            self.inner.close()
        except Exception as exc:  # recorded for the lifecycle check, then re-raised
            self.close_error = exc
            raise


class RecordingSink:
    """An evidence sink keeping each record as the JSON a durable sink would write."""

    name = SINK_NAME

    def __init__(self) -> None:
        self.records: list[tuple[str, str, str]] = []  # (type, envelope_id, json)
        self._lock = threading.Lock()

    def begin(self, ev: EvidenceBegin) -> None:
        with self._lock:
            self.records.append(("begin", ev.envelope_id, ev.model_dump_json()))

    def end(self, ev: EvidenceEnd) -> None:
        with self._lock:
            self.records.append(("end", ev.envelope_id, ev.model_dump_json()))

    def of(self, envelope: str) -> list[tuple[str, str]]:
        with self._lock:
            return [(t, j) for t, e, j in self.records if e == envelope]

    def close(self) -> None:
        """Records stay in memory for the checks."""


class _RecorderPlugin:
    def __init__(self, sink: RecordingSink) -> None:
        self.sink = sink

    @hookimpl
    def policy_engine_evidence_sinks(self, config: EngineConfig) -> list[RecordingSink]:
        return [self.sink] if config.wants_sink(SINK_NAME) else []


class _ObservedPlugins(PluginManager):
    """Every installed plugin, loaded as usual; the target executor comes back observed."""

    def __init__(self, target: str) -> None:
        super().__init__()
        self.target = target
        self.observed: ObservedExecutor | None = None
        self.executor_names: tuple[str, ...] = ()

    def components(self, config: EngineConfig) -> Components:
        comps = super().components(config)
        self.executor_names = tuple(sorted(comps.executors))
        inner = comps.executors.get(self.target)
        if inner is not None:
            self.observed = ObservedExecutor(inner)
            comps.executors[self.target] = self.observed
        return comps


@dataclass(slots=True)
class Run:
    """One probe run through the orchestrator."""

    probe: Probe
    purpose: str
    outcome: RunOutcome
    elapsed_s: float
    calls: list[Call]
    records: list[tuple[str, str]]
    timeout_ms: int | None = None
    cancelled_at: float | None = None
    routed: bool = True  # whether the op was expected to reach the executor


class Harness:
    """One orchestrator over every installed plugin, routing every op kind to ``target``."""

    def __init__(self, target: str, env: ProbeEnv, probes: list[Probe], *,
                 options: Mapping[str, Mapping[str, Any]] | None = None,
                 mode: Literal["strict", "compat"] = "strict",
                 extra_plugins: Sequence[object] = (),
                 probe_timeout_ms: int | None = None) -> None:
        self.target = target
        # the profile timeout of a probe run with none of its own (None: the system default);
        # a probe the executor hangs on is reported once it passes
        self.probe_timeout_ms = probe_timeout_ms
        self.env = env
        self.sink = RecordingSink()
        policy = env.workdir / "conformance.sbpolicy"
        policy.write_text(policy_text(probes), encoding="utf-8")
        try:
            self.policyset = compile_files([policy])
        except DiagnosticsError as exc:
            raise SetupError(f"the probes' permissions do not compile: {exc}") from None
        self.config = EngineConfig(
            state_dir=env.workdir / "state", backends=dict.fromkeys(OpKind, target),
            evidence_sinks=(SINK_NAME,), budget_meter="memory", revocation="memory",
            options=dict(options or {}), mode=mode)
        self.plugins = _ObservedPlugins(target)
        self.plugins.load_entrypoints()
        for i, plugin in enumerate(extra_plugins):
            self.plugins.register(plugin, f"policy_engine_conformance_extra_{i}")
        self.plugins.register(_RecorderPlugin(self.sink), "policy_engine_conformance")
        try:
            self.orch = Orchestrator(self.policyset, config=self.config, plugins=self.plugins)
        except ValueError as exc:
            raise SetupError(f"cannot start the orchestrator: {exc}",
                             load_errors=tuple(self.plugins.load_errors)) from None
        if self.plugins.observed is None:
            self.orch.close()
            errors = tuple(self.plugins.load_errors)
            raise SetupError(f"no installed plugin provides an executor named `{target}`",
                             executors=self.plugins.executor_names, load_errors=errors)
        self.executor: ObservedExecutor = self.plugins.observed
        self.runs: list[Run] = []
        self._seq = 0
        self.closed = False

    def close(self) -> BaseException | None:
        """Close the orchestrator (and so the executor); the executor's close error, if any."""
        if not self.closed:
            self.closed = True
            self.orch.close()  # Components.close logs and swallows a raising close
        return self.executor.close_error

    def grant(self, probe: Probe, *, with_capabilities: bool = True) -> Grant:
        self._seq += 1
        return Grant(tenant="conformance", subject_id="agent:conformance",
                     tool_name="conformance-probe", call_id=f"conformance-{self._seq}",
                     capabilities=probe.caps() if with_capabilities else (),
                     expires_at=int(time.time() * 1000) + 3_600_000)

    def manifest(self, probe: Probe, timeout_ms: int | None) -> Manifest:
        return probe_manifest(probe, timeout_ms)

    def run(self, probe: Probe, purpose: str, *, timeout_ms: int | None = None,
            cancel_after_s: float | None = None, with_capabilities: bool = True,
            routed: bool = True) -> Run:
        """Run ``probe`` once and keep the run for the evidence checks."""
        op = probe.exec_op()
        settings = Settings(root_fs=str(self.env.root), tmp_dir=str(self.env.tmp_dir))
        token: CancelToken | None = None
        timer: threading.Timer | None = None
        fired: list[float] = []
        if cancel_after_s is not None:
            token = CancelToken()

            def fire(tok: CancelToken = token) -> None:
                fired.append(time.monotonic())
                tok.cancel("conformance kit cancelled the call")

            timer = threading.Timer(cancel_after_s, fire)
            timer.daemon = True
        before = len(self.executor.calls)
        started = time.monotonic()
        if timer is not None:
            timer.start()
        outcome = self.orch.run(self.grant(probe, with_capabilities=with_capabilities),
                                self.manifest(probe, self.probe_timeout_ms if timeout_ms is None
                                              else timeout_ms), op, settings=settings,
                                context={"conformance_token": self.env.secret}, cancel=token)
        elapsed = time.monotonic() - started
        if timer is not None:
            timer.cancel()
        run = Run(probe=probe, purpose=purpose, outcome=outcome, elapsed_s=elapsed,
                  calls=self.executor.calls[before:], records=self.sink.of(outcome.envelope_id),
                  timeout_ms=timeout_ms, cancelled_at=fired[0] if fired else None,
                  routed=routed)
        self.runs.append(run)
        return run

    def iter_runs(self) -> Iterator[Run]:
        yield from self.runs


def call_directly(executor: Executor, ctx: ExecContext, op: ExecOp,
                  wait_s: float) -> tuple[str, object]:
    """Call ``executor.execute`` outside the orchestrator, in a daemon thread bounded by
    ``wait_s``: ``("returned", result)``, ``("raised", exc)`` or ``("hung", None)``.
    """
    box: dict[str, object] = {}

    def work() -> None:
        try:
            box["returned"] = executor.execute(ctx, op)
        except BaseException as exc:  # reported, whatever it is
            box["raised"] = exc

    thread = threading.Thread(target=work, name="policy-engine-conformance-direct", daemon=True)
    thread.start()
    thread.join(wait_s)
    if thread.is_alive():
        ctx.cancel.cancel("conformance kit gave up waiting")
        return "hung", None
    key = next(iter(box))
    return key, box[key]


def workdir_paths(workdir: Path) -> tuple[Path, Path]:
    """The probe root (``root_fs``) and ``tmp_dir`` under a fresh work directory."""
    root, tmp = workdir / "root", workdir / "tmp"
    root.mkdir(parents=True, exist_ok=True)
    tmp.mkdir(parents=True, exist_ok=True)
    return root, tmp
