"""A Profile compiled once for the guard: per-kind tuples of matchers, forbid prefilters, limits.

Compiling moves every pydantic access, glob compilation and condition lookup off the hot path;
the guard caches the result by ``profile_hash`` (see ``policy_engine.guard.guard``).
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from dataclasses import field as dc_field
from typing import Any

from policy_engine.errors import PolicyEngineError
from policy_engine.graph import CompiledCondition, PolicySet
from policy_engine.guard.env import EnvAllow, env_allow
from policy_engine.guard.globset import shared_globset
from policy_engine.guard.matchers import (
    FsMatcher,
    HostSet,
    KindMatcher,
    Matcher,
    NeverMatcher,
    ProcMatcher,
    UrlMatcher,
    compile_matcher,
    host_patterns,
)
from policy_engine.guard.memo import PROFILE_ONLY, profile_only
from policy_engine.guard.nofollow import real_path
from policy_engine.guard.paths import normalize_path
from policy_engine.guard.permit_index import PermitIndex, permit_index
from policy_engine.guard.viewfields import named_variables, trim_views
from policy_engine.model import (
    LIMIT_FIELDS,
    SYSTEM_DEFAULT_LIMITS,
    ArgAlternative,
    BrowserCapability,
    Decision,
    FsCapability,
    Limits,
    NetHttpCapability,
    ProcCapability,
    Profile,
    RuleRef,
)
from policy_engine.model.readonly import ReadOnlyDict
from policy_engine.patterns import HostPattern
from policy_engine.patterns.paths import expand_home, resolved_form

FS_KINDS = ("fs.read", "fs.write", "fs.list")


class MissingCondition:
    """Stands in for a condition the guard cannot evaluate: it always errors, so never allows."""

    __slots__ = ("source",)

    def __init__(self, source: str) -> None:
        self.source = source

    def evaluate(self, context: Mapping[str, object]) -> tuple[bool, str | None]:
        return False, "the condition is not compiled (no policy set holds it)"


Condition = CompiledCondition | MissingCondition
Outcome = tuple[bool, str | None]

CONTEXT_VARIABLES: frozenset[str] = frozenset(
    {"request", "grant", "manifest", "profile", "tenant", "subject", "now"})
"""What a condition may read (``policy_engine.dsl.cel.CONTEXT_VARIABLES``)."""
STATIC_VIEWS: tuple[str, ...] = ("profile", "grant", "manifest", "tenant", "subject")
"""The context variables built once per compiled profile (``request`` and ``now`` are per call)."""


@dataclass(frozen=True, slots=True)
class GuardCondition:
    """A condition as the guard runs it.

    :attr run: evaluates a context built by ``resolve.build_context``. A CEL condition reads it
        as it is (``evaluate_plain``: the values are already plain); any other implementation
        gets private copies of the per-profile views, so it cannot change them for later calls.
    :attr needs: the context variables it reads; ``None`` means all, and the caller's own keys.
    """

    condition: Condition
    run: Callable[[Mapping[str, object]], Outcome]
    needs: frozenset[str] | None


def guard_condition(cond: Condition) -> GuardCondition:
    plain = getattr(cond, "evaluate_plain", None)
    needs = getattr(cond, "variables", None)
    if plain is not None and isinstance(needs, frozenset):
        # `variables` names every variable occurring in the text, `subject` in `subject_id`
        # too; only one named as a whole word can be read (CEL reaches a variable by its name)
        needs = named_variables(getattr(cond, "source", None), needs)
        if needs and needs <= PROFILE_ONLY:  # its outcome is fixed per profile view
            return GuardCondition(cond, profile_only(plain), needs)
        return GuardCondition(cond, plain, needs)

    def run(ctx: Mapping[str, object]) -> Outcome:
        return cond.evaluate({k: copy.deepcopy(v) if k in STATIC_VIEWS else v
                              for k, v in ctx.items()})

    return GuardCondition(cond, run, None)


@dataclass(frozen=True, slots=True)
class EffLimits:
    """The limits a decision checks: the capability's effective limits (``effective_limits``)."""

    max_bytes_in: int | None
    max_bytes_out: int | None
    max_depth: int | None
    max_files: int | None
    timeout_ms: int | None
    max_screenshot_width: int | None
    max_screenshot_height: int | None
    tmp_max_bytes: int | None


@dataclass(frozen=True, slots=True)
class CompiledCap:
    """One profile capability: all members must admit (``all_of``); ``admit`` is the fast test."""

    kind: str
    members: tuple[Matcher, ...]
    test: Callable[[Any], object]  # true when admitted: ``admits``, a member's own, ``type``
    rule: RuleRef | None
    condition: GuardCondition | None
    limits: EffLimits
    layers: Mapping[str, str]  # per limit field, the layer that set it (LIMIT_LAYERS)
    hosts: tuple[HostPattern, ...]
    env: EnvAllow | None  # proc.exec only: which variables a call may set
    allow: Decision  # prebuilt: an allow without trace is the same immutable answer every time

    def admits(self, res: object) -> bool:
        return all(m.admits(res) for m in self.members)


@dataclass(frozen=True, slots=True)
class CompiledDeny:
    matcher: Matcher
    rule: RuleRef | None
    condition: GuardCondition | None
    mandatory: bool
    label: str  # what the public reason calls it when there is no rule id

    def admits(self, res: Any, written: str | None) -> bool:
        """Whether this forbid covers ``res`` (the resolved resource) or ``written`` (the path
        as the op spelt it, when resolving its links changed it: a forbid spelt through a link
        covers that spelling whatever the link points at now; outsider round 11, F4)."""
        return self.matcher.admits(res) or (written is not None and self.matcher.admits(written))


@dataclass(frozen=True, slots=True)
class ForbidSet:
    """The forbids of one kind. ``screen`` is false only when no forbid can admit the resource
    (the union of their globs, hosts or tools), so a miss costs one test and only a possible hit
    scans the forbids in order; ``None`` when the kind has no such union (scan them all)."""

    screen: Callable[[Any], bool] | None
    denies: tuple[CompiledDeny, ...]
    by_globs: bool = False  # the screen is the fs glob union (traced as one step, as it was)
    # per path, what the untraced scan answered (the refusal's reason and rule, or ``()``: no
    # forbid covers it), when no forbid of the set has a condition: then it is a function of
    # the path alone (``stages.forbids``); filled at first use, bounded
    seen: dict[Any, tuple[Any, ...]] | None = dc_field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        if all(d.condition is None for d in self.denies):
            object.__setattr__(self, "seen", {})


@dataclass(frozen=True, slots=True)
class CompiledProfile:
    profile: Profile  # INVARIANT: kept alive so an id()-keyed cache entry cannot be reused
    profile_hash: str
    expires_at: int
    network_off: bool
    consent_required: bool
    consent_window: tuple[int, int] | None
    root_fs: str
    tmp_dir: str
    caps: Mapping[str, tuple[CompiledCap, ...]]
    forbids: Mapping[str, ForbidSet]
    granted: Mapping[str, tuple[Matcher, ...]]
    declared: Mapping[str, tuple[Matcher, ...]]
    views: Mapping[str, object]  # the STATIC_VIEWS, plain JSON-like values (see static_views)
    needs: frozenset[str] | None  # variables any condition here reads; None: all and extra keys
    # the views the context holds when the caller gives none (``view_items``), built once
    context_views: tuple[tuple[str, object], ...] = ()
    # per kind with many permits, the untraced scan's candidates (``permit_index``)
    permit_index: Mapping[str, PermitIndex] = dc_field(default_factory=dict)
    # when every conditional consent rule reads the profile alone, their verdict, settled once
    # per compilation: (required, the rule that requires it, its label); None: decided per call
    consent_settled: tuple[bool, RuleRef | None, str] | None = None
    # per ``fs_facts`` (False, True) and op kind, the steps an untraced call runs after
    # ``kind`` (``chain.plan``), filled at first use; shared by the per-call copies of a shape
    plans: tuple[dict[str, Any], dict[str, Any]] = dc_field(
        default_factory=lambda: ({}, {}), init=False, compare=False, repr=False)
    # per capability kind, the default refusals ``stages.permits`` diagnosed (no permit admits
    # the resource, none refused by a condition or an allow-list): a function of the caps, the
    # granted and the declared alone, so shared by the per-call copies of a shape too
    refusals: dict[str, dict[Any, tuple[Any, ...]]] = dc_field(
        default_factory=dict, init=False, compare=False, repr=False)


def _min(*values: int | None) -> int | None:
    present = [v for v in values if v is not None]
    return min(present) if present else None


def effective_limits(own: Limits | None, own_layers: Mapping[str, str] | None,
                     profile: Profile) -> tuple[Limits, dict[str, str]]:
    """The limits a call permitted by a capability runs under, every field set, and per field
    the layer that set it.

    ``own`` (the rule's limits, already resolved against every layer by the profile builder)
    wins where set; the profile's fill the rest; a hand-built profile missing a field gets the
    built-in default. ``profile.timeout_ms`` bounds a timeout the rule does not set (it is the
    same value on a built profile; a rule's own may replace a built-in one above it).
    """
    values: dict[str, int | float] = {}
    layers: dict[str, str] = {}
    for field in LIMIT_FIELDS:
        value = getattr(own, field) if own is not None else None
        layer = (own_layers or {}).get(field, "rule")
        if value is None:
            value = getattr(profile.limits, field)
            layer = profile.limit_layers.get(field, "profile")
        if value is None:
            value, layer = getattr(SYSTEM_DEFAULT_LIMITS, field), "built-in"
        values[field], layers[field] = value, layer
    if (own is None or own.timeout_ms is None) and profile.timeout_ms and \
            profile.timeout_ms < values["timeout_ms"]:
        values["timeout_ms"] = profile.timeout_ms
        layers["timeout_ms"] = profile.limit_layers.get("timeout_ms", "profile")
    return Limits(**values), layers


def _limits(lim: Limits, tmp_max: int | None) -> EffLimits:
    return EffLimits(
        max_bytes_in=lim.max_bytes_in, max_bytes_out=lim.max_bytes_out,
        max_depth=lim.max_depth, max_files=lim.max_files, timeout_ms=lim.timeout_ms,
        max_screenshot_width=lim.max_screenshot_width,
        max_screenshot_height=lim.max_screenshot_height, tmp_max_bytes=tmp_max,
    )


class ConditionIndex:
    """Finds what the policy set says about a profile rule: its compiled condition (by CEL
    source first, then by rule id) and the host patterns the rule itself names.
    """

    def __init__(self, policyset: PolicySet | None) -> None:
        self.by_source: dict[str, CompiledCondition] = {}
        self.by_id: dict[str, CompiledCondition] = {}
        self.has_policy = policyset is not None
        self.rule_hosts: dict[tuple[str, str], tuple[HostPattern, ...]] = {}
        self.rule_env: dict[str, tuple[ArgAlternative, ...] | None] = {}
        if policyset is not None:
            for rule in policyset.rules:
                for cap_kind, cap in rule.capabilities.items():
                    if isinstance(cap, NetHttpCapability | BrowserCapability):
                        self.rule_hosts[(rule.ref.id, str(cap_kind))] = tuple(
                            HostPattern.of(h) for h in cap.hosts)
                    elif isinstance(cap, ProcCapability) and rule.effect == "permit":
                        self.rule_env[rule.ref.id] = cap.env
                if rule.condition is not None:
                    self.by_source.setdefault(rule.condition.source, rule.condition)
                    self.by_id.setdefault(rule.id, rule.condition)
                    self.by_id.setdefault(rule.ref.id, rule.condition)

    def named_hosts(self, rule: RuleRef | None, kind: str,
                    members: tuple[Matcher, ...]) -> tuple[HostPattern, ...]:
        """Host patterns that may name a private address for this capability.

        Only the policy rule's own hosts count: a grant or manifest naming `169.254.169.254`
        must not lift the refusal when the rule only says `*` (the meet would otherwise carry
        the grant's literal). Without a policy set (hand-built profiles) the met hosts count.
        """
        if not self.has_policy:
            return host_patterns(members)
        if rule is None:
            return ()
        return self.rule_hosts.get((rule.id, kind), ())

    def env(self, rule: RuleRef | None, caps: tuple[Any, ...]) -> EnvAllow:
        """The env allow-list of a proc.exec capability: the policy rule's own list must exist
        (none: no variable at all), and every member's list must admit too."""
        members = [c.env for c in caps if isinstance(c, ProcCapability)]
        source = f"rule `{rule.id}`" if rule is not None else "the capability"
        return env_allow(self.rule_env.get(rule.id) if rule is not None else None,
                         self.has_policy, members, source)

    def find(self, source: str | None, rule: RuleRef | None) -> GuardCondition | None:
        if source is None:
            return None
        found = self.by_source.get(source)
        if found is None and rule is not None:
            cand = self.by_id.get(rule.id)
            if cand is not None and cand.source.strip() == source.strip():
                found = cand
        return guard_condition(found if found is not None else MissingCondition(source))


def compile_profile(profile: Profile, conditions: ConditionIndex, *,
                    builtin_consent: bool = False,
                    consent_rules: tuple[GuardCondition, ...] = (),
                    forbids: Mapping[str, ForbidSet] | None = None) -> CompiledProfile:
    """Compile ``profile``; a pure function of the profile and the policy set.

    :param builtin_consent: the policy set holds the built-in consent rule (seed 000 §6: High
        safety, or Write/Process side effects), applied on top of ``consent_required``.
    :param consent_rules: the policy set's conditional consent rules (their variables count
        towards what the context must hold).
    :param forbids: ``compile_forbids(profile, conditions)`` when the caller has it already
        (it depends on the denies and home alone, so a guard shares it across profiles).
    """
    home = profile.mappings.home
    phash = profile.profile_hash
    caps: dict[str, list[CompiledCap]] = {}
    for pc in profile.capabilities:
        kind = str(pc.kind)
        members = tuple(compile_matcher(c, kind, home) for c in pc.all_of)
        tmp_max = _min(*(m.max_bytes for m in members if isinstance(m, KindMatcher)))
        lim, layers = effective_limits(pc.limits, pc.limit_layers, profile)
        caps.setdefault(kind, []).append(CompiledCap(
            kind=kind, members=members, test=_member_test(members), rule=pc.rule,
            condition=conditions.find(pc.condition, pc.rule),
            limits=_limits(lim, tmp_max), layers=layers,
            hosts=conditions.named_hosts(pc.rule, kind, members),
            env=conditions.env(pc.rule, pc.all_of) if kind == "proc.exec" else None,
            allow=Decision.model_construct(
                decision="allow", code=None, http_status=200, reason="", rule=pc.rule,
                profile_hash=phash, trace=None, limits=lim,
                limit_layers=ReadOnlyDict(layers)),  # every allow of it shares the map
        ))
    if forbids is None:
        forbids = compile_forbids(profile, conditions)
    used = [c.condition for lst in caps.values() for c in lst if c.condition is not None]
    used += [d.condition for f in forbids.values() for d in f.denies if d.condition is not None]
    used += consent_rules
    needs: frozenset[str] | None = frozenset()
    for gc in used:
        needs = None if needs is None or gc.needs is None else needs | gc.needs
    # only the fields conditions read: CEL converts each view whole on every evaluation
    views = static_views(profile) if needs is None else trim_views(
        static_views(profile), [getattr(gc.condition, "source", "") for gc in used])
    return CompiledProfile(
        profile=profile, profile_hash=phash, expires_at=profile.expires_at,
        network_off=str(profile.network) == "off",
        consent_required=profile.consent_required or (builtin_consent and (
            str(profile.safety) == "High"
            or any(str(s) in ("Write", "Process") for s in profile.side_effects))),
        consent_window=(profile.consent.granted_at, profile.consent.expires_at)
        if profile.consent is not None else None,
        root_fs=_root(profile.mappings.root_fs),
        tmp_dir=_root(profile.mappings.tmp_dir),
        caps={k: tuple(v) for k, v in caps.items()},
        forbids=forbids,
        granted=_by_kind(profile.granted, home),
        declared=_by_kind(profile.declared, home),
        views=views, needs=needs, context_views=view_items(views, needs),
        permit_index=_permit_indexes(caps),
    )


def view_items(views: Mapping[str, object],
               needs: frozenset[str] | None) -> tuple[tuple[str, object], ...]:
    """The (name, view) pairs of ``views`` a context needs, in ``STATIC_VIEWS`` order."""
    return tuple((k, views[k]) for k in STATIC_VIEWS if needs is None or k in needs)


def static_views(profile: Profile) -> dict[str, object]:
    """What a condition sees of the call besides ``request`` and ``now``, from the profile alone.

    The caller's context may supply ``grant``, ``manifest``, ``tenant`` and ``subject`` (the
    orchestrator passes what its caller gives); when it does not, these views are the ones a
    condition reads, so ``grant.subject_id.startsWith("agent:")`` works without a context.
    ``profile`` is always this view. The manifest's ``safety_class`` and ``side_effects`` are the
    met values the profile records (the highest class, the union of side effects).
    """
    def dump(items: tuple[Any, ...]) -> list[Any]:
        return [c.model_dump(mode="json") for c in items]

    side_effects = [str(s) for s in profile.side_effects]
    consent = profile.consent.model_dump(mode="json") if profile.consent is not None else None
    return {
        "profile": {
            "name": profile.name or "", "safety": str(profile.safety),
            "side_effects": side_effects, "network": str(profile.network),
            "tool_name": profile.tool_name, "tenant": profile.tenant,
            "subject_id": profile.subject_id,
        },
        "grant": {
            "tenant": profile.tenant, "subject_id": profile.subject_id,
            "tool_name": profile.tool_name, "call_id": profile.call_id,
            "expires_at": profile.expires_at, "budget": profile.budget.model_dump(mode="json"),
            "capabilities": dump(profile.granted), "consent": consent,
        },
        "manifest": {
            "name": profile.tool_name, "version": profile.manifest_version,
            "side_effects": list(side_effects), "safety_class": str(profile.safety),
            "permissions": dump(profile.declared),
        },
        "tenant": {"id": profile.tenant},
        "subject": {"id": profile.subject_id},
    }


def _permit_indexes(caps: Mapping[str, list[CompiledCap]]) -> dict[str, PermitIndex]:
    out: dict[str, PermitIndex] = {}
    for kind, lst in caps.items():
        idx = permit_index(kind, [c.members for c in lst])
        if idx is not None:
            out[kind] = idx
    return out


def _member_test(members: tuple[Matcher, ...]) -> Callable[[Any], object]:
    """The conjunction of ``members`` as one callable (the member's own when there is one)."""
    if all(isinstance(m, KindMatcher) for m in members):
        # the kind alone admits: ``type`` is a C-level callable whose answer (a class) is always
        # true, so a tmp.use permit's test costs no Python frame
        return type
    if len(members) == 1:
        m = members[0]
        return m.admits_path if isinstance(m, FsMatcher) else m.admits
    return lambda res: all(m.admits(res) for m in members)


def _root(path: str) -> str:
    """A mapping root, normalized; a malformed one becomes a root nothing is beneath."""
    try:
        return normalize_path(path)
    except PolicyEngineError:
        return "/\x00invalid-root"


def _by_kind(capabilities: tuple[Any, ...], home: str) -> dict[str, tuple[Matcher, ...]]:
    out: dict[str, list[Matcher]] = {}
    for cap in capabilities:
        out.setdefault(cap.kind, []).append(compile_matcher(cap, cap.kind, home))
    return {k: tuple(v) for k, v in out.items()}


def compile_forbids(profile: Profile, conditions: ConditionIndex) -> dict[str, ForbidSet]:
    """The forbids of ``profile`` by kind: a function of its denies, deny-lists and home."""
    home = profile.mappings.home
    denies: dict[str, list[CompiledDeny]] = {}
    fs_globs: dict[str, list[str]] = {}
    real_forms: dict[str, str | None] = {}  # each fs pattern's real spelling, resolved once
    # mandatory first, then policy order: the first matching forbid names the rule
    ordered = sorted(profile.denies, key=lambda d: not d.mandatory)
    for d in ordered:
        for kind_enum in d.kinds:
            kind = str(kind_enum)
            cap = d.capability
            if kind.startswith("fs.") and isinstance(cap, FsCapability):
                cap = _with_real_forms(cap, home, real_forms)
                fs_globs.setdefault(kind, []).extend(cap.paths)
            denies.setdefault(kind, []).append(CompiledDeny(
                compile_matcher(cap, kind, home, forbid=True), d.rule,
                conditions.find(d.condition, d.rule), d.mandatory, d.rule.id))
    # the derived deny-lists: no rule of their own, checked after the rules
    dl = profile.deny
    if dl.paths:
        for kind in FS_KINDS:
            listed = _with_real_forms(FsCapability(kind=kind, paths=dl.paths), home,
                                      real_forms)
            fs_globs.setdefault(kind, []).extend(listed.paths)
            denies.setdefault(kind, []).append(CompiledDeny(
                compile_matcher(listed, kind, home, forbid=True), None, None, True, "deny-list"))
    if dl.domains:
        for kind in ("net.http", "browser.use"):
            cap_n = NetHttpCapability(hosts=dl.domains)
            m = compile_matcher(cap_n, "net.http", home, forbid=True)
            denies.setdefault(kind, []).append(CompiledDeny(
                _AnyUrl(host_patterns([m])), None, None, True, "deny-list"))
    for tool in dl.tools:
        denies.setdefault("proc.exec", []).append(CompiledDeny(
            compile_matcher(ProcCapability(tool=tool), "proc.exec", home, forbid=True),
            None, None, True, "deny-list"))
    out: dict[str, ForbidSet] = {}
    for kind, lst in denies.items():
        if kind in fs_globs:
            globs = shared_globset(tuple(fs_globs[kind]), home, forbid=True)
            out[kind] = ForbidSet(globs.match, tuple(lst), by_globs=True)
        else:
            out[kind] = ForbidSet(_screen([d.matcher for d in lst]), tuple(lst))
    return out


def _with_real_forms(cap: FsCapability, home: str,
                     seen: dict[str, str | None]) -> FsCapability:
    """``cap`` whose paths also name the same files under their real prefix when a pattern's
    fixed prefix runs through a symlink (a HOME given through a link: ``~/.ssh/**`` must deny
    the real ``.ssh`` an op path resolves to; outsider round 10, F5). Read when a policy's
    forbids are compiled (each load or reload; ``seen``: each pattern once, not once per kind):
    a link re-pointed while the engine runs is seen at the next reload (docs/cli.md). A forbid
    only ever gains spellings."""
    extra = []
    for p in cap.paths:
        if p not in seen:
            try:
                seen[p] = resolved_form(expand_home(p, home), real_path)
            except OSError:  # changing under realpath: the pattern keeps its own spelling
                seen[p] = None
        form = seen[p]
        if form is not None and form not in cap.paths:
            extra.append(form)
    return cap.model_copy(update={"paths": (*cap.paths, *extra)}) if extra else cap


def _screen(matchers: list[Matcher]) -> Callable[[Any], bool] | None:
    """The union test of URL or tool forbids: each admits only its own hosts (or tool), so a
    resource none of them names is admitted by none. ``None`` for any other mix of matchers."""
    live = [m for m in matchers if not isinstance(m, NeverMatcher)]
    url_matchers = [m for m in live if isinstance(m, UrlMatcher | _AnyUrl)]
    if live and len(url_matchers) == len(live):
        hosts = HostSet(h for m in url_matchers for h in m.hosts)

        def url_screen(res: Any) -> bool:
            url = res[0]
            # a screenshot of the open page has no URL: some forbids admit it, scan them
            return url is None or hosts.matches(url.host, url.ip)

        return url_screen
    if live and all(isinstance(m, ProcMatcher) for m in live):
        tools = frozenset(m.tool for m in live if isinstance(m, ProcMatcher))
        return lambda res: res[0] in tools
    return None


class _AnyUrl:
    """A deny-list domain: blocks the host for any method, scheme, port or browser scope."""

    __slots__ = ("hosts", "host_set")

    def __init__(self, hosts: tuple[HostPattern, ...]) -> None:
        self.hosts = hosts
        self.host_set = HostSet(hosts)

    def admits(self, res: Any) -> bool:
        url = res[0]
        return url is not None and self.host_set.matches(url.host, url.ip)

    def why_not(self, res: Any) -> str:
        return "host is not on the deny-list"
