"""The guard: decides one concrete operation under one profile, on resolved values, fast.

Decision order: ``stages.STEPS``, one function a step, each answering a deny (or an early
allow) or passing to the next; the traced call runs the same steps (untraced, those that
cannot answer for the kind and profile are left out: ``chain.plan``). Each step's code is
pinned by ``tests/unit/test_guard_decide.py``; ``tests/unit/test_guard_stages.py`` keeps the
names below equal to the table's.

0. ``kind``: the op kind maps to a capability kind; malformed input →
   ``SCHEMA.VALIDATION_FAILED``; then (1) the grant's expiry, read with the compilation:
   ``profile.expires_at <= now`` → ``SANDBOX.PERMISSION_DENY``
2. ``resolve``: the resource: path normalized and symlinks resolved beneath the root (a root
   that is not its own real path refuses), fs.write bound to the fs root or tmp dir, URL parsed,
   argv shape → ``CAPABILITY_BLOCKED`` / ``SCHEMA.VALIDATION_FAILED`` / ``POLICY.DENY_TOOL``;
   an fs path (resolved or as written), a proc.exec cwd or a tmp.alloc's tmp dir in the
   engine's state directory (``engine_state.py``) → ``CAPABILITY_BLOCKED`` naming
   ``builtin:engine-state``, before any forbid or permit (no policy lifts it)
3. ``forbids``: deny-overrides, mandatory first: resource matches and condition true (or
   errors) → ``SANDBOX.CAPABILITY_BLOCKED`` naming the rule
4. ``network``: network off for net.http / browser → ``CAPABILITY_BLOCKED``
5. ``permits``: the first profile capability whose ``all_of`` members all admit and whose
   condition holds (an fs.write to git's control files only under one naming ``.git``:
   ``gitfiles.py``); if none: not granted → ``PERMISSION_DENY``; not declared →
   ``POLICY.DENY_TOOL``; a permit whose condition was false or failed → ``PERMISSION_DENY``
   naming it; else default deny. Within it, step 6: a private, loopback, link-local or
   metadata IP literal not named by the capability's hosts → ``CAPABILITY_BLOCKED``
7. ``limits``: limits of the matched capability met with the profile's →
   ``CAPABILITY_BLOCKED``
8. ``consent``: consent required and missing or not current → ``PERMISSION_DENY``
8b. ``facts``: the facts, each from a named source (``facts.py``): a proc.exec ``cwd`` the
   declared facts refuse (without them the cwd is the executor's view: its ``refusal``, asked
   by the backend selection), and for fs ops what the fs executor will find at the resolved
   path (not a regular file, a whole read over ``bytes_in``, an existing target without
   ``overwrite``, facts that cannot be read) → ``CAPABILITY_BLOCKED``. Policy before facts: a
   forbidden call is reported by its rule whatever its facts.
9. ``allow``

A step that raises is a deny: a resolver's ``PolicyEngineError`` with its own code, anything
else ``UNKNOWN.INTERNAL`` (``verdict.failed``); never an allow.
"""

from __future__ import annotations

import copy
import dataclasses
import os
import time
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any

from policy_engine.graph import PolicySet
from policy_engine.guard.compiled import (
    CompiledProfile,
    ConditionIndex,
    compile_forbids,
    compile_profile,
    guard_condition,
)
from policy_engine.guard.engine_state import EngineState
from policy_engine.guard.facts import FactSource
from policy_engine.guard.layers import PolicyPermits, consent_for, layer_steps
from policy_engine.guard.paths import quote
from policy_engine.guard.resolve import (
    ABSENT,
    OP_KIND,
    Facts,
    Resolved,
    coerce_op,
    resolve_fs,
    resolve_other,
)
from policy_engine.guard.shapes import ShapeCache, same_profile
from policy_engine.guard.stages import FS_OPS, Call, kind
from policy_engine.guard.steps import settle_consent
from policy_engine.guard.tracer import Tracer
from policy_engine.guard.verdict import failed
from policy_engine.model import Decision, Profile, RuleRef


class Guard:
    """Decides operations; compiles each profile once and caches it by ``profile_hash``.

    :param policyset: where the CEL conditions of profile rules and the consent rules come from.
    :param resolve_symlinks: resolve fs paths beneath the root (one ``openat2`` asking the kernel
        whether any component is a link, then ``lstat``/``readlink`` per component only when one
        is). Turn off only where the executor enforces resolution itself (``openat2`` with
        ``RESOLVE_BENEATH``).
    :param fs_facts: refuse what the fs executor will refuse at the resolved path (one
        ``lstat``: a read of a non-regular file or of a file over ``bytes_in``, a write over a
        non-regular or, without ``overwrite``, an existing file), so a dry run answers as the
        run does. Off only for pure policy comparisons that must not depend on the local disk
        (the benchmark peers); defaults to ``resolve_symlinks``.
    :param state_dir: the engine's state directory (``config.state_dir``): every fs path, a
        proc.exec's cwd and the tmp dir of a tmp.alloc in it are refused (``engine_state.py``,
        rule ``builtin:engine-state``), the session workspaces beneath ``run_code/`` excepted.
        ``None`` (a pure policy guard: tests, analysis) refuses nothing for it.
    :param cache_size: compiled profiles kept; the oldest is dropped first. Profiles of one
        shape (per-call copies of one template, see ``guard.shapes``) share one compilation,
        and every profile of the policy shares its compiled forbids; each of those caches is
        bounded by ``cache_size`` too.
    """

    def __init__(self, policyset: PolicySet | None = None, *, resolve_symlinks: bool = True,
                 cache_size: int = 1024, fs_facts: bool | None = None,
                 state_dir: str | os.PathLike[str] | None = None) -> None:
        if isinstance(cache_size, bool) or not isinstance(cache_size, int) or cache_size < 1:
            raise ValueError(f"the guard's cache_size must be an integer of at least 1, "
                             f"not {cache_size!r}")
        self.policyset = policyset
        self.resolve_symlinks = resolve_symlinks
        self.fs_facts = resolve_symlinks if fs_facts is None else fs_facts
        self.facts: FactSource | None = None  # None: this host's disk (``with_facts``)
        self.engine_state = EngineState(state_dir) if state_dir is not None else None
        self._conditions = ConditionIndex(policyset)
        rules = policyset.consent_rules if policyset is not None else ()
        self._builtin_consent = any(r.condition is None for r in rules)
        self._consent_rules = tuple(guard_condition(r.condition) for r in rules
                                    if r.condition is not None)
        self._consent_refs: tuple[RuleRef | None, ...] = tuple(
            r.ref for r in rules if r.condition is not None)
        self._builtin_ref = next((r.ref for r in rules if r.condition is None), None)
        self._cache: OrderedDict[object, CompiledProfile] = OrderedDict()
        self._permits = PolicyPermits(policyset)
        self._cache_size = cache_size
        self._shapes = ShapeCache(cache_size)

    def policy_only(self) -> Guard:
        """This guard without the disk facts (``fs_facts``): the same policy, cache and
        conditions, for callers asking what the policy allows on a path (the fs listing's entry
        filter), not whether one op will run there."""
        twin = copy.copy(self)
        twin.fs_facts = False
        return twin

    def compiled(self, profile: Profile) -> CompiledProfile:
        """The compiled form of ``profile`` (cached; unhashed profiles are keyed by identity)."""
        key: object = profile.profile_hash or id(profile)
        cp = self._cache.get(key)
        if cp is not None and (cp.profile is profile or
                               (profile.profile_hash and same_profile(cp.profile, profile))):
            return cp
        return self._compile_into_cache(profile, key)

    def _compile_into_cache(self, profile: Profile, key: object) -> CompiledProfile:
        cp = self._shapes.compiled(profile, self._compile)
        cache = self._cache
        cache[key] = cp  # each step is atomic under the GIL; a race drops one entry too many
        if len(cache) > self._cache_size:
            # an OrderedDict: ``next(iter(dict))`` walks past every slot deleted before it
            cache.popitem(last=False)
        return cp

    def _compile(self, profile: Profile) -> CompiledProfile:
        forbids = self._shapes.forbids(profile, lambda p: compile_forbids(p, self._conditions))
        cp = compile_profile(profile, self._conditions, builtin_consent=self._builtin_consent,
                             consent_rules=self._consent_rules, forbids=forbids)
        settled = settle_consent(cp, self._consent_rules, self._consent_refs, self._builtin_ref)
        return cp if settled is None else dataclasses.replace(cp, consent_settled=settled)

    def decide(self, profile: Profile, op: Any, *, context: Mapping[str, object] | None = None,
               now_ms: int | None = None, trace: bool = False,
               _tracer: Tracer | None = None) -> Decision:
        """Decide ``op`` under ``profile``; never raises for bad input (it is a deny).

        Runs the steps of ``stages.STEPS`` in order until one answers (the last always does);
        untraced, the steps that cannot answer for the op's kind and the profile are left out
        (``chain.plan``).

        :param trace: record every step; a deny then lists each layer that would refuse.
        :param _tracer: internal: the tracer of the traced call this one records into.
        """
        # One function is the table's runner and the public entry: a call less per decision.
        # A traced call runs the same steps with a tracer, then adds the layers to a deny the
        # steps returned (one they raised, the resource unresolved, gets none).
        if trace and _tracer is None:
            tracer = Tracer()
            try:
                decision = self.decide(profile, op, context=context, now_ms=now_ms,
                                       _tracer=tracer)
            except Exception as exc:  # noqa: BLE001 — a guard failure must be a deny
                return failed(profile, exc, tracer)
            if decision.decision == "deny":
                return self._with_layers(profile, op, context, now_ms, decision)
            return decision
        # the Call is filled here, not by an ``__init__`` (its frame costs ≈ 0.1 µs a decision);
        # ``Call()`` without one costs less than ``Call.__new__(Call)`` (no argument tuple)
        call = Call()
        call.guard = self
        call.profile = profile
        call.op = op
        call.context = context
        call.now_ms = now_ms
        call.tr = _tracer
        try:
            # ``kind`` finds the compilation and the chain of steps after it this call runs
            # (``chain.plan``: all of them traced, else those that can answer for the kind and
            # profile); the chain's last step always answers
            return kind(call) or call.run(call)
        except Exception as exc:  # noqa: BLE001 — a guard failure must be a deny, never an allow
            if _tracer is not None:
                raise  # the traced call answers it, above
            return failed(profile, exc, None)

    def with_facts(self, facts: FactSource | None) -> Guard:
        """This guard deciding on ``facts`` instead of this host's disk (``facts.py``): the same
        policy, cache and conditions; ``None`` is the host again."""
        twin = copy.copy(self)
        twin.facts = facts
        twin.resolve_symlinks = twin.fs_facts = facts is not None or self.resolve_symlinks
        return twin

    def _cwd_refusal(self, cp: CompiledProfile, cwd: str, tr: Tracer | None) -> str | None:
        """Why the declared facts refuse ``cwd`` (absent, not a directory), else ``None``.

        Without declared facts the cwd is a fact of the executor that runs the op, judged in
        its own view by its ``refusal`` (the backend step of the run and of ``explain
        --config``): beneath ``root_fs`` and bound for the proc sandboxes, beneath
        ``/workspace/work`` in the container for Docker."""
        why = self.facts.cwd_refusal(cp.root_fs, cwd) if self.facts is not None else None
        if tr is not None:
            if why is not None:
                tr.step("fact", "fail", detail=why)
            elif self.facts is not None:
                tr.step("fact", "pass", detail=f"cwd: {self.facts.describe(cp.root_fs, cwd)}")
            else:
                tr.step("fact", "skip", detail=f"cwd {quote(cwd)}: judged in the executor's "
                        "view (the backend step), not on this host's disk")
        return why

    def _fact_note(self, cp: CompiledProfile, path: str, seen: Facts | str) -> str:
        """The trace's words for the fs facts of ``path`` and where they come from."""
        if self.facts is not None:
            return self.facts.describe(cp.root_fs, path)
        if seen == ABSENT:
            return f"{quote(path)} does not exist yet (host view: the fs executor's)"
        return f"{quote(path)} read on this host (host view: the fs executor's)"

    def _with_layers(self, profile: Profile, op: Any, extra: Mapping[str, object] | None,
                     now_ms: int | None, decision: Decision) -> Decision:
        """``decision`` (a traced deny) with every layer's own verdict added before its last
        step, so explain lists all that would refuse, not only the first."""
        try:
            if not isinstance(getattr(op, "kind", None), str) or op.kind not in OP_KIND:
                op = coerce_op(op)
            kind = op.kind
            cap_kind = OP_KIND[kind]
            cp = self.compiled(profile)
            now = time.time_ns() // 1_000_000 if now_ms is None else now_ms
            rv: Resolved | None = None
            path: str | None = None
            written: str | None = None
            if kind in FS_OPS:
                if self.facts is None:
                    path, _, _, written = resolve_fs(cp, op.path, self.resolve_symlinks, False)
                else:
                    path, _, _, written = self.facts.resolve(cp.root_fs, cp.tmp_dir, op.path)
                res: object = path
            else:
                rv = resolve_other(kind, op)
                res = rv.res
            consent = consent_for(self._consent_rules, self._consent_refs, self._builtin_ref, cp,
                                  now)
            steps = layer_steps(self._permits, cp, kind, cap_kind, op, res, rv, path, written,
                                now, extra, consent)
        except Exception:  # noqa: BLE001 — the report is an aid: the decision stands without it
            return decision
        trace = decision.trace or ()
        return decision.model_copy(update={"trace": (*trace[:-1], *steps, *trace[-1:])})


