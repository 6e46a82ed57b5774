"""The orchestrator: seed 000 §5 — revoked? → profile → guard → begin → budget → execute → end."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from policy_engine import tracing
from policy_engine.budget import BudgetMeter, grant_key, limit_of
from policy_engine.config import EngineConfig
from policy_engine.errors import ErrorCode, PolicyEngineError
from policy_engine.evidence import (
    EMPTY_DIGEST,
    SpoolingSink,
    allowing_template,
    capability_string,
    decision_fields,
    digest_json,
    inputs_digest,
    load_or_create_key,
    redact_audit,
    request_summary,
)
from policy_engine.executor import CancelToken, ExecContext, Executor
from policy_engine.graph.policyset import PolicySet
from policy_engine.guard import Guard
from policy_engine.ids import envelope_id
from policy_engine.model import (
    ArgSlot,
    Decision,
    EvidenceBegin,
    EvidenceEnd,
    ExecOp,
    ExecResult,
    Grant,
    Limits,
    Manifest,
    OpKind,
    Overrides,
    ProcExecOp,
    Profile,
    Settings,
    SideEffectRec,
    Usage,
)
from policy_engine.observe import Metrics, domain_of
from policy_engine.orchestration.budgeting import (
    Slot,
    call_limits,
    charged_late,
    charges_with_slots,
    nothing,
)
from policy_engine.orchestration.records import (
    begin_record,
    end_record,
    failed_result,
    ok_result,
    usage_of,
)
from policy_engine.orchestration.revocation import (
    MemoryRevocationList,
    RevocationWatcher,
    SqliteRevocationList,
)
from policy_engine.orchestration.running import (
    Attempt,
    classify,
    run_with_deadline,
    stops_by_itself,
)
from policy_engine.orchestration.selection import (
    Selection,
    chosen_backend,
    refusal_decision,
    select,
    unknown_backends,
)
from policy_engine.plugin_manager import PluginManager
from policy_engine.profile import ProfileBuilder, ProfileCache
from policy_engine.recording.record import ReplayRecorder
from policy_engine.recording.shadow import ShadowPolicy

log = logging.getLogger(__name__)

Status = Literal["ok", "denied", "error"]
_METERED = ("bytes_in", "bytes_out", "cpu_ms", "gpu_ms", "file_count")
_ZEROES = dict.fromkeys(_METERED, 0)
# result.out keys an executor may report that the exec-record table (seed 002 §6) wants
_PROCESS_FIELDS = ("exit_code", "stdout_truncated", "stderr_truncated", "artifacts_path")


class ProfileBuilderLike(Protocol):
    def build(self, grant: Grant, manifest: Manifest, *, settings: Settings | None = None,
              overrides: Overrides | None = None) -> Profile: ...


class ConsentHook(Protocol):
    """Asked when the decision is a deny: ``None`` when consent is not what it lacks; else the
    grant (carrying the approver's consent on a yes) and the begin record's annotations."""

    def __call__(self, grant: Grant, op: ExecOp, decision: Decision
                 ) -> tuple[Grant, Mapping[str, Any] | None] | None: ...


class GuardLike(Protocol):
    def decide(self, profile: Profile, op: Any, *, context: Mapping[str, object] | None = None,
               now_ms: int | None = None, trace: bool = False) -> Decision: ...


@dataclass(frozen=True, slots=True)
class RunOutcome:
    """The result of one call: the public result, the decision, and the evidence written."""

    result: ExecResult
    decision: Decision
    begin: EvidenceBegin
    end: EvidenceEnd
    profile: Profile | None = None

    @property
    def envelope_id(self) -> str:
        return self.begin.envelope_id

    @property
    def evidence_ids(self) -> tuple[str, ...]:
        """Begin and end share the envelope id; sinks key both records by it."""
        return (self.begin.envelope_id,)

    def head_json(self) -> dict[str, Any]:
        """``to_json`` without its ``evidence``: the end record as its sinks wrote it is
        ``end.json_bytes()``."""
        return {"result": self.result.model_dump(mode="json"),
                "decision": self.decision.model_dump(mode="json", exclude_none=True),
                "envelope_id": self.envelope_id}

    def to_json(self) -> dict[str, Any]:
        return {**self.head_json(), "evidence": self.end.model_dump(mode="json")}


def _builder(policyset: PolicySet, config: EngineConfig) -> ProfileBuilder:
    size = config.profile_cache_size
    return ProfileBuilder(policyset, cache=ProfileCache(size=size, shape_size=max(16, size // 4)))


def _guard(policyset: PolicySet, config: EngineConfig) -> Guard:
    # the engine's own state directory is refused to every op (guard/engine_state.py)
    return Guard(policyset, cache_size=config.profile_cache_size, state_dir=config.state_dir)


def _wall_ms() -> int:
    return int(time.time() * 1000)


class PolicyHolder:
    """The running policy and the profile builder and guard that decide with it, replaced as
    one (hot reload): every orchestrator holding it decides each new call with the same three."""

    __slots__ = ("active",)

    def __init__(self, policyset: PolicySet, builder: ProfileBuilderLike,
                 guard: GuardLike) -> None:
        self.active: tuple[PolicySet, ProfileBuilderLike, GuardLike] = (policyset, builder,
                                                                        guard)


class Orchestrator:
    """Runs tool calls end to end and leaves begin/end evidence for every one, allowed or not.

    :param plugins: defaults to every plugin of the entry-point group.
    :param clock: wall clock in ms since the epoch (injected for deterministic tests).
    :param profile_builder, guard: default to ``ProfileBuilder``/``Guard`` over ``policyset``.
    :param revocations: defaults to the list ``config.revocation`` names.
    :raises ValueError: a configured evidence sink or budget meter is provided by no plugin, or
        its plugin failed to build it (e.g. the evidence log cannot be opened: the message names
        the path and the cause) — running without the evidence or budget the operator asked
        for is never silent. A budget or revocation store that is merely broken does not
        raise here: it denies each call with ``PROVIDER.UNAVAILABLE`` (docs/operations.md).
    """

    def __init__(self, policyset: PolicySet, *, config: EngineConfig,
                 plugins: PluginManager | None = None, clock: Callable[[], int] | None = None,
                 profile_builder: ProfileBuilderLike | None = None,
                 guard: GuardLike | None = None, revocations: RevocationWatcher | None = None,
                 metrics: Metrics | None = None, ids: Callable[[], str] | None = None,
                 shadow: PolicySet | None = None, holder: PolicyHolder | None = None) -> None:
        self.config = config
        self.plugins = plugins if plugins is not None else PluginManager.default()
        self.metrics = metrics or Metrics()
        self._clock = clock or _wall_ms
        self._ids = ids or envelope_id
        # the running policy with its builder and guard: shared with the orchestrators pinned
        # to a backend (runcode.OrchestratorPool), so one swap reloads them all
        self.holder = holder or PolicyHolder(
            policyset, profile_builder or _builder(policyset, config),
            guard or _guard(policyset, config))
        # keys the per-argument and URL digests of the evidence (evidence/redact.py says why);
        # loaded before any plugin opens something that would need closing on failure
        self.evidence_key = load_or_create_key(config.state_dir)
        self.replay = ReplayRecorder(config.plugin_options("replay"), config.state_dir)
        # an audit-only policy deciding beside the enforcing one (replay/shadow.py)
        self.shadow = ShadowPolicy(shadow, self.metrics) if shadow is not None else None
        self.plugins.configure(config)
        self.components = self.plugins.components(config)
        causes = [f"plugin `{e.plugin}` failed to {e.stage}: {e.message}"
                  for e in dict.fromkeys(self.plugins.load_errors)]
        bad_backend = unknown_backends(config, list(self.components.executors), causes)
        if bad_backend is not None:
            self.components.close()
            raise ValueError(bad_backend)
        missing = [s for s in config.evidence_sinks if s not in self.components.sinks]
        if missing or self.components.meter is None:
            self.components.close()
            what, stage = ((f"evidence sink `{missing[0]}`", "evidence_sinks") if missing
                           else (f"budget meter `{config.budget_meter}`", "budget_meter"))
            raise ValueError(self.components.unavailable(what, stage))
        self.meter: BudgetMeter = self.components.meter
        spool = config.state_dir / "spool"
        self.sinks = [SpoolingSink(self.components.sinks[n], spool,
                                   on_failure=self._count_sink_failure)
                      for n in config.evidence_sinks]
        if revocations is None and config.revocation == "sqlite":
            revocations = SqliteRevocationList(config.state_dir / "revocations.sqlite")
        elif revocations is None and config.revocation in ("memory", "none"):
            revocations = MemoryRevocationList()
        elif revocations is None:  # a plugin's (redis): shared by every replica
            try:
                revocations = self.plugins.revocation_list(config)
            except ValueError:
                self.components.close()
                raise
        self.revocations = revocations if config.revocation != "none" else None
        self._contained: dict[OpKind, Executor | None] = {}  # ``runs_on_caller``'s kept part

    def swap_policy(self, policyset: PolicySet) -> None:
        """Make ``policyset`` the policy of every call that starts from now on (hot reload,
        policy_engine/rollout/reload.py); calls already running finish under the old one.
        """
        # one assignment: a call sees the old three or the new, on every orchestrator sharing
        # the holder
        self.holder.active = (policyset, _builder(policyset, self.config),
                              _guard(policyset, self.config))

    @property
    def policyset(self) -> PolicySet:
        """The running policy (``holder``)."""
        return self.holder.active[0]

    @property
    def builder(self) -> ProfileBuilderLike:
        return self.holder.active[1]

    @property
    def guard(self) -> GuardLike:
        return self.holder.active[2]

    def _count_sink_failure(self, sink: str) -> None:
        self.metrics.sink_failures_total.labels(sink=sink).inc()

    def close(self) -> None:
        """Flush spools, close sinks, meter, executors and the revocation list."""
        for sink in self.sinks:
            sink.close()  # closes the wrapped sink too
        self.components.sinks.clear()
        self.components.close()
        closer = getattr(self.revocations, "close", None)
        if callable(closer):
            closer()

    def __enter__(self) -> Orchestrator:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def runs_on_caller(self, kind: OpKind, root_fs: str) -> bool:
        """Whether a ``kind`` call beneath ``root_fs`` runs start to end in the calling thread
        on this machine's memory and local files alone: its backend runs it wholly inside the
        engine (``contained_kinds``) and stops by its deadline by itself
        (``running.stops_by_itself``), the meter and the revocation list are local (SQLite,
        memory: no network round trip), and every evidence sink appends without waiting for
        the disk (the JSONL log without ``fsync: always`` says so, ``waits_for_disk``; a sink
        that does not say is taken to wait: SQLite's commits fsync).
        The service runs such a call on its event loop, as it decides
        (``service/fastpath.py``)."""
        try:
            chosen = self._contained[kind]
        except KeyError:  # the configuration's part, fixed for the orchestrator's life
            chosen = self._contained[kind] = self._contained_backend(kind)
        return chosen is not None and stops_by_itself(chosen, kind, root_fs)

    def _contained_backend(self, kind: OpKind) -> Executor | None:
        """The backend that runs ``kind`` wholly inside the engine when the meter, the
        revocation list and every sink are local and wait for no disk, else ``None``."""
        config = self.config
        if config.budget_meter not in ("sqlite", "memory") or \
                config.revocation not in ("sqlite", "memory", "none") or \
                any(getattr(sink.inner, "waits_for_disk", True) is not False
                    for sink in self.sinks):
            return None
        chosen = chosen_backend(self.components.executors, config, kind)
        return chosen if chosen is not None and \
            kind in getattr(chosen, "contained_kinds", ()) else None

    # -- the sequence ---------------------------------------------------------------------------

    def run(self, grant: Grant, manifest: Manifest, op: ExecOp, *,
            settings: Settings | None = None, overrides: Overrides | None = None,
            context: Mapping[str, object] | None = None, cancel: CancelToken | None = None,
            now_ms: int | None = None,
            annotations: Mapping[str, Any] | None = None,
            consent: ConsentHook | None = None,
            on_output: Callable[[str, bytes], None] | None = None,
            via: Callable[[Executor], Executor] | None = None,
            on_caller: str | None = None) -> RunOutcome:
        """Run ``op`` for ``grant`` under ``manifest``; never raises for a refusal or failure:
        those come back as ``RunOutcome.result.ok == False`` with a registry code.

        :param annotations: recorded in the begin record as they are (the consent asked for
            the call, run_code's risk hint); they must hold no secrets and decide nothing.
        :param consent: asks an approver about this call's own decision when it is a deny
            (the gateway's consent step, policy_engine/gateway/): the call is decided once and
            the approver sees that decision; after a yes the same profile, now carrying the
            consent, is decided again at the time of the answer.
        :param on_output: handed each chunk of a process's stdout/stderr while it runs (a
            session's streamed exec); the final result is the same with or without it.
        :param via: given the selected executor, the one that runs the decided op in its place
            (a stateful session's live interpreter inside that executor's sandbox); the
            decision, selection, budget and evidence are the call's as ever.
        :param on_caller: the ``root_fs`` for which the caller asked :meth:`runs_on_caller`
            of this op's kind just before, in this thread, and was told yes: when the run
            selects that same backend for that root, it runs the op in this thread without
            asking the mount table a second time (``run_with_deadline``'s ``inline``).
        """
        with tracing.span("policy_engine.run", {"policy_engine.op": str(op.kind),
                                                "policy_engine.tenant": grant.tenant}) as sp:
            outcome = self._run(grant, manifest, op, settings=settings, overrides=overrides,
                                context=context, cancel=cancel, now_ms=now_ms,
                                annotations=annotations, consent=consent,
                                on_output=on_output, via=via, on_caller=on_caller)
            if sp.is_recording():
                sp.set_attributes({**tracing.decision_attributes(outcome.decision),
                                   "policy_engine.status": outcome.end.status,
                                   "policy_engine.backend": outcome.end.sandbox_backend or "",
                                   "policy_engine.code": outcome.result.code or ""})
            return outcome

    def _run(self, grant: Grant, manifest: Manifest, op: ExecOp, *,
             settings: Settings | None, overrides: Overrides | None,
             context: Mapping[str, object] | None, cancel: CancelToken | None,
             now_ms: int | None, annotations: Mapping[str, Any] | None,
             consent: ConsentHook | None,
             on_output: Callable[[str, bytes], None] | None,
             via: Callable[[Executor], Executor] | None = None,
             on_caller: str | None = None) -> RunOutcome:
        started = time.perf_counter()
        now = now_ms if now_ms is not None else self._clock()
        envelope = self._ids()
        kind = OpKind(op.kind)
        # one read of the policy this call runs under, start to end: a reload (swap_policy)
        # between two steps must never mix two policies in one call
        _, builder, guard = self.holder.active

        def replay(profile: Profile | None) -> dict[str, Any] | None:
            return self.replay.block(envelope, op, grant, manifest, profile, settings=settings,
                                     overrides=overrides, context=context, now_ms=now)

        notes = dict(annotations) if annotations else None
        # 1) revocation and expiry: checked before anything is derived from the grant
        refusal = self._grant_refusal(grant, now)
        if refusal is not None:
            return self._refused(envelope, grant, None, op, now, started, refusal, replay(None),
                                 notes)
        # 2) profile
        t0 = time.perf_counter()
        try:
            profile = builder.build(grant, manifest, settings=settings, overrides=overrides)
        except PolicyEngineError as exc:
            return self._refused(envelope, grant, None, op, now, started, exc, replay(None),
                                 notes)
        self.metrics.profile_build_ms.observe((time.perf_counter() - t0) * 1000)
        # 3) guard
        t0 = time.perf_counter()
        with tracing.span("policy_engine.decide") as sp:
            decision = guard.decide(profile, op, context=context, now_ms=now)
            if sp.is_recording():  # the attributes are built only for a recorded span
                sp.set_attributes(tracing.decision_attributes(decision, profile))
        self.metrics.guard_validate_ms.observe((time.perf_counter() - t0) * 1000)
        answered = consent(grant, op, decision) if consent is not None and \
            not decision.allowed else None
        if answered is not None:  # 3b) consent was what the decision lacked: it was asked
            grant, asked_notes = answered
            notes = {**(notes or {}), **(asked_notes or {})}
            if grant.consent is not None:  # a yes, valid from the time of the answer
                now = self._clock()
                try:
                    profile = builder.build(grant, manifest, settings=settings,
                                            overrides=overrides)
                except PolicyEngineError as exc:
                    return self._refused(envelope, grant, None, op, now, started, exc,
                                         replay(None), notes)
                decision = guard.decide(profile, op, context=context, now_ms=now)
        self.plugins.notify_decision(profile, op, decision)
        # 4) evidence.begin — for a denial too; written before anything can act outside the
        # engine (``_execute``), or with the end when nothing could (``_finish``)
        audit = None if self.shadow is None else self.shadow.decide(
            grant, manifest, op, settings=settings, overrides=overrides, context=context,
            now_ms=now, enforced=decision)
        begin = self._begin(envelope, grant, profile, op, now, replay(profile), audit, notes)
        if not decision.allowed:
            code = ErrorCode(decision.code or ErrorCode.PERMISSION_DENY)
            err = PolicyEngineError(code, decision.reason or "denied")
            return self._finish(begin, decision, profile, op, started, err=err, status="denied")
        # pick the backend before charging the budget: choosing is side-effect free, and a call
        # the backend refuses must not consume a call of the grant's budget
        sel = select(self.components.executors, self.config, profile, kind, op)
        if sel.error is not None or sel.executor is None:
            err = sel.error or PolicyEngineError(ErrorCode.UNKNOWN_INTERNAL, "no backend")
            status: Status = "denied" if err.code == ErrorCode.CAPABILITY_BLOCKED else "error"
            # reported and recorded as the deny explain answers, not the guard's allow
            return self._finish(begin, refusal_decision(decision, err), profile, op, started,
                                err=err, status=status,
                                backend=sel.backend, error_kind=("capability" if status ==
                                                                 "denied" else "provider"))
        key = grant_key(grant)
        limits = call_limits(decision, profile)
        # 5) concurrency: one of the grant's `max_concurrency` slots, held until the call ends
        # (released on every path; a crashed process's lease expires or dies with it)
        slot = Slot(self.meter, key, limits, profile.timeout_ms)
        # an op its executor runs wholly inside this process (``contained_kinds``: an fs read
        # or listing) and charges when it starts takes its slot then, with its `calls`, and
        # gives it back when it returns, with its `bytes_in`: one meter step each where the
        # meter can (docs/operations.md "Budgets and revocation")
        contained = via is None and kind in getattr(sel.executor, "contained_kinds", ())
        late = contained and charges_with_slots(self.meter) and \
            getattr(sel.executor, "charges_at_start", False) is True
        if not late:
            try:
                slot.take()
            except PolicyEngineError as exc:
                return self._finish(begin, decision, profile, op, started, err=exc,
                                    status="denied", backend=sel.backend,
                                    degraded=sel.degraded)
        try:
            # INVARIANT: the begin record is durable before an executor may act outside this
            # process; a contained op answers nobody before ``_finish`` appends begin and end
            # at once (docs/operations.md "Evidence: one append for contained reads")
            if not contained:
                self._write_begin(begin)
            # the caller's yes stands for this run when it chose the backend that yes was
            # about (``runs_on_caller``: kept per kind) for the same root
            inline = on_caller is not None and contained and \
                on_caller == profile.mappings.root_fs and \
                self._contained.get(kind) is sel.executor
            return self._execute(begin, decision, profile, op, started, sel, key, limits,
                                 guard, cancel, on_output, via, begun=not contained,
                                 late=slot if late else None, inline=inline)
        finally:
            slot.release()

    def _execute(self, begin: EvidenceBegin, decision: Decision, profile: Profile, op: ExecOp,
                 started: float, sel: Selection, key: str, limits: Limits,
                 guard: GuardLike, cancel: CancelToken | None,
                 on_output: Callable[[str, bytes], None] | None = None,
                 via: Callable[[Executor], Executor] | None = None, *,
                 begun: bool = True, late: Slot | None = None,
                 inline: bool = False) -> RunOutcome:
        """Steps 6 and 7: charge the call (before, or when the executor starts), run, end.

        :param begun: the begin record is written (else ``_finish`` writes it with the end).
        :param late: the call's slot, not taken yet: taken with the `calls` charge when the
            executor starts, given back with what it consumed when it returns.
        """
        assert sel.executor is not None  # INVARIANT: run() returned on a failed selection
        kind = OpKind(op.kind)

        refused_late: list[PolicyEngineError] = []  # the late slot or `calls` refused

        def charge_call() -> None:
            if late is None:
                self.meter.check_and_consume(key, "calls", 1, profile.budget.calls)
                return
            try:
                late.take_charging("calls", 1, profile.budget.calls)
            except PolicyEngineError as exc:
                refused_late.append(exc)
                raise

        # 6) budget: one call, charged when the executor starts its first side effect (one
        # declaring ``charges_at_start``), else now; a refusal before the start costs nothing
        at_start = getattr(sel.executor, "charges_at_start", False) is True
        if not at_start:
            try:
                charge_call()
            except PolicyEngineError as exc:
                return self._finish(begin, decision, profile, op, started, err=exc,
                                    status="denied", backend=sel.backend, degraded=sel.degraded,
                                    begun=begun)
        # 7) execute, charging streamed usage as it happens
        charged: dict[str, int] = dict.fromkeys(_METERED, 0)

        deferred: list[tuple[str, int, int | None]] = []

        def consume(kind_: str, amount: int) -> None:
            if late is not None and late.lease is not None:
                # charged when the slot is given back, in the same meter step (a contained
                # op consumes once, at its end); one charge at a time waits
                for waiting in deferred:
                    self.meter.check_and_consume(key, *waiting)
                    charged[waiting[0]] = charged.get(waiting[0], 0) + waiting[1]
                deferred[:] = [(kind_, amount, limit_of(profile.budget, kind_))]
                return
            self.meter.check_and_consume(key, kind_, amount, limit_of(profile.budget, kind_))
            charged[kind_] = charged.get(kind_, 0) + amount

        # executors that decide again mid-operation (redirects, subrequests, the restricted
        # proxy) must use this call's policy-aware guard, never a policy-less one; they run
        # under the decision's limits (profile ⊓ permitting rule ⊓ op), not the profile's
        timeout_ms = limits.timeout_ms or profile.timeout_ms
        ctx = ExecContext(profile=profile, deadline=time.monotonic() + timeout_ms / 1000,
                          degraded=sel.degraded, consume=consume, guard=guard,
                          limits=limits, on_start=charge_call if at_start else nothing,
                          has_started=not at_start, on_output=on_output)
        self.metrics.observe_exec(kind, profile)
        with tracing.span("policy_engine.execute", {"policy_engine.backend": sel.backend}):
            attempt = run_with_deadline(sel.executor if via is None else via(sel.executor),
                                        ctx, op, cancel, inline=inline and via is None)
        if refused_late and not ctx.has_started:
            # answered as a slot refused before the run is (nothing ran, nothing charged)
            return self._finish(begin, decision, profile, op, started, err=refused_late[0],
                                status="denied", backend=sel.backend, degraded=sel.degraded,
                                begun=begun)
        if late is not None and late.lease is not None:
            try:  # what it consumed, and its slot back, in one step
                late.release_charging(deferred)
            except PolicyEngineError as exc:  # over budget after the fact: output withheld
                attempt = Attempt(None, exc, classify(exc, sel.backend or "")[1])
            else:
                for kind_, amount, _ in deferred:
                    charged[kind_] = charged.get(kind_, 0) + amount
        ran = ctx.has_started or attempt.result is not None
        if not ctx.has_started and attempt.error is None:
            # it returned without saying it started: charge now, withholding the output
            attempt = charged_late(attempt, charge_call)
        attempt = self._reconcile(attempt, key, profile, charged)
        usage = self._usage(attempt, charged, calls=int(ran))
        side_effects = list(ctx.side_effects)
        over = attempt.error is not None and attempt.error.code == ErrorCode.BUDGET_EXCEEDED
        return self._finish(begin, decision, profile, op, started, attempt=attempt,
                            status="ok" if attempt.error is None else
                            "denied" if over and not ran else "error",
                            err=attempt.error, backend=sel.backend,
                            degraded=sel.degraded + _reported_degradations(attempt),
                            usage=usage, side_effects=side_effects, begun=begun)

    # -- steps ------------------------------------------------------------------------------------

    def _grant_refusal(self, grant: Grant, now: int) -> PolicyEngineError | None:
        if grant.expires_at <= now:
            return PolicyEngineError(ErrorCode.PERMISSION_DENY, "grant expired",
                                     audit={"expires_at": grant.expires_at, "now": now})
        try:
            revoked = self.revocations is not None and self.revocations.is_revoked(grant)
        except PolicyEngineError as exc:  # a list that cannot be read fails closed
            return exc
        except Exception as exc:  # so does a third-party watcher that raises anything else
            return PolicyEngineError(ErrorCode.PROVIDER_UNAVAILABLE, "revocation list cannot "
                                     f"be read: {type(exc).__name__}: {exc}")
        if revoked:
            return PolicyEngineError(ErrorCode.PERMISSION_DENY, "grant revoked",
                                     audit={"call_id": grant.call_id})
        return None

    def _begin(self, envelope: str, grant: Grant, profile: Profile | None, op: ExecOp,
               now: int, replay: dict[str, Any] | None = None,
               shadow: dict[str, Any] | None = None,
               annotations: dict[str, Any] | None = None) -> EvidenceBegin:
        """The begin record, not yet written: ``_write_begin`` before an executor may act
        outside the engine, else ``_finish`` writes it with the end ("one append")."""
        return begin_record({
            "envelope_id": envelope, "tenant": grant.tenant, "subject_id": grant.subject_id,
            "tool_name": grant.tool_name, "call_id": grant.call_id,
            "profile_hash": profile.profile_hash if profile else "",
            "capability": capability_string(op),
            "inputs_digest": inputs_digest(op, self.evidence_key),
            "produced_at_ms": now,
            "policy_version_hash": (profile.policy_version_hash if profile
                                    else self.policyset.version_hash), "replay": replay,
            "shadow": shadow, "annotations": annotations})

    def _write_begin(self, ev: EvidenceBegin) -> None:
        with tracing.span("policy_engine.evidence", {"policy_engine.record": "begin"}):
            for sink in self.sinks:
                sink.begin(ev)

    def _refused(self, envelope: str, grant: Grant, profile: Profile | None, op: ExecOp,
                 now: int, started: float, err: PolicyEngineError,
                 replay: dict[str, Any] | None = None,
                 annotations: dict[str, Any] | None = None) -> RunOutcome:
        decision = Decision(decision="deny", code=err.code.value, http_status=err.http_status,
                            reason=err.reason)
        begin = self._begin(envelope, grant, profile, op, now, replay, None, annotations)
        return self._finish(begin, decision, profile, op, started, err=err, status="denied")

    def _reconcile(self, attempt: Attempt, key: str, profile: Profile,
                   charged: dict[str, int]) -> Attempt:
        """Charge what the executor reported beyond what it already charged while running.
        Over budget after the fact: the output is withheld and the call fails with QUOTA.
        """
        if attempt.result is None:
            return attempt
        result = attempt.result
        if not result.ok:  # an executor that reports failure instead of raising
            code = result.code if result.code in ErrorCode._value2member_map_ else None
            err = PolicyEngineError(ErrorCode(code) if code else ErrorCode.EXECUTION_FAILED,
                                    result.message or "execution failed")
            return Attempt(None, err, "execution", err.code == ErrorCode.TIMEOUT)
        for kind in _METERED:
            delta = getattr(result.used, kind) - charged[kind]
            if delta <= 0:
                continue
            try:
                self.meter.check_and_consume(key, kind, delta, limit_of(profile.budget, kind))
            except PolicyEngineError as exc:
                return Attempt(None, exc, "quota")
            charged[kind] += delta
        return attempt

    @staticmethod
    def _usage(attempt: Attempt, charged: dict[str, int], *, calls: int = 1) -> Usage:
        # a validated Usage's fields (none reported: zeroes)
        reported = attempt.result.used.__dict__ if attempt.result is not None else _ZEROES
        return usage_of({"calls": calls,
                         **{k: max(reported[k], charged[k]) for k in _METERED}})

    def _finish(self, begin: EvidenceBegin, decision: Decision, profile: Profile | None,
                op: ExecOp, started: float, *, status: Status, err: PolicyEngineError | None = None,
                attempt: Attempt | None = None, backend: str | None = None,
                degraded: tuple[str, ...] = (), usage: Usage | None = None,
                side_effects: list[SideEffectRec] | None = None,
                error_kind: str | None = None, begun: bool = False) -> RunOutcome:
        """Write evidence.end (with the begin record in one append unless ``begun``), update
        metrics and build the public result."""
        usage = usage or Usage()
        latency_ms = (time.perf_counter() - started) * 1000
        ok = status == "ok" and attempt is not None and attempt.result is not None
        out = attempt.result.out if ok and attempt and attempt.result else {}
        # only a process call's arguments are matched against the allowing template
        effects = self._side_effects(op, out, side_effects or [], self.evidence_key,
                                     allowing_template(profile, decision)
                                     if isinstance(op, ProcExecOp) else None)
        if err is not None and error_kind is None:
            error_kind = attempt.error_kind if attempt else _denial_kind(err.code)
        end = end_record({
            "envelope_id": begin.envelope_id, "status": status,
            "error_code": err.code.value if err else None,
            "outputs_digest": digest_json(out) if ok else EMPTY_DIGEST,
            "side_effects": tuple(effects), "budget_used": usage,
            "finished_at_ms": self._clock(), "sandbox_backend": backend,
            "sandbox_profile": _profile_label(profile),
            "sandbox_network_mode": profile.network.value if profile else None,
            "sandbox_latency_ms": round(latency_ms, 3),
            "sandbox_timed_out": bool(attempt and attempt.timed_out), "sandbox_success": ok,
            "sandbox_error_kind": error_kind, "sandbox_degraded": bool(degraded),
            "sandbox_degrade_reason": "; ".join(degraded) or None,
            **decision_fields(decision, profile, self.policyset.version_hash)})
        record = "end" if begun else "begin+end"  # a contained read's one append
        with tracing.span("policy_engine.evidence", {"policy_engine.record": record}):
            for sink in self.sinks:
                if begun:
                    sink.end(end)
                else:
                    sink.pair(begin, end)
        self._observe(op, status, err, usage, latency_ms)
        if err is not None:
            log.info("call %s %s: %s (audit: %s)", begin.envelope_id, status, err.code.value,
                     redact_audit(err.audit))
            result = failed_result(err.code.value, err.public_message(), usage)
        else:
            result = ok_result(out, usage)
        return RunOutcome(result=result, decision=decision, begin=begin, end=end,
                          profile=profile)

    @staticmethod
    def _side_effects(op: ExecOp, out: Mapping[str, Any], recorded: list[SideEffectRec],
                      key: bytes, template: tuple[ArgSlot, ...] | None) -> list[SideEffectRec]:
        summary = request_summary(op, key, template)
        if summary is None:
            return recorded
        meta = dict(summary.meta)
        meta.update({k: out[k] for k in _PROCESS_FIELDS if k in out})
        return [SideEffectRec(kind=summary.kind, meta=meta), *recorded]

    def _observe(self, op: ExecOp, status: Status, err: PolicyEngineError | None, usage: Usage,
                 latency_ms: float) -> None:
        m = self.metrics
        if status == "denied" and err is not None:
            m.denied_total.labels(code=err.code.value).inc()
        elif err is not None:
            m.errors_total.labels(code=err.code.value).inc()
        # a counter's zero increment is skipped (prometheus takes a lock per ``inc``)
        if usage.bytes_in:
            m.bytes_used("in").inc(usage.bytes_in)
        if usage.bytes_out:
            m.bytes_used("out").inc(usage.bytes_out)
        if usage.cpu_ms:
            m.cpu_ms.inc(usage.cpu_ms)
        if usage.gpu_ms:
            m.gpu_ms.inc(usage.gpu_ms)
        m.latency(domain_of(op.kind)).observe(latency_ms)


def _reported_degradations(attempt: Attempt) -> tuple[str, ...]:
    """What the executor itself ran without (``out["degraded"]``, e.g. a slower fallback
    launcher in compat mode), so the evidence records it like a degraded selection.
    """
    out = attempt.result.out if attempt.result is not None else {}
    reported = out.get("degraded") if isinstance(out, dict) else None
    if not isinstance(reported, list):
        return ()
    return tuple(str(r) for r in reported)


def _profile_label(profile: Profile | None) -> str | None:
    if profile is None:
        return None
    return profile.name or f"default:{profile.profile_hash[:12]}"


def _denial_kind(code: ErrorCode) -> str:
    return {ErrorCode.BUDGET_EXCEEDED: "quota", ErrorCode.PERMISSION_DENY: "permission",
            ErrorCode.DENY_TOOL: "policy", ErrorCode.CAPABILITY_BLOCKED: "policy",
            ErrorCode.SCHEMA_VALIDATION_FAILED: "schema"}.get(code, "internal")


def run_once(policyset: PolicySet, grant: Grant, manifest: Manifest, op: ExecOp, *,
             config: EngineConfig, settings: Settings | None = None,
             overrides: Overrides | None = None, context: Mapping[str, object] | None = None,
             now_ms: int | None = None, shadow: PolicySet | None = None,
             annotations: Mapping[str, Any] | None = None) -> RunOutcome:
    """Run a single call with a fresh orchestrator and close it (flushing spools): the
    ``policy-engine run`` command.

    :raises ValueError: the configuration names a sink or meter no plugin provides.
    """
    with Orchestrator(policyset, config=config, shadow=shadow) as orch:
        return orch.run(grant, manifest, op, settings=settings, overrides=overrides,
                        context=context, now_ms=now_ms, annotations=annotations)
