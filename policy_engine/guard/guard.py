"""The guard: decides one concrete operation under one profile, on resolved values, fast.

Decision order (each step's code is pinned by ``tests/unit/test_guard_decide.py``):

0. the op kind maps to a capability kind; malformed input → ``SCHEMA.VALIDATION_FAILED``
1. grant expiry: ``profile.expires_at <= now`` → ``SANDBOX.PERMISSION_DENY``
2. resolve the resource: path normalized and symlinks resolved beneath the root, fs.write
   bound to the fs root or tmp dir, URL parsed, argv shape → ``CAPABILITY_BLOCKED`` /
   ``SCHEMA.VALIDATION_FAILED`` / ``POLICY.DENY_TOOL``
3. forbids, deny-overrides, mandatory first: resource matches and condition true (or errors)
   → ``SANDBOX.CAPABILITY_BLOCKED`` naming the rule
4. network off for net.http / browser → ``CAPABILITY_BLOCKED``
5. the first profile capability whose ``all_of`` members all admit and whose condition holds;
   if none: not granted → ``PERMISSION_DENY``; not declared → ``POLICY.DENY_TOOL``; a permit
   whose condition was false or failed → ``PERMISSION_DENY`` naming it; else default deny
6. a private, loopback, link-local or metadata IP literal not named by the capability's hosts
   → ``CAPABILITY_BLOCKED``
7. limits of the matched capability met with the profile's → ``CAPABILITY_BLOCKED``
8. consent required and missing or not current → ``PERMISSION_DENY``
9. allow
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from policy_engine.errors import REGISTRY, ErrorCode, PolicyEngineError
from policy_engine.graph import PolicySet
from policy_engine.guard.compiled import (
    CompiledCap,
    CompiledProfile,
    ConditionIndex,
    compile_profile,
)
from policy_engine.guard.ipaddr import classify, is_address_allowed
from policy_engine.guard.paths import is_beneath, quote
from policy_engine.guard.resolve import (
    OP_KIND,
    Resolved,
    build_context,
    coerce_op,
    resolve_other,
    resolve_path,
)
from policy_engine.guard.steps import consent_needed, diagnose, limit_violation
from policy_engine.guard.tracer import Tracer
from policy_engine.model import Decision, Profile, RuleRef

_FS_OPS = frozenset({"fs.read", "fs.write", "fs.list"})
_NET_OPS = frozenset({"net.http", "browser.nav", "browser.screenshot"})


class _Deny(Exception):
    """Internal: a refusal with the rule that decided it (PolicyEngineError has no rule)."""

    def __init__(self, code: ErrorCode, reason: str, rule: RuleRef | None = None) -> None:
        super().__init__(reason)
        self.code, self.reason, self.rule = code, reason, rule


class Guard:
    """Decides operations; compiles each profile once and caches it by ``profile_hash``.

    :param policyset: where the CEL conditions of profile rules and the consent rules come from.
    :param resolve_symlinks: resolve fs paths with ``lstat``/``readlink`` beneath the root (one
        syscall per existing component). Turn off only where the executor enforces resolution
        itself (``openat2`` with ``RESOLVE_BENEATH``).
    :param cache_size: compiled profiles kept; the oldest is dropped first.
    """

    def __init__(self, policyset: PolicySet | None = None, *, resolve_symlinks: bool = True,
                 cache_size: int = 1024) -> None:
        self.policyset = policyset
        self.resolve_symlinks = resolve_symlinks
        self._conditions = ConditionIndex(policyset)
        rules = policyset.consent_rules if policyset is not None else ()
        self._builtin_consent = any(r.condition is None for r in rules)
        self._consent_rules = tuple(r for r in rules if r.condition is not None)
        self._cache: dict[object, CompiledProfile] = {}
        self._cache_size = cache_size

    def compiled(self, profile: Profile) -> CompiledProfile:
        """The compiled form of ``profile`` (cached; unhashed profiles are keyed by identity)."""
        key: object = profile.profile_hash or id(profile)
        cp = self._cache.get(key)
        if cp is not None and (profile.profile_hash or cp.profile is profile):
            return cp
        cp = compile_profile(profile, self._conditions, builtin_consent=self._builtin_consent)
        if len(self._cache) >= self._cache_size:
            del self._cache[next(iter(self._cache))]
        self._cache[key] = cp
        return cp

    def decide(self, profile: Profile, op: Any, *, context: Mapping[str, object] | None = None,
               now_ms: int | None = None, trace: bool = False) -> Decision:
        """Decide ``op`` under ``profile``; never raises for bad input (it is a deny)."""
        tr = Tracer() if trace else None
        try:
            return self._decide(profile, op, context, now_ms, tr)
        except _Deny as d:
            return _deny(profile, d.code, d.reason, d.rule, tr)
        except PolicyEngineError as exc:
            if tr is not None:
                tr.step("resolve", "fail", detail=exc.reason)
            return _deny(profile, exc.code, exc.reason, None, tr)
        except Exception as exc:  # noqa: BLE001 — a guard failure must be a deny, never an allow
            if tr is not None:
                tr.step("decision", "fail", detail=type(exc).__name__)
            return _deny(profile, ErrorCode.UNKNOWN_INTERNAL, "internal error in the guard", None,
                         tr)

    # ------------------------------------------------------------------------------------------

    def _decide(self, profile: Profile, op: Any, extra: Mapping[str, object] | None,
                now_ms: int | None, tr: Tracer | None) -> Decision:
        raw_kind = getattr(op, "kind", None)
        if not isinstance(raw_kind, str) or raw_kind not in OP_KIND:  # step 0
            op = coerce_op(op)
        kind: str = op.kind
        cap_kind = OP_KIND[kind]
        cp = self.compiled(profile)
        if tr is not None:
            tr.step("kind", "pass", detail=f"{kind} needs {cap_kind}")
        now = time.time_ns() // 1_000_000 if now_ms is None else now_ms
        if cp.expires_at <= now:  # step 1
            if tr is not None:
                tr.step("expiry", "fail", detail="grant expired")
            raise _Deny(ErrorCode.PERMISSION_DENY, "grant expired")
        # step 2
        rv: Resolved | None = None
        path: str | None = None
        if kind in _FS_OPS:
            path = resolve_path(cp, op.path, self.resolve_symlinks)
            res: object = path
            if kind == "fs.write" and not (is_beneath(cp.root_fs, path)
                                           or is_beneath(cp.tmp_dir, path)):
                raise _Deny(ErrorCode.CAPABILITY_BLOCKED,
                            f"write to {quote(path)} is outside the fs root and the tmp dir")
        else:
            rv = resolve_other(kind, op)
            res = rv.res

        def describe() -> str:  # public text of the resource, built only for a deny or a trace
            return rv.desc if rv is not None else quote(path or "")

        if tr is not None:
            tr.step("resolve", "pass", detail=describe())
        ctx_box: list[dict[str, object]] = []

        def ctx() -> dict[str, object]:
            if not ctx_box:
                ctx_box.append(build_context(cp, op, kind, path, rv, now, extra))
            return ctx_box[0]

        # step 3: forbids
        fset = cp.forbids.get(cap_kind)
        if fset is not None:
            if fset.prefilter is not None and path is not None and \
                    fset.prefilter.match(path) is None:
                if tr is not None:
                    tr.step("forbid", "no-match", detail="no forbid glob matches")
            else:
                for d in fset.denies:
                    if not d.matcher.admits(res):
                        if tr is not None:
                            tr.step("forbid", "no-match", d.rule)
                        continue
                    if d.condition is not None:
                        val, err = d.condition.evaluate(ctx())
                        if err is None and not val:
                            if tr is not None:
                                tr.step("forbid", "condition-false", d.rule)
                            continue
                        if err is not None:
                            if tr is not None:
                                tr.step("forbid", "condition-error", d.rule, err)
                            raise _Deny(ErrorCode.CAPABILITY_BLOCKED,
                                        f"forbid rule `{d.label}` could not be evaluated, so it "
                                        f"blocks {describe()}", d.rule)
                    if tr is not None:
                        tr.step("forbid", "match", d.rule, "deny")
                    what = f"forbid rule `{d.label}`" if d.rule else "the deny-list"
                    raise _Deny(ErrorCode.CAPABILITY_BLOCKED, f"{what} blocks {describe()}", d.rule)
        # step 4: network mode
        if cp.network_off and kind in _NET_OPS:
            if tr is not None:
                tr.step("network", "fail", detail="network is off")
            raise _Deny(ErrorCode.CAPABILITY_BLOCKED, "network is off for this profile")
        # step 5: the first capability that admits (6: preferring one naming a private address)
        url = rv.url if rv is not None else None
        special = classify(url.ip) if url is not None and url.ip is not None else None
        chosen: CompiledCap | None = None
        unnamed: CompiledCap | None = None
        refused: list[tuple[CompiledCap, str | None]] = []
        for c in cp.caps.get(cap_kind, ()):
            fast = c.admit_path
            ok = fast(res) is not None if fast is not None else c.admits(res)
            if not ok:
                if tr is not None:
                    tr.step("permit", "no-match", c.rule)
                continue
            if c.condition is not None:
                val, err = c.condition.evaluate(ctx())
                if err is not None or not val:
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
                raise _Deny(ErrorCode.CAPABILITY_BLOCKED,
                            f"{special} address {quote(url.host if url else '')} is not named "
                            "by any rule", unnamed.rule)
            code, reason, rule = diagnose(cp, cap_kind, res, describe(), refused, tr)
            raise _Deny(code, reason, rule)
        # step 7: limits
        violation = limit_violation(kind, op, chosen.limits, rv, path)
        if violation is not None:
            if tr is not None:
                tr.step("limits", "fail", chosen.rule, violation)
            raise _Deny(ErrorCode.CAPABILITY_BLOCKED, violation, chosen.rule)
        if tr is not None:
            tr.step("limits", "pass", chosen.rule)
        # step 8: consent
        if cp.consent_required or self._consent_rules:
            why = consent_needed(cp, self._consent_rules, ctx, now, tr)
            if why is not None:
                raise _Deny(ErrorCode.PERMISSION_DENY, why, chosen.rule)
        elif tr is not None:
            tr.step("consent", "skip", detail="consent not required")
        # step 9
        if tr is None:
            return chosen.allow
        tr.step("decision", "allow", chosen.rule)
        return Decision(decision="allow", code=None, http_status=200, reason="",
                        rule=chosen.rule, profile_hash=cp.profile_hash, trace=tr.freeze())


def _deny(profile: Profile, code: ErrorCode, reason: str, rule: RuleRef | None,
          tr: Tracer | None) -> Decision:
    if tr is not None:
        tr.step("decision", "deny", rule, reason)
    phash = profile.profile_hash if isinstance(profile, Profile) else ""
    return Decision(decision="deny", code=code.value, http_status=REGISTRY[code].http_status,
                    reason=reason, rule=rule, profile_hash=phash,
                    trace=tr.freeze() if tr is not None else None)

