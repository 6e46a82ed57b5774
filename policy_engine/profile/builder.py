"""ProfileBuilder: grant ∩ manifest ∩ policy → the narrowest Profile per call (seed 000 §3.1)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from policy_engine.errors import ErrorCode, PolicyEngineError
from policy_engine.graph import CompiledRule, NamedProfile, PolicySet
from policy_engine.model import (
    AllowLists,
    BrowserCapability,
    BrowserScope,
    Capability,
    CapabilityKind,
    DenyLists,
    FsCapability,
    Grant,
    Limits,
    Manifest,
    Mappings,
    NetHttpCapability,
    Overrides,
    ProcCapability,
    Profile,
    ProfileCapability,
    ProfileDeny,
    SafetyClass,
    Settings,
    SideEffect,
)
from policy_engine.patterns.meet import Atom, decompose, group, meet_atom_sets, meet_many
from policy_engine.patterns.paths import expand_home, path_variable
from policy_engine.profile.cache import ProfileCache
from policy_engine.profile.hashing import canonical_json
from policy_engine.profile.layers import (
    LimitResolution,
    LimitsLayer,
    NetworkLayer,
    call_network,
    resolve_limits,
    resolve_network,
)
from policy_engine.profile.rule_index import RuleIndex
from policy_engine.profile.shape import HashTemplate, ProfileShape, grant_shape_key

_CONSENT_EFFECTS = frozenset({SideEffect.WRITE, SideEffect.PROCESS})


class ProfileBuilder:
    """Builds (and caches) profiles against one compiled policy.

    :param policyset: the compiled policy; a builder never outlives a policy reload, so the
        cache need not key on it.
    :param cache: the profile cache (``ProfileCache(size=…, shape_size=…)`` bounds it; by default
        4,096 profiles by identity and 1,024 grant shapes). A cache serves one policy set:
        builders of the same ``policyset`` object may share one, another policy set's may not
        (``ValueError``).
    :param index: meet each grant only with the permit rules that can intersect it
        (``rule_index``); the profile is the same either way.
    """

    def __init__(self, policyset: PolicySet, *, cache: ProfileCache | None = None,
                 index: bool = True) -> None:
        self.policyset = policyset
        self.cache = cache if cache is not None else ProfileCache()
        self.cache.serve(policyset)  # a cache holds one policy set's profiles
        # which permit rules can meet a grant (``index=False``: all of them, for comparisons)
        self._index = RuleIndex(policyset) if index else None
        # per kind, the positions of the permits with a path variable (resolved per call)
        self._variable_rules = _variable_rules(policyset)
        # denies depend on the policy alone: compute them once, and their canonical JSON too
        # (with a thousand rules, most of a profile's hash input)
        self._denies, self._deny_lists = _policy_denies(policyset)
        self._fixed_json = {
            "denies": canonical_json([d.model_dump(mode="json") for d in self._denies]),
            "deny": canonical_json(self._deny_lists.model_dump(mode="json")),
        }

    def build(
        self, grant: Grant, manifest: Manifest, *, settings: Settings | None = None,
        overrides: Overrides | None = None,
    ) -> Profile:
        """Return the profile for ``grant`` and ``manifest`` under the optional layers.

        :raises PolicyEngineError: ``DENY_TOOL`` if the grant is for another tool;
            ``PERMISSION_DENY`` if ``settings`` or ``overrides`` would widen a field;
            ``SCHEMA_VALIDATION_FAILED`` for an unknown named profile.
        """
        cache = self.cache
        hit = cache.by_identity(grant, manifest, settings, overrides)
        if hit is not None:
            return hit
        inputs = (cache.input_key(manifest),
                  "null" if settings is None else cache.input_key(settings),
                  "null" if overrides is None else cache.input_key(overrides))
        # an equal grant again in another object (each request's own): its very profile
        call_key = cache.call_key(grant, inputs)
        if call_key is not None:
            hit = cache.by_call(call_key)
            if hit is not None:
                # not remembered by identity: an equal grant in a new object is each request's
                # own (the service's), never built again; its weak reference and LRU entry cost
                # ≈ 2 µs a call (docs/benchmarks.md "Thirteenth pass")
                return hit
        shape_key = (grant_shape_key(grant), *inputs)
        shape = cache.by_shape(shape_key)
        if shape is None:
            # the meet: once per shape; later grants differing only in call fields copy it
            shape = cache.store_shape(shape_key,
                                      self._build_shape(grant, manifest, settings, overrides))
        profile = shape.instantiate(grant)
        cache.remember(grant, manifest, settings, overrides, profile)
        if call_key is not None:
            cache.remember_call(call_key, profile)
        return profile

    def build_uncached(
        self, grant: Grant, manifest: Manifest, *, settings: Settings | None = None,
        overrides: Overrides | None = None,
    ) -> Profile:
        """The meet itself, without touching the cache (benchmarks and tests use it)."""
        return self._build_shape(grant, manifest, settings, overrides).instantiate(grant)

    def _build_shape(
        self, grant: Grant, manifest: Manifest, settings: Settings | None,
        overrides: Overrides | None,
    ) -> ProfileShape:
        """The profile of these inputs (without its hash) and what hashes it and its copies."""
        profile = self._meet(grant, manifest, settings, overrides)
        ps = self.policyset
        return ProfileShape(profile, HashTemplate(profile, ps.version_hash, manifest.version,
                                                  self._fixed_json))

    def _meet(
        self, grant: Grant, manifest: Manifest, settings: Settings | None,
        overrides: Overrides | None,
    ) -> Profile:
        ps = self.policyset
        if grant.tool_name != manifest.name:
            raise PolicyEngineError(
                ErrorCode.DENY_TOOL,
                f"grant is for tool `{grant.tool_name}` but the manifest is `{manifest.name}`",
            )
        named = self._named(manifest, overrides)
        resolution = resolve_limits(ps.defaults, [
            LimitsLayer("settings", settings.limits if settings else Limits(), strict=True),
            LimitsLayer("manifest", manifest.limits),
            LimitsLayer("grant", grant.limits),
            *(LimitsLayer(f"profile {p.name}", p.limits, layer="named profile") for p in named),
            LimitsLayer("override", overrides.limits if overrides else Limits(), strict=True),
        ])
        limits, limit_layers = resolution.effective()
        network = resolve_network(call_network(ps.network, manifest.network), [
            NetworkLayer("settings", settings.network if settings else None),
            *(NetworkLayer(f"profile {p.name}", p.network) for p in named),
            NetworkLayer("override", overrides.network if overrides else None, strict=True),
        ])
        capabilities = tuple(self._capabilities(grant, manifest, named, resolution, settings))
        side_effects = tuple(sorted(set(manifest.side_effects), key=lambda e: e.value))
        safety = manifest.safety_class  # the only source with a class; the max of one
        profile = Profile(
            tenant=grant.tenant, subject_id=grant.subject_id, tool_name=grant.tool_name,
            call_id=grant.call_id,
            name="+".join(p.name for p in named) or None,
            capabilities=capabilities,
            denies=self._denies,
            granted=grant.capabilities,
            declared=manifest.permissions,
            safety=safety,
            side_effects=side_effects,
            limits=limits,
            limit_layers=limit_layers,
            budget=grant.budget,
            allow=_allow_lists(capabilities),
            deny=self._deny_lists,
            mappings=Mappings(
                root_fs=(settings.root_fs if settings and settings.root_fs else
                         Mappings().root_fs),
                tmp_dir=(settings.tmp_dir if settings and settings.tmp_dir else
                         Mappings().tmp_dir),
                home=ps.home,
            ),
            network=network,
            # the strongest any applied named profile requires (one level exists: gvisor)
            isolation=next((p.isolation for p in named if p.isolation is not None), None),
            timeout_ms=int(limits.timeout_ms or 0),
            consent_required=self._consent_required(safety, side_effects),
            consent=grant.consent,
            expires_at=grant.expires_at,
            policy_name=ps.name,
            policy_version=ps.version,
            policy_version_hash=ps.version_hash,
            manifest_version=manifest.version,
        )
        return profile

    # --- pieces -------------------------------------------------------------------------------

    def _named(self, manifest: Manifest, overrides: Overrides | None) -> list[NamedProfile]:
        """The named profiles asked for. Both apply when both ask: each may only narrow, so
        an override naming a laxer profile than the manifest's cannot widen anything."""
        names = [manifest.profile, overrides.profile if overrides else None]
        out: list[NamedProfile] = []
        for name in dict.fromkeys(n for n in names if n is not None):
            preset = self.policyset.profiles.get(name)
            if preset is None:
                raise PolicyEngineError(
                    ErrorCode.SCHEMA_VALIDATION_FAILED, f"unknown profile `{name}`"
                )
            out.append(preset)
        return out

    def _visits(
        self, kind: CapabilityKind, rules: Sequence[CompiledRule], base: Sequence[Atom],
        variables: Mapping[str, str | None],
    ) -> list[tuple[CompiledRule, tuple[Atom, ...]]]:
        """The permit rules of ``kind`` that may meet ``base``, each with its atoms; a rule
        with a path variable gets its atoms resolved for this call (the index holds only
        its fixed paths: a variable's atom is none until resolved)."""
        home = self.policyset.home
        if self._index is None:
            return [(r, decompose(r.capabilities[kind], home, variables)) for r in rules]
        index = self._index.kind(kind)
        with_vars = self._variable_rules.get(kind)
        if not with_vars:  # the common case: nothing to resolve, the index's atoms as they are
            return [(index.rules[i], index.atoms[i]) for i in index.candidates(base)]
        positions = set(index.candidates(base)) | with_vars
        return [(index.rules[i], decompose(index.rules[i].capabilities[kind], home, variables)
                 if i in with_vars else index.atoms[i]) for i in sorted(positions)]

    def _capabilities(
        self, grant: Grant, manifest: Manifest, named: Sequence[NamedProfile],
        resolution: LimitResolution, settings: Settings | None,
    ) -> Iterable[ProfileCapability]:
        ps, home = self.policyset, self.policyset.home
        # a permit's ``$SESSION`` is the calling session's directory, from the engine's own
        # settings (the session runtime's): never the grant's or the manifest's words
        variables = {"$SESSION": settings.session if settings is not None else None}
        for kind in CapabilityKind:
            rules = ps.permits_by_kind.get(kind, ())
            granted = [c for c in grant.capabilities if c.kind == kind]
            declared = [c for c in manifest.permissions if c.kind == kind]
            if not rules or not granted or not declared:
                continue
            if kind is CapabilityKind.FS_WRITE and any(p.fs_mode == "read-only" for p in named):
                continue
            base = meet_many([granted, declared], home=home)
            if kind is CapabilityKind.FS_WRITE:
                for preset in named:
                    if preset.writable is not None:
                        writable = FsCapability(kind="fs.write", paths=preset.writable)
                        base = meet_atom_sets(base, decompose(writable, home))
            if not base:
                continue
            visits = self._visits(kind, rules, base, variables)
            for rule, rule_atoms in visits:
                atoms = meet_atom_sets(base, rule_atoms)
                # a rule without limits runs under the profile's (``limits`` None)
                own, layers = resolution.effective(rule.limits) if rule.limits else (None, None)
                for conjunction in group(atoms):
                    yield ProfileCapability(
                        kind=kind, all_of=conjunction, rule=rule.ref,
                        condition=rule.condition.source if rule.condition else None,
                        limits=own, limit_layers=layers,
                    )

    def _consent_required(self, safety: SafetyClass, side_effects: Sequence[SideEffect]) -> bool:
        """Whether consent is required whatever the request: the built-in rule applies.

        A rule without a condition is the built-in one (High safety, or Write/Process side
        effects) and is decided here, once per profile. Rules with a CEL condition depend on the
        request, so the guard evaluates them at decision time; they do not set this flag (if
        they did, the guard could never tell a call that needs no consent).
        """
        builtin = safety is SafetyClass.HIGH or bool(_CONSENT_EFFECTS.intersection(side_effects))
        return builtin and any(r.condition is None for r in self.policyset.consent_rules)


def _variable_rules(ps: PolicySet) -> dict[CapabilityKind, frozenset[int]]:
    """Per kind, the positions (in ``permits_by_kind``) of the permits naming a path variable."""
    out: dict[CapabilityKind, frozenset[int]] = {}
    for kind, rules in ps.permits_by_kind.items():
        found = frozenset(i for i, r in enumerate(rules)
                          if isinstance(cap := r.capabilities.get(kind), FsCapability)
                          and any(path_variable(p) is not None for p in cap.paths))
        if found:
            out[kind] = found
    return out


def _forbid_rules(ps: PolicySet) -> list[CompiledRule]:
    rules = {r.id: r for r in ps.rules if r.effect == "forbid"}
    for by_kind in ps.forbids_by_kind.values():
        for r in by_kind:
            rules.setdefault(r.id, r)
    return list(rules.values())


_FS_KINDS = frozenset({CapabilityKind.FS_READ, CapabilityKind.FS_WRITE, CapabilityKind.FS_LIST})
_ALL_SCOPES = frozenset(BrowserScope)


def _flatten(caps: Mapping[CapabilityKind, Capability], home: str,
             paths: set[str], domains: set[str], tools: set[str]) -> None:
    """Add an unconditional forbid to the flat deny-lists only where it is as broad as they are.

    The lists are kind- and method-agnostic (the guard applies ``paths`` to every fs kind and
    ``domains`` to every request of net.http and browser.use), so a forbid on ``fs.write`` only,
    or on POST to a host, stays a rule-scoped deny: flattening it refused reads and GETs the
    policy allows. Every forbid is also a ProfileDeny, so nothing is lost here.
    """
    fs = [c for k, c in caps.items() if k in _FS_KINDS and isinstance(c, FsCapability)]
    if len(fs) == len(_FS_KINDS) and len({c.paths for c in fs}) == 1:
        paths.update(expand_home(p, home) for p in fs[0].paths)
    net = caps.get(CapabilityKind.NET_HTTP)
    web = caps.get(CapabilityKind.BROWSER_USE)
    if (isinstance(net, NetHttpCapability) and isinstance(web, BrowserCapability)
            and net.hosts == web.hosts and not (net.ports or net.schemes or net.methods
                                                or net.mime or web.ports or web.schemes)
            and frozenset(web.scopes) == _ALL_SCOPES):
        domains.update(net.hosts)
    proc = caps.get(CapabilityKind.PROC_EXEC)
    if isinstance(proc, ProcCapability) and proc.args is None:
        tools.add(proc.tool)


def _policy_denies(ps: PolicySet) -> tuple[tuple[ProfileDeny, ...], DenyLists]:
    """Every forbid rule as a ProfileDeny (kinds sharing resources grouped) and the deny-lists.

    The flat deny-lists hold only unconditional forbids: a list reads as "always refused", and
    a forbid with a ``when`` is only sometimes; the ProfileDeny entries carry the exact rule.
    """
    denies: list[ProfileDeny] = []
    paths: set[str] = set()
    domains: set[str] = set()
    tools: set[str] = set()
    for rule in _forbid_rules(ps):
        by_resources: dict[str, list[tuple[CapabilityKind, Capability]]] = {}
        for kind, cap in rule.capabilities.items():
            resources = canonical_json(cap.model_dump(mode="json", exclude={"kind"}))
            by_resources.setdefault(resources, []).append((kind, cap))
        if rule.condition is None:
            _flatten(rule.capabilities, ps.home, paths, domains, tools)
        for group_ in by_resources.values():
            denies.append(ProfileDeny(
                kinds=tuple(k for k, _ in group_), capability=group_[0][1], rule=rule.ref,
                condition=rule.condition.source if rule.condition else None,
                mandatory=rule.mandatory,
            ))
    deny_lists = DenyLists(paths=tuple(sorted(paths)), domains=tuple(sorted(domains)),
                           tools=tuple(sorted(tools)))
    return tuple(denies), deny_lists


def _allow_lists(capabilities: Sequence[ProfileCapability]) -> AllowLists:
    """A summary view of the capabilities (seed 000 Whitelists); the capabilities decide."""
    domains: set[str] = set()
    paths: set[str] = set()
    tools: set[str] = set()
    mime: set[str] = set()
    methods: set[str] = set()
    for pc in capabilities:
        for cap in pc.all_of:
            if isinstance(cap, FsCapability):
                paths.update(cap.paths)
            elif isinstance(cap, NetHttpCapability):
                domains.update(cap.hosts)
                mime.update(cap.mime)
                methods.update(cap.methods)
            elif isinstance(cap, BrowserCapability):
                domains.update(cap.hosts)
            elif isinstance(cap, ProcCapability):
                tools.add(cap.tool)
    return AllowLists(domains=tuple(sorted(domains)), paths=tuple(sorted(paths)),
                      tools=tuple(sorted(tools)), mime_allow=tuple(sorted(mime)),
                      methods=tuple(sorted(methods)))
