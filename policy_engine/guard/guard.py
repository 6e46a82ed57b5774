"""The guard: decides one concrete operation under one profile, on resolved values, fast.

Decision order (each step's code is pinned by ``tests/unit/test_guard_decide.py``):

0. the op kind maps to a capability kind; malformed input → ``SCHEMA.VALIDATION_FAILED``
1. grant expiry: ``profile.expires_at <= now`` → ``SANDBOX.PERMISSION_DENY``
2. resolve the resource: path normalized and symlinks resolved beneath the root (a root that
   is not its own real path refuses), fs.write bound to the fs root or tmp dir, URL parsed,
   argv shape → ``CAPABILITY_BLOCKED`` / ``SCHEMA.VALIDATION_FAILED`` / ``POLICY.DENY_TOOL``
3. forbids, deny-overrides, mandatory first: resource matches and condition true (or errors)
   → ``SANDBOX.CAPABILITY_BLOCKED`` naming the rule
4. network off for net.http / browser → ``CAPABILITY_BLOCKED``
5. the first profile capability whose ``all_of`` members all admit and whose condition holds
   (an fs.write to git's control files only under one naming ``.git``: ``gitfiles.py``);
   if none: not granted → ``PERMISSION_DENY``; not declared → ``POLICY.DENY_TOOL``; a permit
   whose condition was false or failed → ``PERMISSION_DENY`` naming it; else default deny
6. a private, loopback, link-local or metadata IP literal not named by the capability's hosts
   → ``CAPABILITY_BLOCKED``
7. limits of the matched capability met with the profile's → ``CAPABILITY_BLOCKED``
8. consent required and missing or not current → ``PERMISSION_DENY``; then the facts, each
   from a named source (``facts.py``): a proc.exec ``cwd`` the declared facts refuse (without
   them the cwd is the executor's view: its ``refusal``, asked by the backend selection), and
   for fs ops what
   the fs executor will find at the resolved path (not a regular file, a whole read over
   ``bytes_in``, an existing target without ``overwrite``, facts that cannot be read) →
   ``CAPABILITY_BLOCKED``. Policy before facts: a forbidden call is reported by its rule
   whatever its facts.
9. allow
"""

from __future__ import annotations

import copy
import dataclasses
import time
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any

from policy_engine.errors import REGISTRY, ErrorCode, PolicyEngineError
from policy_engine.graph import PolicySet
from policy_engine.guard import gitfiles
from policy_engine.guard.compiled import (
    CompiledCap,
    CompiledProfile,
    ConditionIndex,
    compile_forbids,
    compile_profile,
    guard_condition,
)
from policy_engine.guard.facts import FactSource
from policy_engine.guard.fsfacts import fs_refusal
from policy_engine.guard.ipaddr import classify, is_address_allowed
from policy_engine.guard.layers import PolicyPermits, consent_for, layer_steps
from policy_engine.guard.paths import normalize_path, quote
from policy_engine.guard.resolve import (
    ABSENT,
    OP_KIND,
    Facts,
    Resolved,
    build_context,
    coerce_op,
    resolve_fs,
    resolve_other,
)
from policy_engine.guard.shapes import ShapeCache, same_profile
from policy_engine.guard.steps import (
    consent_needed,
    diagnose,
    limit_violation,
    settle_consent,
    why_not,
    with_request_timeout,
)
from policy_engine.guard.tracer import Tracer
from policy_engine.model import Decision, Profile, RuleRef, TraceStep
from policy_engine.model.unchecked import SET_EXTRA, SET_FIELDS_SET, SET_PRIVATE

_FS_OPS = frozenset({"fs.read", "fs.write", "fs.list"})
_NET_OPS = frozenset({"net.http", "browser.nav", "browser.screenshot"})
_STATUS: dict[ErrorCode, tuple[str, int]] = {c: (c.value, REGISTRY[c].http_status)
                                             for c in ErrorCode}
_BLOCKED, _PERM = ErrorCode.CAPABILITY_BLOCKED, ErrorCode.PERMISSION_DENY
_NONE_REFUSED: list[tuple[CompiledCap, str | None]] = []  # shared, never appended to


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
    :param cache_size: compiled profiles kept; the oldest is dropped first. Profiles of one
        shape (per-call copies of one template, see ``guard.shapes``) share one compilation,
        and every profile of the policy shares its compiled forbids; each of those caches is
        bounded by ``cache_size`` too.
    """

    def __init__(self, policyset: PolicySet | None = None, *, resolve_symlinks: bool = True,
                 cache_size: int = 1024, fs_facts: bool | None = None) -> None:
        if isinstance(cache_size, bool) or not isinstance(cache_size, int) or cache_size < 1:
            raise ValueError(f"the guard's cache_size must be an integer of at least 1, "
                             f"not {cache_size!r}")
        self.policyset = policyset
        self.resolve_symlinks = resolve_symlinks
        self.fs_facts = resolve_symlinks if fs_facts is None else fs_facts
        self.facts: FactSource | None = None  # None: this host's disk (``with_facts``)
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

        :param trace: record every step; a deny then lists each layer that would refuse.
        :param _tracer: internal: the tracer of the traced call this one records into.
        """
        # One function is the decision body and the public entry: a call less per decision
        # (≈ 0.15 µs of ≈ 4). A traced call runs it again with a tracer, then adds the layers
        # to a deny the body returned (one it raised, the resource unresolved, gets none).
        if trace and _tracer is None:
            tracer = Tracer()
            try:
                decision = self.decide(profile, op, context=context, now_ms=now_ms,
                                       _tracer=tracer)
            except Exception as exc:  # noqa: BLE001 — a guard failure must be a deny
                return _failed(profile, exc, tracer)
            if decision.decision == "deny":
                return self._with_layers(profile, op, context, now_ms, decision)
            return decision
        tr = _tracer
        try:
            # Refusals decided here return their Decision (raising costs more than the rest of
            # an fs decision); refusals from the resolvers arrive as PolicyEngineError below.
            kind = getattr(op, "kind", None)
            cap_kind = OP_KIND.get(kind) if type(kind) is str else None
            if cap_kind is None:  # step 0
                op = coerce_op(op)
                kind = op.kind
                cap_kind = OP_KIND[kind]
            assert kind is not None  # INVARIANT: a kind OP_KIND maps (narrowing for mypy)
            phash = profile.profile_hash
            key = phash or id(profile)
            cp = self._cache.get(key)
            # a hash names a compilation only for a profile that holds what it was compiled from
            # (a ``model_copy`` keeping another profile's hash compiles on its own)
            if cp is not None and (cp.profile is profile or (phash and same_profile(cp.profile,
                                                                                    profile))):
                expires_at, window = cp.expires_at, cp.consent_window
            else:
                # a new call of a cached shape (untraced): decided on the shape's compilation
                # with this call's expiry, consent window and hash, as ``shapes.derive`` sets them
                base = self._shapes.base_for(profile) if tr is None else None
                if base is not None:
                    cp = base
                    expires_at, consent = profile.expires_at, profile.consent
                    window = None if consent is None else (consent.granted_at, consent.expires_at)
                else:
                    cp = self._compile_into_cache(profile, key)
                    expires_at, window = cp.expires_at, cp.consent_window
            if tr is not None:
                tr.step("kind", "pass", detail=f"{kind} needs {cap_kind}")
            now = time.time_ns() // 1_000_000 if now_ms is None else now_ms
            if expires_at <= now:  # step 1
                if tr is not None:
                    tr.step("expiry", "fail", detail="grant expired")
                return _deny(phash, _PERM, "grant expired", None, tr)
            # step 2
            rv: Resolved | None = None
            path: str | None = None
            seen: Facts = None  # what resolving the path saw of the file (for step 8b)
            written: str | None = None
            cwd: str | None = None  # a proc.exec's cwd, checked with the facts (step 8b)
            if kind in _FS_OPS:
                if self.facts is None:
                    path, seen, inside, written = resolve_fs(cp, op.path, self.resolve_symlinks,
                                                             self.fs_facts and kind != "fs.list")
                else:  # declared or unknown facts, never this host's disk (guard/facts.py)
                    path, seen, inside, written = self.facts.resolve(cp.root_fs, cp.tmp_dir,
                                                                     op.path)
                res: object = path
                if kind == "fs.write" and not inside:
                    return _deny(phash, _BLOCKED,
                                 f"write to {quote(path)} is outside the fs root and the tmp dir",
                                 None, tr)
            else:
                rv = resolve_other(kind, op)
                res = rv.res
                if kind == "proc.exec" and op.cwd is not None:
                    cwd = normalize_path(op.cwd)  # judged after the policy (step 8b)
            if tr is not None:
                tr.step("resolve", "pass", detail=_describe(rv, path))
            data: dict[str, object] | None = None  # the CEL context, built at the first condition
            # step 3: forbids
            fset = cp.forbids.get(cap_kind)
            if fset is not None:
                # forbids see the resolved path and ``written``, the path as the op spelt it when
                # resolving its links changed it (a forbid on `/ws/cur/private/**` covers that
                # spelling). With a tracer, URL and tool forbids are scanned one by one so the
                # trace names each.
                if fset.screen is not None and (tr is None or fset.by_globs) and \
                        not fset.screen(res) and (written is None or not fset.screen(written)):
                    if tr is not None:
                        tr.step("forbid", "no-match", detail="no forbid glob matches")
                else:
                    for d in fset.denies:
                        if not d.admits(res, written):
                            if tr is not None:
                                tr.step("forbid", "no-match", d.rule)
                            continue
                        if d.condition is not None:
                            if data is None:
                                data = build_context(cp, op, kind, path, rv, now, context)
                            val, err = d.condition.run(data)
                            if err is None and not val:
                                if tr is not None:
                                    tr.step("forbid", "condition-false", d.rule)
                                continue
                            if err is not None:
                                if tr is not None:
                                    tr.step("forbid", "condition-error", d.rule, err)
                                return _deny(phash, _BLOCKED,
                                             f"forbid rule `{d.label}` could not be evaluated, so "
                                             f"it blocks {_describe(rv, path)}", d.rule, tr)
                        if tr is not None:
                            tr.step("forbid", "match", d.rule, "deny")
                        what = f"forbid rule `{d.label}`" if d.rule else "the deny-list"
                        return _deny(phash, _BLOCKED, f"{what} blocks {_describe(rv, path)}",
                                     d.rule, tr)
            # step 4: network mode
            if cp.network_off and kind in _NET_OPS:
                if tr is not None:
                    tr.step("network", "fail", detail="network is off")
                return _deny(phash, _BLOCKED, "network is off for this profile", None, tr)
            # step 5: the first capability that admits (6: preferring one naming a private address)
            url = rv.url if rv is not None else None
            special = classify(url.ip) if url is not None and url.ip is not None else None
            chosen: CompiledCap | None = None
            unnamed: CompiledCap | None = None
            refused: list[tuple[CompiledCap, str | None]] = _NONE_REFUSED
            env = op.env if kind == "proc.exec" and op.env else None
            env_refused: tuple[str, RuleRef | None] | None = None
            # built-in: git's control files only under a permit naming `.git` (gitfiles.py)
            git_part = gitfiles.git_control_file(path) if kind == "fs.write" and path else None
            caps = cp.caps.get(cap_kind, ())
            index = cp.permit_index.get(cap_kind) if tr is None else None
            if index is not None:  # only permits that can admit res (permit_index.py); untraced
                picks = index.candidates(res)
                if picks is not None:
                    caps = [caps[i] for i in picks]  # type: ignore[assignment]  # iterated once
            for c in caps:
                if not c.test(res):
                    if tr is not None:
                        tr.step("permit", "no-match", c.rule, why_not(c, res))
                    continue
                if git_part is not None and not gitfiles.names_git(c.members):
                    why_git = gitfiles.refusal(path or "", c.members)
                    env_refused = env_refused or (why_git or "", c.rule)
                    if tr is not None:
                        tr.step("permit", "no-match", c.rule, why_git or "")
                    continue
                if env is not None and c.env is not None:
                    why_env = c.env.refusal(env)
                    if why_env is not None:
                        env_refused = env_refused or (why_env, c.rule)
                        if tr is not None:
                            tr.step("permit", "no-match", c.rule, why_env)
                        continue
                if c.condition is not None:
                    if data is None:
                        data = build_context(cp, op, kind, path, rv, now, context)
                    val, err = c.condition.run(data)
                    if err is not None or not val:
                        if refused is _NONE_REFUSED:
                            refused = []
                        refused.append((c, err))
                        if tr is not None:
                            tr.step("permit", "condition-error" if err else "condition-false",
                                    c.rule, err or "")
                        continue
                if special is not None and url is not None and url.ip is not None and \
                        not is_address_allowed(url.host, url.ip, c.hosts):
                    if unnamed is None:
                        unnamed = c
                    if tr is not None:
                        tr.step("address", "fail", c.rule, f"{special} address not named")
                    continue
                if tr is not None:
                    tr.step("permit", "match", c.rule)
                chosen = c
                break
            if chosen is None:
                if unnamed is not None:
                    host = quote(url.host if url else "")
                    return _deny(phash, _BLOCKED, f"{special} address {host} is not named by any "
                                 "rule", unnamed.rule, tr)
                code, reason, rule = diagnose(cp, cap_kind, res, _describe(rv, path), refused, tr,
                                              env_refused, "git" if git_part else "env")
                return _deny(phash, code, reason, rule, tr)
            # step 7: limits
            violation = limit_violation(kind, op, chosen.limits, rv, path)
            if violation is not None:
                # blame the permit rule only when its own limits set the one exceeded
                field, over = violation
                layer = ("tmp.use size" if field == "tmp_max_bytes"
                         else chosen.layers.get(field, "profile"))
                blamed = chosen.rule if layer in ("rule", "tmp.use size") else None
                over = f"{over} (set by {layer})"
                if tr is not None:
                    tr.step("limits", "fail", blamed, over)
                return _deny(phash, _BLOCKED, over, blamed, tr)
            if tr is not None:
                tr.step("limits", "pass", chosen.rule)
            # step 8: consent
            settled = cp.consent_settled
            required = cp.consent_required or (settled is not None and settled[0])
            if required and tr is None and window is not None and cwd is None and \
                    window[0] <= now < window[1] and (path is None or not self.fs_facts):
                # required and current: consent_needed says None
                return _allow(chosen, kind, op, phash)
            if settled is not None and (not required or tr is None and window is not None
                                        and window[0] <= now < window[1]):
                # the verdict was settled at compile time (settle_consent): not required, or
                # required with a current consent (untraced: the trace names the rule)
                if tr is not None:
                    tr.step("consent", "skip", detail="consent not required")
            elif cp.consent_required or self._consent_rules:
                box: list[dict[str, object]] = [] if data is None else [data]

                def ctx() -> dict[str, object]:
                    if not box:
                        box.append(build_context(cp, op, kind, path, rv, now, context))
                    return box[0]

                why = consent_needed(cp, self._consent_rules, ctx, now, tr, self._consent_refs,
                                     self._builtin_ref, window=window)
                if why is not None:
                    return _deny(phash, _PERM, why, chosen.rule, tr)
            elif tr is not None:
                tr.step("consent", "skip", detail="consent not required")
            # step 8b: the facts (fsfacts.py, facts.py): what the fs executor will find at the
            # path, and the cwd of a process; last, so a policy refusal is reported first and
            # only an allow turns into this deny
            if cwd is not None:
                why_cwd = self._cwd_refusal(cp, cwd, tr)
                if why_cwd is not None:
                    return _deny(phash, _BLOCKED, why_cwd, None, tr)
            if path is not None and self.fs_facts:
                if tr is not None and kind != "fs.list":  # a listing reads no facts here
                    tr.step("fact", "pass" if self.facts is not None or seen != ABSENT
                            else "skip", detail=self._fact_note(cp, path, seen))
                found = fs_refusal(kind, op, path, chosen.limits.max_bytes_in, seen)
                if found is not None:
                    field, why = found
                    layer = chosen.layers.get(field, "profile") if field else ""
                    if layer:
                        why = f"{why} (set by {layer})"
                    blamed = chosen.rule if layer == "rule" else None
                    if tr is not None:
                        tr.step("resource", "fail", blamed, why)
                    return _deny(phash, _BLOCKED, why, blamed, tr)
            # step 9
            allow = _allow(chosen, kind, op, phash)
            if tr is None:
                return allow
            tr.step("decision", "allow", chosen.rule)
            return Decision(decision="allow", code=None, http_status=200, reason="",
                            rule=chosen.rule, profile_hash=phash, trace=tr.freeze(),
                            limits=allow.limits, limit_layers=allow.limit_layers)
        except Exception as exc:  # noqa: BLE001 — a guard failure must be a deny, never an allow
            if tr is not None:
                raise  # the traced call answers it, above
            return _failed(profile, exc, None)

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
            if kind in _FS_OPS:
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


def _failed(profile: object, exc: Exception, tr: Tracer | None) -> Decision:
    """The deny for a decision that raised: a resolver's refusal (``PolicyEngineError``) with its
    own code, anything else an internal error (never an allow)."""
    if isinstance(exc, PolicyEngineError):
        if tr is not None:
            tr.step("resolve", "fail", detail=exc.reason)
        return _deny(_hash_of(profile), exc.code, exc.reason, None, tr)
    if tr is not None:
        tr.step("decision", "fail", detail=type(exc).__name__)
    return _deny(_hash_of(profile), ErrorCode.UNKNOWN_INTERNAL, "internal error in the guard",
                 None, tr)


def _allow(chosen: CompiledCap, kind: str, op: Any, phash: str) -> Decision:
    """The prebuilt allow, or a copy whose timeout is the op's own when that is narrower.

    A compilation shared by per-call profiles of one shape carries the first one's hash: the
    answer names this call's profile."""
    allow = chosen.allow
    if allow.profile_hash != phash:
        allow = _restamp(allow, phash)
    if kind == "proc.exec" and op.timeout_ms and allow.limits is not None and \
            op.timeout_ms < (allow.limits.timeout_ms or op.timeout_ms + 1):
        return with_request_timeout(allow, op.timeout_ms)
    return allow


def _describe(rv: Resolved | None, path: str | None) -> str:
    """Public text of the resource; built only for a deny or a trace."""
    return rv.describe() if rv is not None else quote(path or "")


def _hash_of(profile: object) -> str:
    return profile.profile_hash if isinstance(profile, Profile) else ""


def _restamp(allow: Decision, phash: str) -> Decision:
    """``allow`` naming profile ``phash``: a field copy of a model the guard built itself."""
    d = _NEW(Decision)
    fields = d.__dict__
    fields.update(allow.__dict__)
    fields["profile_hash"] = phash
    # shared, as ``_deny`` shares its set: pydantic copies it before changing it (model_copy)
    SET_FIELDS_SET(d, allow.__pydantic_fields_set__)
    SET_EXTRA(d, None)
    SET_PRIVATE(d, None)
    return d


_NEW = Decision.__new__
# ``__dict__`` is filled in place and the slots set with their own setters (model.unchecked):
# ≈ 0.2 µs a decision less than ``object.__setattr__``
_FIELDS_SET = set(Decision.model_fields)
"""Every deny's ``__pydantic_fields_set__``: one set shared by all (never changed in place;
``model_copy`` copies it first), not a copy per decision."""


def _deny(phash: str, code: ErrorCode, reason: str, rule: RuleRef | None,
          tr: Tracer | None) -> Decision:
    """A deny, built as ``Decision.model_construct`` builds it, without its per-field loop.

    Every value is produced by the guard (a registry code and its status, a reason string, the
    rule of a compiled profile), so validation would only re-check our own output;
    ``tests/unit/test_guard_decide.py`` checks the result equals the validated model.
    """
    trace: tuple[TraceStep, ...] | None = None
    if tr is not None:
        tr.step("decision", "deny", rule, reason)
        trace = tr.freeze()
    value, status = _STATUS[code]
    d = _NEW(Decision)
    fields = d.__dict__
    fields["decision"] = "deny"
    fields["code"] = value
    fields["http_status"] = status
    fields["reason"] = reason
    fields["rule"] = rule
    fields["profile_hash"] = phash
    fields["trace"] = trace
    fields["limits"] = None
    fields["limit_layers"] = None
    SET_FIELDS_SET(d, _FIELDS_SET)
    SET_EXTRA(d, None)
    SET_PRIVATE(d, None)
    return d
