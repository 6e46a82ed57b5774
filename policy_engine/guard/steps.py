"""Decision steps 5 (diagnosis of a refusal), 7 (limits) and 8 (consent) of the guard.

Kept out of the hot loop in ``guard.py``: diagnosis runs only on a deny, limits only read the
numbers the op carries, consent only when the profile or the policy asks for it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from policy_engine.errors import ErrorCode
from policy_engine.guard.argv import describe_mismatch
from policy_engine.guard.compiled import CompiledCap, CompiledProfile, EffLimits, GuardCondition
from policy_engine.guard.matchers import Matcher, ProcMatcher
from policy_engine.guard.memo import PROFILE_ONLY
from policy_engine.guard.paths import quote
from policy_engine.guard.resolve import Resolved, decoded_size
from policy_engine.guard.tracer import Tracer
from policy_engine.model import SYSTEM_DEFAULT_LIMITS, Decision, RuleRef
from policy_engine.model.readonly import ReadOnlyDict


def why_not(cap: CompiledCap, res: object) -> str:
    """Which dimension of ``cap`` refuses ``res``, and the value it refuses (trace only)."""
    for m in cap.members:
        if not m.admits(res):
            return m.why_not(res)
    return "not admitted"


def diagnose(
    cp: CompiledProfile, cap_kind: str, res: object, desc: str,
    refused: list[tuple[CompiledCap, str | None]], tr: Tracer | None,
    env_refused: tuple[str, RuleRef | None] | None = None, refused_node: str = "env",
) -> tuple[ErrorCode, str, RuleRef | None]:
    """Name the layer that refused when no capability admits: grant, manifest, the env
    allow-list (or the built-in refusal ``refused_node`` names, with ``env_refused``), a
    permit's condition, else the default deny."""
    if not _any_admits(cp.granted.get(cap_kind, ()), res):
        if tr is not None:
            tr.step("grant", "fail", detail="no granted capability admits it")
        return ErrorCode.PERMISSION_DENY, f"capability not granted: `{cap_kind}` on {desc}", None
    if tr is not None:
        tr.step("grant", "pass")
    declared = cp.declared.get(cap_kind, ())
    if not _any_admits(declared, res):
        if tr is not None:
            tr.step("manifest", "fail", detail="no declared permission admits it")
        if cap_kind == "proc.exec" and isinstance(res, tuple):
            tool, args = res
            for m in declared:
                if isinstance(m, ProcMatcher) and m.tool == tool and m.slots is not None:
                    why = describe_mismatch(m.slots, args)
                    if why is not None:
                        return ErrorCode.DENY_TOOL, why, None
            return ErrorCode.DENY_TOOL, f"tool {quote(str(tool))} is not declared by the " \
                                        "manifest", None
        return ErrorCode.DENY_TOOL, f"access `{cap_kind}` on {desc} is not declared by the " \
                                    "tool manifest", None
    if tr is not None:
        tr.step("manifest", "pass")
    if env_refused is not None:
        if tr is not None:
            tr.step(refused_node, "fail", env_refused[1], env_refused[0])
        return ErrorCode.CAPABILITY_BLOCKED, env_refused[0], env_refused[1]
    if refused:
        cap, err = refused[0]
        rid = cap.rule.id if cap.rule is not None else "?"
        if err is not None:
            return (ErrorCode.PERMISSION_DENY,
                    f"the condition of rule `{rid}` could not be evaluated", cap.rule)
        return ErrorCode.PERMISSION_DENY, f"the condition of rule `{rid}` is false", cap.rule
    if tr is not None:
        tr.step("default-deny", "deny")
    return ErrorCode.PERMISSION_DENY, f"no rule permits `{cap_kind}` on {desc}", None


_ALL_STR = frozenset({str}).issuperset
_REFUSALS_MAX = 1024


def default_refusal(cp: CompiledProfile, cap_kind: str, res: object, url: object,
                    rv: Resolved | None, path: str | None
                    ) -> tuple[ErrorCode, str, RuleRef | None]:
    """:func:`diagnose`'s answer (untraced) when no permit admits ``res`` and none was refused
    by a condition, an allow-list or the git rule: a function of the compilation's caps,
    granted and declared and of the resource, so remembered per compilation and kind
    (``cp.refusals``) by the resource — a path, a size, a URL (by identity: ``parse_url``
    answers one URL with one object, kept alive by the entry) with its method or scopes, a tool
    and its arguments when every one is an exact ``str`` (a subclass could compare equal to
    another resource)."""
    key: object
    if url is not None:
        key = (id(url), res[1])  # type: ignore[index]  # (url, method or scopes)
    elif type(res) is str or type(res) is int:
        key = res
    elif type(res) is tuple and type(res[0]) is str and _ALL_STR(map(type, res[1])):
        key = res  # a proc.exec: (tool, args), the only resource of a str and a tuple
    else:
        return diagnose(cp, cap_kind, res, rv.describe() if rv is not None else
                        quote(path or ""), [], None)
    memo = cp.refusals.get(cap_kind)
    if memo is None:
        memo = cp.refusals.setdefault(cap_kind, {})
    hit = memo.get(key)
    if hit is not None and hit[3] is url:
        return hit[0], hit[1], hit[2]
    code, reason, rule = diagnose(cp, cap_kind, res, rv.describe() if rv is not None else
                                  quote(path or ""), [], None)
    if len(memo) >= _REFUSALS_MAX:
        memo.clear()  # a cache, not a limit: a miss diagnoses again
    memo[key] = (code, reason, rule, url)
    return code, reason, rule


def _any_admits(matchers: tuple[Matcher, ...], res: object) -> bool:
    for m in matchers:  # noqa: SIM110 — a plain loop: cheaper than any() over a generator
        if m.admits(res):
            return True
    return False


Violation = tuple[str, str]  # the limit field exceeded, the public reason


def _over(what: str, field: str, value: int, limit: int | None) -> Violation | None:
    if limit is not None and value > limit:
        return field, f"{what} {value} exceeds the limit {limit}"
    return None


def with_request_timeout(allow: Decision, timeout_ms: int) -> Decision:
    """``allow`` with the op's own (narrower) ``timeout_ms`` as its effective timeout."""
    assert allow.limits is not None  # INVARIANT: callers pass an allow carrying limits
    layers = dict(allow.limit_layers or {})
    layers["timeout_ms"] = "request"
    return allow.model_copy(update={
        "limits": allow.limits.model_copy(update={"timeout_ms": timeout_ms}),
        "limit_layers": ReadOnlyDict(layers)})


def limit_violation(kind: str, op: Any, lim: EffLimits, rv: Resolved | None,
                    path: str | None) -> Violation | None:
    """The first limit the op exceeds (its field and a public reason), or ``None``."""
    check = LIMIT_CHECKS.get(kind)
    return check(op, lim, rv) if check is not None else None


# Each check compares in place and calls ``_over`` only for the reason of a limit exceeded:
# a call less on every decision that passes (measured, benchmarks/bench_guard_ab.py).
def _fs_read(op: Any, lim: EffLimits, rv: Resolved | None) -> Violation | None:
    n, limit = op.len, lim.max_bytes_in
    if n is None or limit is None or n <= limit:
        return None
    return _over("read length", "max_bytes_in", n, limit)


def _fs_write(op: Any, lim: EffLimits, rv: Resolved | None) -> Violation | None:
    n, limit = decoded_size(op.bytes_b64, "content"), lim.max_bytes_out
    return None if limit is None or n <= limit else _over("write size", "max_bytes_out", n,
                                                          limit)


def _fs_list(op: Any, lim: EffLimits, rv: Resolved | None) -> Violation | None:
    return _over("list depth", "max_depth", op.depth, lim.max_depth)


def _net(op: Any, lim: EffLimits, rv: Resolved | None) -> Violation | None:
    n, limit = (rv.size or 0) if rv else 0, lim.max_bytes_out
    return None if limit is None or n <= limit else _over("request body size", "max_bytes_out",
                                                          n, limit)


def _screenshot(op: Any, lim: EffLimits, rv: Resolved | None) -> Violation | None:
    return (_over("screenshot width", "max_screenshot_width", op.width,
                  lim.max_screenshot_width)
            or _over("screenshot height", "max_screenshot_height", op.height,
                     lim.max_screenshot_height))


def _proc(op: Any, lim: EffLimits, rv: Resolved | None) -> Violation | None:
    timeout, limit = op.timeout_ms, lim.timeout_ms
    if timeout and limit is not None and timeout > limit:
        return _over("timeout_ms", "timeout_ms", timeout, limit)
    if not op.stdin_b64:
        return None
    # the proc executors refuse stdin above max_bytes_in (the built-in default when unset)
    bound = lim.max_bytes_in if lim.max_bytes_in is not None else \
        SYSTEM_DEFAULT_LIMITS.max_bytes_in
    return _over("stdin size", "max_bytes_in", decoded_size(op.stdin_b64, "stdin_b64"), bound)


def _tmp(op: Any, lim: EffLimits, rv: Resolved | None) -> Violation | None:
    # temp space is bounded by the tmp.use capability's size, not by bytes_out (that limit is
    # about data leaving the sandbox)
    n, limit = op.size_bytes, lim.tmp_max_bytes
    return None if limit is None or n <= limit else _over("tmp size", "tmp_max_bytes", n, limit)


LIMIT_CHECKS: dict[str, Callable[[Any, EffLimits, Resolved | None], Violation | None]] = {
    "fs.read": _fs_read, "fs.write": _fs_write, "fs.list": _fs_list, "net.http": _net,
    "browser.screenshot": _screenshot, "proc.exec": _proc, "tmp.alloc": _tmp,
}
"""Per op kind, the limits it is checked against (browser.nav carries none)."""


BUILTIN_CONSENT = "the built-in consent rule (High safety, or Write/Process side effects)"


def consent_rules_verdict(
    cp: CompiledProfile, rules: tuple[GuardCondition, ...],
    ctx: Callable[[], Mapping[str, object]], refs: tuple[RuleRef | None, ...] = (),
    builtin: RuleRef | None = None,
) -> tuple[bool, RuleRef | None, str]:
    """Whether consent is required (the profile's flag, else the first conditional rule that
    holds or cannot be evaluated), by which rule, and how the reason names it."""
    by: RuleRef | None = builtin
    label = BUILTIN_CONSENT if builtin is not None else "the profile (`consent_required`)"
    if cp.consent_required:
        return True, by, label
    for i, rule in enumerate(rules):
        needs = rule.needs
        # a condition reading only `profile` sees the guard's own view whatever the caller
        # passed: no need to build the rest of the context (the request's dump) for it
        data = ({"profile": cp.views.get("profile")}
                if needs and needs <= PROFILE_ONLY and "profile" in cp.views else ctx())
        val, err = rule.run(data)
        if err is not None or val:
            by = refs[i] if i < len(refs) else None
            label = f"consent rule `{by.id}`" if by is not None else "a consent rule"
            if err is not None:
                label += " (its condition could not be evaluated)"
            return True, by, label
    return False, by, label


def settle_consent(cp: CompiledProfile, rules: tuple[GuardCondition, ...],
                   refs: tuple[RuleRef | None, ...], builtin: RuleRef | None
                   ) -> tuple[bool, RuleRef | None, str] | None:
    """:func:`consent_rules_verdict` once for a compilation, when no rule reads more than the
    profile (whose view is the same for every call of the compilation); else ``None``."""
    if not all(r.needs and r.needs <= PROFILE_ONLY for r in rules) or \
            (rules and "profile" not in cp.views):
        return None

    def no_context() -> Mapping[str, object]:  # pragma: no cover - profile-only rules
        raise AssertionError("a profile-only consent rule asked for the request")

    return consent_rules_verdict(cp, rules, no_context, refs, builtin)


def consent_needed(
    cp: CompiledProfile, rules: tuple[GuardCondition, ...],
    ctx: Callable[[], Mapping[str, object]], now: int, tr: Tracer | None,
    refs: tuple[RuleRef | None, ...] = (), builtin: RuleRef | None = None, *,
    window: tuple[int, int] | None,
) -> str | None:
    """Why consent blocks the call (``None`` if it does not): required and absent or stale.
    The reason and the trace name the rule that required it.

    :param rules: the conditions of the policy's conditional consent rules.
    :param refs: where each of ``rules`` is written (same order).
    :param builtin: where the built-in rule is (``<builtin>`` unless a policy restates it).
    :param window: the call's consent window (``cp.consent_window``, or the call's own when
        ``cp`` is its shape's compilation: the guard's fast path).

    A consent rule whose condition errors counts as requiring consent (fail closed).
    """
    settled = cp.consent_settled
    if settled is not None:
        required, by, label = settled
    else:
        required, by, label = consent_rules_verdict(cp, rules, ctx, refs, builtin)
    if not required:
        if tr is not None:
            tr.step("consent", "skip", detail="consent not required")
        return None
    if window is None:
        why = f"consent required by {label}"
    elif not window[0] <= now < window[1]:
        why = f"consent required by {label}: the recorded consent is expired or not yet valid"
    else:
        if tr is not None:
            tr.step("consent", "pass", by, f"required by {label}; the recorded consent is "
                                           "current")
        return None
    if tr is not None:
        tr.step("consent", "fail", by, why)
    return why
