"""The guard's decision as a table of named steps (``STEPS``), in the order ``guard.py`` documents.

Each step reads and fills one :class:`Call` and answers a :class:`Decision` (the call is
decided: a refusal, or an early allow) or ``None`` (the next step runs), as OPA's compiler runs
its ``stages`` and Cedar's ``is_authorized`` its core. The traced and the untraced call run the
same steps; a tracer only adds the words.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from policy_engine.errors import ErrorCode, PolicyEngineError
from policy_engine.guard import gitfiles
from policy_engine.guard.chain import Runner, plan
from policy_engine.guard.compiled import CompiledCap, CompiledProfile
from policy_engine.guard.engine_state import ENGINE_STATE_RULE
from policy_engine.guard.fsfacts import fs_refusal
from policy_engine.guard.ipaddr import classify, is_address_allowed
from policy_engine.guard.paths import collapse, normalize_path, path_refusal, quote
from policy_engine.guard.resolve import (
    ABSENT,
    OP_KIND,
    RESOLVERS,
    Facts,
    Resolved,
    build_context,
    coerce_op,
    resolve_normal,
)
from policy_engine.guard.shapes import same_profile
from policy_engine.guard.steps import (
    LIMIT_CHECKS,
    consent_needed,
    default_refusal,
    diagnose,
    why_not,
)
from policy_engine.guard.tracer import Tracer
from policy_engine.guard.verdict import allow as _allow
from policy_engine.guard.verdict import deny as _deny
from policy_engine.guard.verdict import describe as _describe
from policy_engine.guard.verdict import hash_of as _hash_of
from policy_engine.model import Decision, Profile, RuleRef

if TYPE_CHECKING:
    from collections.abc import Mapping

    from policy_engine.guard.guard import Guard
    from policy_engine.guard.urls import ParsedUrl

FS_OPS = frozenset({"fs.read", "fs.write", "fs.list"})
NET_OPS = frozenset({"net.http", "browser.nav", "browser.screenshot"})
_BLOCKED, _PERM = ErrorCode.CAPABILITY_BLOCKED, ErrorCode.PERMISSION_DENY
_NONE_REFUSED: list[tuple[CompiledCap, str | None]] = []  # shared, never appended to
_SEEN_MAX = 1024  # paths a forbid set remembers (``ForbidSet.seen``)


class Call:
    """One decision in progress: its inputs and what the steps have found so far.

    Slots, filled by the step that learns them (``resolve`` sets every resource field), so a
    decision allocates this one object and nothing per step."""

    __slots__ = ("guard", "profile", "op", "context", "now_ms", "tr", "now", "kind",
                 "cap_kind", "phash", "cp", "window", "rv", "path", "seen",
                 "written", "cwd", "res", "data", "chosen", "run")

    # filled by ``Guard.decide`` (guard, profile, op, context, now_ms, tr: no
    # ``__init__``, see there why), then by the steps, in order: kind, cap_kind, phash, cp,
    # window, now, run (kind); rv, path, seen, written, cwd, res
    # (resolve); chosen (permits)
    guard: Guard
    profile: Profile
    op: Any
    context: Mapping[str, object] | None
    now_ms: int | None  # the caller's clock, or None: ``kind`` reads the system's
    tr: Tracer | None
    data: dict[str, object]  # the CEL context, set at its first use (``context_data``)
    now: int
    kind: str
    cap_kind: str
    phash: str
    cp: CompiledProfile
    window: tuple[int, int] | None
    rv: Resolved | None
    path: str | None
    seen: Facts
    written: str | None
    cwd: str | None
    res: object
    chosen: CompiledCap
    run: Runner  # the steps after ``kind`` this call runs (``plan``)

    def context_data(self) -> dict[str, object]:
        """The CEL context, built once, at the first condition that needs it."""
        try:
            return self.data
        except AttributeError:  # unset until the first condition (``Guard.decide``)
            data = self.data = build_context(self.cp, self.op, self.kind, self.path, self.rv,
                                             self.now, self.context)
        return data


Step = Callable[[Call], "Decision | None"]
"""A step: the call's answer (a refusal, or an early allow), or ``None`` for the next step."""


def kind(s: Call) -> Decision | None:
    """0: the op kind maps to a capability kind (a mapping is validated), the profile's
    compilation is found (cached by hash, or the shape's with this call's expiry and consent),
    and the grant has not expired (the expiry is read here, with the compilation: a step of its
    own cost every decision a call, ≈ 1–2 %; benchmarks/bench_guard_ab.py)."""
    # one load a line: a tuple assignment of four or more builds and frees a tuple (measured)
    op = s.op
    profile = s.profile
    guard = s.guard
    tr = s.tr
    k: Any  # a str once looked up (no assert: 2 bytecodes a call)
    try:  # attribute and subscript, no getattr/get call: a try costs nothing until it catches
        k = op.kind
        # a str subclass could hash or compare as a kind it is not: only a plain str is looked up
        cap_kind = OP_KIND[k] if type(k) is str else None
    except (AttributeError, KeyError):  # not an op model (a mapping), or a kind none maps
        cap_kind = None
    if cap_kind is None:
        s.op = op = coerce_op(op)
        k = op.kind
        cap_kind = OP_KIND[k]
    s.kind = k
    s.cap_kind = cap_kind
    s.phash = phash = profile.profile_hash
    key = phash or id(profile)
    cp = guard._cache.get(key)
    # a hash names a compilation only for a profile that holds what it was compiled from
    # (a ``model_copy`` keeping another profile's hash compiles on its own)
    if cp is not None and (cp.profile is profile or (phash and same_profile(cp.profile,
                                                                            profile))):
        expires_at = cp.expires_at
        s.window = cp.consent_window
    else:
        # a new call of a cached shape (untraced): decided on the shape's compilation with this
        # call's expiry, consent window and hash, as ``shapes.derive`` sets them
        base = guard._shapes.base_for(profile) if tr is None else None
        if base is not None:
            cp = base
            consent = profile.consent
            expires_at = profile.expires_at
            s.window = None if consent is None else (consent.granted_at, consent.expires_at)
        else:
            cp = guard._compile_into_cache(profile, key)
            expires_at = cp.expires_at
            s.window = cp.consent_window
    s.cp = cp
    now_ms = s.now_ms
    s.now = now = time.time_ns() // 1_000_000 if now_ms is None else now_ms
    if tr is not None:
        tr.step("kind", "pass", detail=f"{k} needs {cap_kind}")
        if expires_at <= now:
            tr.step("expiry", "fail", detail="grant expired")
            return _deny(phash, _PERM, "grant expired", None, tr)
        s.run = plan(cp, k, guard.fs_facts, True)
        return None
    if expires_at <= now:
        return _deny(phash, _PERM, "grant expired", None, None)
    try:
        s.run = cp.plans[guard.fs_facts][k]
    except KeyError:  # the first call of this kind under this compilation
        s.run = cp.plans[guard.fs_facts].setdefault(k, plan(cp, k, guard.fs_facts, False))
    return None


def resolve(s: Call) -> Decision | None:
    """2: the resource, resolved: the path beneath the root (an fs.write inside the fs root or
    the tmp dir), the URL parsed, the argv's shape; a proc.exec's cwd normalized for ``facts``.
    A resolver's refusal raises ``PolicyEngineError`` (the caller's failure deny)."""
    kind, op, guard = s.kind, s.op, s.guard
    if kind in FS_OPS:
        s.rv = s.cwd = None
        cp = s.cp
        if guard.facts is None:
            raw = op.path
            # ``normalize_path``'s fast path spelt out (its first line; a test keeps the two
            # equal): most op paths are already normal, and this runs on every fs decision
            if type(raw) is str and raw[:1] == "/" and "//" not in raw and "\x00" not in raw and \
                    ("/." not in raw or ("/./" not in raw and "/../" not in raw and
                                         raw[-2:] != "/." and raw[-3:] != "/..")) and \
                    (raw[-1] != "/" or len(raw) == 1):
                path = raw
            elif (why := path_refusal(raw)) is None:
                path = collapse(raw)  # ``normalize_path`` less its checks, just made
            elif s.tr is None:
                # the refusal ``normalize_path`` raises, answered without raising (an exception
                # through the chain and ``decide`` costs ≈ 3 µs); traced, it raises as before
                return _deny(_hash_of(s.profile), _BLOCKED, why, None, None)
            else:
                path = normalize_path(raw)  # raises ``why``
            path, s.seen, inside, s.written = resolve_normal(
                cp, path, guard.resolve_symlinks, guard.fs_facts and kind != "fs.list")
        else:  # declared or unknown facts, never this host's disk (guard/facts.py)
            path, s.seen, inside, s.written = guard.facts.resolve(cp.root_fs, cp.tmp_dir,
                                                                  op.path)
        s.path = s.res = path
        state = guard.engine_state
        if state is not None:
            hit = path if state.covers(path) else \
                s.written if s.written is not None and state.covers(s.written) else None
            if hit is not None:
                return _engine_state(s, state.reason("path", hit))
            # the engine's other trees (its cache; for a write, what it or a login runs)
            write = kind == "fs.write"
            for spelt in (path, s.written):
                if spelt is not None and (tree := state.tree(spelt, write=write)):
                    return _engine_state(s, state.tree_reason("path", spelt, tree, write=write))
        if kind == "fs.write" and not inside:
            return _deny(s.phash, _BLOCKED,
                         f"write to {quote(path)} is outside the fs root and the tmp dir",
                         None, s.tr)
    else:
        s.path = s.written = s.seen = None
        try:
            s.rv = rv = RESOLVERS[kind](op)  # every other kind OP_KIND maps (resolve_other)
        except PolicyEngineError as exc:  # a malformed or refused URL, argv, header…
            if s.tr is not None:
                raise  # traced: ``decide`` answers it with the trace's words (``failed``)
            # the deny ``failed`` answers, without unwinding the chain and ``decide`` (≈ 1 µs)
            return _deny(_hash_of(s.profile), exc.code, exc.reason, None, None)
        s.res = rv.res
        # a proc.exec's cwd, judged after the policy (step ``facts``)
        s.cwd = cwd = normalize_path(op.cwd) if kind == "proc.exec" and op.cwd is not None \
            else None
        state = guard.engine_state
        if state is not None:
            if cwd is not None and (state.covers(cwd) or guard.facts is None and
                                    state.covers(os.path.realpath(cwd))):
                return _engine_state(s, state.reason("cwd", cwd))
            if kind == "tmp.alloc":
                tmp = s.cp.tmp_dir  # its real path too, unless the facts are declared
                spellings = (tmp,) if guard.facts is not None else (tmp, os.path.realpath(tmp))
                if any(state.covers(p) for p in spellings):
                    return _engine_state(s, state.reason("tmp dir", tmp))
                tree = next((t for p in spellings if (t := state.tree(p, write=True))), None)
                if tree is not None:
                    return _engine_state(s, state.tree_reason("tmp dir", tmp, tree, write=True))
    if s.tr is not None:
        s.tr.step("resolve", "pass", detail=_describe(s.rv, s.path))
    return None


def _engine_state(s: Call, reason: str) -> Decision:
    """The refusal of a path in the engine's state directory or its other trees
    (``engine_state.py``): a mandatory deny, answered as the mandatory forbids answer
    (``CAPABILITY_BLOCKED``)."""
    if s.tr is not None:
        s.tr.step("resolve", "pass", detail=_describe(s.rv, s.path))
        s.tr.step("forbid", "match", ENGINE_STATE_RULE, reason)
    return _deny(s.phash, _BLOCKED, reason, ENGINE_STATE_RULE, s.tr)


def forbids(s: Call) -> Decision | None:
    """3: forbids, deny-overrides: a matching forbid whose condition holds or fails blocks.

    Forbids see the resolved path and ``written``, the path as the op spelt it when resolving
    its links changed it (a forbid on `/ws/cur/private/**` covers that spelling). With a tracer,
    URL and tool forbids are scanned one by one so the trace names each."""
    fset = s.cp.forbids.get(s.cap_kind)
    if fset is None:
        return None
    res, written, tr = s.res, s.written, s.tr
    screen = fset.screen  # side-effect free: asked first, whether or not the trace may use it
    if screen is not None and not screen(res) and (written is None or not screen(written)) \
            and (tr is None or fset.by_globs):
        if tr is not None:
            tr.step("forbid", "no-match", detail="no forbid glob matches")
        return None
    # a set without conditions answers a path as it did before (``ForbidSet.seen``, untraced,
    # the path as resolved and as written the same)
    seen = fset.seen if tr is None and written is None and type(res) is str else None
    if seen is not None:
        hit = seen.get(res)
        if hit is not None:
            return _deny(s.phash, _BLOCKED, hit[0], hit[1], None) if hit else None
        if len(seen) >= _SEEN_MAX:
            seen.clear()  # a cache, not a limit: a miss scans the forbids again
    for d in fset.denies:
        if not d.admits(res, written):
            if tr is not None:
                tr.step("forbid", "no-match", d.rule)
            continue
        if d.condition is not None:
            val, err = d.condition.run(s.context_data())
            if err is None and not val:
                if tr is not None:
                    tr.step("forbid", "condition-false", d.rule)
                continue
            if err is not None:
                if tr is not None:
                    tr.step("forbid", "condition-error", d.rule, err)
                return _deny(s.phash, _BLOCKED,
                             f"forbid rule `{d.label}` could not be evaluated, so it blocks "
                             f"{_describe(s.rv, s.path)}", d.rule, tr)
        if tr is not None:
            tr.step("forbid", "match", d.rule, "deny")
        what = f"forbid rule `{d.label}`" if d.rule else "the deny-list"
        reason = f"{what} blocks {_describe(s.rv, s.path)}"
        if seen is not None:
            seen[res] = (reason, d.rule)
        return _deny(s.phash, _BLOCKED, reason, d.rule, tr)
    if seen is not None:
        seen[res] = ()
    return None


def network(s: Call) -> Decision | None:
    """4: the network is not off for a net.http or browser op."""
    if s.cp.network_off and s.kind in NET_OPS:
        if s.tr is not None:
            s.tr.step("network", "fail", detail="network is off")
        return _deny(s.phash, _BLOCKED, "network is off for this profile", None, s.tr)
    return None


def permits(s: Call) -> Decision | None:
    """5–6: the first capability whose members admit, whose env allow-list and condition hold,
    preferring one that names a private address the URL is; else the layer that refused."""
    kind, cp, tr = s.kind, s.cp, s.tr
    res, path, rv = s.res, s.path, s.rv
    # what only some kinds carry: the URL's address class, a process's env, an fs.write's git
    # control file (built-in: only under a permit naming `.git`, gitfiles.py)
    url: ParsedUrl | None
    special: str | None
    env: Mapping[str, str] | None
    git_part: str | None
    if rv is not None:
        url = rv.url
        special = env = git_part = None  # one constant load for the three (chained)
        if url is not None and url.ip is not None:
            special = classify(url.ip)
        elif kind == "proc.exec":
            env = s.op.env or None
    else:
        url = special = env = None
        git_part = gitfiles.git_control_file(path) if kind == "fs.write" and path else None
    unnamed: CompiledCap | None
    env_refused: tuple[str, RuleRef | None] | None
    unnamed = env_refused = None
    refused: list[tuple[CompiledCap, str | None]] = _NONE_REFUSED
    cap_kind = s.cap_kind
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
            val, err = c.condition.run(s.context_data())
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
        s.chosen = c
        return None
    if unnamed is not None:
        host = quote(url.host if url else "")
        return _deny(s.phash, _BLOCKED, f"{special} address {host} is not named by any rule",
                     unnamed.rule, tr)
    if tr is None and refused is _NONE_REFUSED and env_refused is None:
        code, reason, rule = default_refusal(cp, cap_kind, res, url, rv, path)
    else:
        code, reason, rule = diagnose(cp, cap_kind, res, _describe(rv, path), refused, tr,
                                      env_refused, "git" if git_part else "env")
    return _deny(s.phash, code, reason, rule, tr)


def limits(s: Call) -> Decision | None:
    """7: the limits of the chosen capability met with the profile's; the permit rule is blamed
    only when its own limits set the one exceeded."""
    chosen, tr = s.chosen, s.tr
    check = LIMIT_CHECKS.get(s.kind)  # ``steps.limit_violation``, a call less a decision
    violation = check(s.op, chosen.limits, s.rv) if check is not None else None
    if violation is not None:
        field, over = violation
        layer = ("tmp.use size" if field == "tmp_max_bytes"
                 else chosen.layers.get(field, "profile"))
        blamed = chosen.rule if layer in ("rule", "tmp.use size") else None
        over = f"{over} (set by {layer})"
        if tr is not None:
            tr.step("limits", "fail", blamed, over)
        return _deny(s.phash, _BLOCKED, over, blamed, tr)
    if tr is not None:
        tr.step("limits", "pass", chosen.rule)
    return None


def consent(s: Call) -> Decision | None:
    """8: consent, when the profile or a consent rule requires it, recorded and current."""
    cp, tr = s.cp, s.tr
    window, now = s.window, s.now
    settled = cp.consent_settled
    required = cp.consent_required or (settled is not None and settled[0])
    if required and tr is None and window is not None and s.cwd is None and \
            window[0] <= now < window[1] and (s.path is None or not s.guard.fs_facts):
        # required and current, and no facts to read: the allow, without the last two steps
        # (as ``allow`` answers it: the prebuilt allow without ``verdict.allow``'s frame)
        answer = s.chosen.allow
        if answer.profile_hash == s.phash and (s.kind != "proc.exec" or not s.op.timeout_ms):
            return answer
        return _allow(s.chosen, s.kind, s.op, s.phash)
    if settled is not None and (not required or tr is None and window is not None
                                and window[0] <= now < window[1]):
        # the verdict was settled at compile time (settle_consent): not required, or required
        # with a current consent (untraced: the trace names the rule)
        if tr is not None:
            tr.step("consent", "skip", detail="consent not required")
        return None
    guard = s.guard
    if cp.consent_required or guard._consent_rules:
        why = consent_needed(cp, guard._consent_rules, s.context_data, now, tr,
                             guard._consent_refs, guard._builtin_ref, window=window)
        if why is not None:
            return _deny(s.phash, _PERM, why, s.chosen.rule, tr)
    elif tr is not None:
        tr.step("consent", "skip", detail="consent not required")
    return None


def facts(s: Call) -> Decision | None:
    """8b: the facts (fsfacts.py, facts.py): what the fs executor will find at the path, and
    the cwd of a process; last, so a policy refusal is reported first and only an allow turns
    into this deny."""
    guard, tr = s.guard, s.tr
    if s.cwd is not None:
        why_cwd = guard._cwd_refusal(s.cp, s.cwd, tr)
        if why_cwd is not None:
            return _deny(s.phash, _BLOCKED, why_cwd, None, tr)
    path = s.path
    if path is not None and guard.fs_facts:
        kind, chosen, seen = s.kind, s.chosen, s.seen
        if tr is not None and kind != "fs.list":  # a listing reads no facts here
            tr.step("fact", "pass" if guard.facts is not None or seen != ABSENT else "skip",
                    detail=guard._fact_note(s.cp, path, seen))
        found = fs_refusal(kind, s.op, path, chosen.limits.max_bytes_in, seen)
        if found is not None:
            field, why = found
            layer = chosen.layers.get(field, "profile") if field else ""
            if layer:
                why = f"{why} (set by {layer})"
            blamed = chosen.rule if layer == "rule" else None
            if tr is not None:
                tr.step("resource", "fail", blamed, why)
            return _deny(s.phash, _BLOCKED, why, blamed, tr)
    return None


def allow(s: Call) -> Decision:
    """9: allow, with the chosen capability's limits (the op's narrower timeout)."""
    chosen, tr = s.chosen, s.tr
    answer = chosen.allow
    if tr is None and answer.profile_hash == s.phash and (s.kind != "proc.exec" or
                                                          not s.op.timeout_ms):
        # ``verdict.allow`` without its frame: the prebuilt allow is this call's answer (its
        # profile's, and no narrower timeout asked by a proc.exec)
        return answer
    answer = _allow(chosen, s.kind, s.op, s.phash)
    if tr is None:
        return answer
    tr.step("decision", "allow", chosen.rule)
    return Decision(decision="allow", code=None, http_status=200, reason="", rule=chosen.rule,
                    profile_hash=s.phash, trace=tr.freeze(), limits=answer.limits,
                    limit_layers=answer.limit_layers)


STEPS: tuple[Step, ...] = (kind, resolve, forbids, network, permits, limits, consent, facts,
                           allow)
"""The decision order; ``guard.py``'s docstring lists the same names (a test keeps them equal).
The last step always answers."""

