"""Backend selection: which executor serves an op, and whether it can enforce the profile.

Seed 004's refuse-or-degrade rule: a profile that needs a capability the chosen backend lacks is
refused in strict mode (``SANDBOX.CAPABILITY_BLOCKED``) and run degraded in compat mode, with the
reason recorded. A backend that is not loaded or reports itself unavailable fails with
``PROVIDER.UNAVAILABLE`` unless ``fallback_to_local`` lets a local executor serve the op. Given
the op, the chosen executor's own refusal of it (its ``refusal``) is the selection's refusal too.
"""

from __future__ import annotations

import difflib
from collections.abc import Collection, Mapping
from dataclasses import dataclass

from policy_engine.config import DEFAULT_BACKENDS, EngineConfig
from policy_engine.errors import ErrorCode, PolicyEngineError, spec_of
from policy_engine.executor import Executor, ExecutorCapabilities, refusal_of
from policy_engine.model import CapabilityKind, Decision, ExecOp, NetworkMode, OpKind, Profile

# Ops whose executor *is* the network client: the guard's host rules govern them, so the
# sandbox network mode of the profile does not apply to the executor itself.
_NETWORK_CLIENT_OPS = frozenset({OpKind.NET_HTTP, OpKind.BROWSER_NAV, OpKind.BROWSER_SCREENSHOT})


NEVER_DEGRADED = frozenset({"mandatory_denies", "isolation:gvisor"})
"""Requirements compat mode does not lift: mandatory denies never degrade, and neither does a
required isolation (running a profile that demands gVisor without it would silently weaken the
isolation its author asked for)."""


@dataclass(frozen=True, slots=True)
class Requirement:
    """One capability a profile needs from its backend, and why (shown in refusals)."""

    capability: str
    why: str


@dataclass(frozen=True, slots=True)
class Selection:
    """The executor chosen for one op, or the refusal; ``degraded`` lists compat-mode reasons."""

    executor: Executor | None
    backend: str | None
    degraded: tuple[str, ...] = ()
    error: PolicyEngineError | None = None


def refusal_decision(decision: Decision, err: PolicyEngineError) -> Decision:
    """The guard's allow ``decision`` as the deny a refused selection makes of it: the
    selection's code, status and reason and no permitting rule. The run reports (and records)
    this, and the dry run answers it, so both say the same (outsider round 4 F03)."""
    spec = spec_of(err.code)
    return decision.model_copy(update={
        "decision": "deny", "code": spec.code.value, "http_status": spec.http_status,
        "reason": err.reason, "rule": None})


def _network_ok(caps: ExecutorCapabilities, mode: NetworkMode) -> bool:
    # A backend that can only be *stricter* than asked (off when restricted is allowed) is no
    # security loss; one that can only be looser (on when off is required) is.
    return any(m.rank <= mode.rank for m in caps.network_modes)


def required_capabilities(profile: Profile, op_kind: OpKind) -> list[Requirement]:
    """What ``profile`` needs enforced by whichever backend runs an op of ``op_kind``."""
    return list(requirements(profile, op_kind))


# memo tables: each key holds exactly what its value is computed from, so an entry can never
# answer for another profile or backend; cleared when full (a few distinct keys per engine)
_REQUIREMENTS: dict[tuple[object, ...], tuple[Requirement, ...]] = {}
_MISSING: dict[tuple[int, int], tuple[ExecutorCapabilities, tuple[Requirement, ...],
                                      tuple[Requirement, ...]]] = {}
_MEMO_MAX = 1024


def requirements(profile: Profile, op_kind: OpKind) -> tuple[Requirement, ...]:
    """:func:`required_capabilities` as a shared tuple, memoized on what it reads of the profile
    (its network mode; for proc.exec also whether it grants fs.write, its isolation and name):
    building the requirements and their reasons cost ≈ 3 µs a call, twice per decide."""
    if op_kind == OpKind.PROC_EXEC:
        writable = any(c.kind == CapabilityKind.FS_WRITE for c in profile.capabilities)
        key: tuple[object, ...] = (op_kind, profile.network, writable, profile.isolation,
                                   profile.name if profile.isolation is not None else None)
    else:
        key = (op_kind, profile.network if op_kind not in _NETWORK_CLIENT_OPS else None)
    found = _REQUIREMENTS.get(key)
    if found is None:
        found = tuple(_required(profile, op_kind))
        if len(_REQUIREMENTS) >= _MEMO_MAX:
            _REQUIREMENTS.clear()
        _REQUIREMENTS[key] = found
    return found


def _required(profile: Profile, op_kind: OpKind) -> list[Requirement]:
    reqs: list[Requirement] = []
    if op_kind not in _NETWORK_CLIENT_OPS:
        reqs.append(Requirement(f"network_modes:{profile.network.value}",
                                f"the profile's network mode is `{profile.network.value}`"))
    if op_kind == OpKind.PROC_EXEC:
        writable = any(c.kind == CapabilityKind.FS_WRITE for c in profile.capabilities)
        reqs.append(Requirement("mandatory_denies", "secrets such as ~/.ssh and **/.env, and "
                                "host control sockets such as /run/docker.sock and "
                                "containerd.sock, must be unreachable"))
        reqs.append(Requirement("resource_limits", "the profile limits cpu, memory and pids"))
        reqs.append(Requirement("env_filtering", "a process gets an allow-listed environment"))
        reqs.append(Requirement("bind_mounts", "the process may see only the profile's paths"))
        if not writable:
            reqs.append(Requirement("readonly_rootfs", "the profile grants no fs.write"))
        if profile.isolation is not None:
            reqs.append(Requirement(
                f"isolation:{profile.isolation.value}",
                f"the named profile `{profile.name}` requires isolation "
                f"`{profile.isolation.value}`"))
    return reqs


def missing_capabilities(caps: ExecutorCapabilities, profile: Profile,
                         op_kind: OpKind) -> list[Requirement]:
    """The requirements ``caps`` does not meet."""
    return list(_missing(caps, profile, op_kind))


def _missing(caps: ExecutorCapabilities, profile: Profile,
             op_kind: OpKind) -> tuple[Requirement, ...]:
    """:func:`missing_capabilities`, memoized per backend capabilities (frozen) and requirement
    tuple (the profile's network mode and isolation are in :func:`requirements`' key): keyed
    by their ids, the entry keeps both objects, so an id reused by another never matches."""
    reqs = requirements(profile, op_kind)
    key = (id(caps), id(reqs))
    hit = _MISSING.get(key)
    if hit is not None and hit[0] is caps and hit[1] is reqs:
        return hit[2]
    out = []
    for req in reqs:
        if req.capability.startswith("network_modes:"):
            ok = _network_ok(caps, profile.network)
        elif req.capability.startswith("isolation:"):
            ok = profile.isolation in caps.isolation
        else:
            ok = bool(getattr(caps, req.capability))
        if not ok:
            out.append(req)
    found = tuple(out)
    if len(_MISSING) >= _MEMO_MAX:
        _MISSING.clear()
    _MISSING[key] = (caps, reqs, found)
    return found


def _never_degraded_why(req: Requirement) -> str:
    if req.capability == "mandatory_denies":
        return "mandatory denies never degrade"
    return "a required isolation never degrades; serve proc.exec with a backend providing it"


def _unavailable(executor: Executor) -> str | None:
    """An executor may expose ``available() -> bool | str`` (a str is the reason it is not)."""
    probe = getattr(executor, "available", None)
    if probe is None:
        return None
    try:
        state = probe()
    except Exception as exc:  # a probe that crashes means the backend is not usable
        return f"{type(exc).__name__}: {exc}"
    if state is True:
        return None
    return state if isinstance(state, str) and state else "backend reports it is unavailable"


def chosen_backend(executors: Mapping[str, Executor], config: EngineConfig,
                   op_kind: OpKind) -> Executor | None:
    """The executor ``select`` picks for ``op_kind`` when it is the configured or default
    backend, loaded, serving the kind and available; ``None`` for any other outcome."""
    chosen = executors.get(config.backends.get(op_kind) or DEFAULT_BACKENDS.get(op_kind) or "")
    if chosen is None or op_kind not in chosen.capabilities.op_kinds:
        return None
    return chosen if _unavailable(chosen) is None else None


def _local_for(executors: Mapping[str, Executor], op_kind: OpKind) -> Executor | None:
    for ex in executors.values():
        if getattr(ex, "local", False) is True and op_kind in ex.capabilities.op_kinds \
                and _unavailable(ex) is None:
            return ex
    return None


def unknown_backends(config: EngineConfig, executors: Collection[str],
                     causes: list[str] | None = None) -> str | None:
    """Why ``config.backends`` names an executor no loaded plugin provides (a typo, or a plugin
    that failed to load: ``causes``), with the closest loaded name; ``None`` when all are.
    Checked when the engine starts, so the mistake is not first seen as PROVIDER.UNAVAILABLE
    on some later call. ``executors``: the names of the loaded executors."""
    for kind, name in config.backends.items():
        if name in executors:
            continue
        close = difflib.get_close_matches(name, list(executors), n=1, cutoff=0.6)
        hint = f"; did you mean `{close[0]}`?" if close else ""
        loaded = ", ".join(f"`{n}`" for n in sorted(executors)) or "none"
        # a plugin that failed to load may be the one meant; a near name is likelier a typo
        why = f" (plugin failures: {'; '.join(causes)})" if causes and not close else ""
        return (f"`backends`: `{kind.value}: {name}` names no loaded executor{hint} "
                f"(loaded: {loaded}){why}")
    return None


def select(executors: Mapping[str, Executor], config: EngineConfig, profile: Profile,
           op_kind: OpKind, op: ExecOp | None = None) -> Selection:
    """Choose the executor for ``op_kind`` (``config.backends`` first, else the first-party
    default — refused as unavailable when it is not loaded —, else, for a kind without a
    default, the first loaded executor serving it) and check it against ``profile``; with
    ``op``, also ask the executor whether it would refuse ``op`` (the run and its dry run both
    pass it: outsider round 5 F06).
    """
    wanted = config.backends.get(op_kind)
    chosen: Executor | None
    if wanted is not None:
        chosen = executors.get(wanted)
        why = None if chosen is not None else f"backend `{wanted}` is not loaded"
    else:
        default = DEFAULT_BACKENDS.get(op_kind)
        preferred = executors.get(default or "")
        if preferred is not None and op_kind in preferred.capabilities.op_kinds:
            chosen = preferred
        elif default is not None:
            # the first-party default did not load (its plugin failed, or was not installed):
            # never move the call to whichever other executor serves the kind — a docker or a
            # third-party backend nobody chose for it (seed 004: no silent switch)
            return Selection(None, default, error=PolicyEngineError(
                ErrorCode.PROVIDER_UNAVAILABLE,
                f"the default backend `{default}` for `{op_kind.value}` is not loaded (see "
                "`policy-engine plugins` for plugin load errors); name the backend to use "
                "under `backends:` in the engine config", audit={"backend": default}))
        else:
            # never a local executor: it runs only when configured or as fallback_to_local
            chosen = next((e for e in executors.values() if op_kind in e.capabilities.op_kinds
                           and getattr(e, "local", False) is not True), None)
        wanted = chosen.name if chosen is not None else None
        why = None if chosen is not None else f"no loaded backend serves `{op_kind.value}`"
    if chosen is not None and op_kind not in chosen.capabilities.op_kinds:
        why = f"backend `{chosen.name}` does not serve `{op_kind.value}`"
    if chosen is not None and why is None:
        why = _unavailable(chosen)
        if why is not None:
            why = f"backend `{chosen.name}` is unavailable: {why}"
    degraded: list[str] = []
    if why is not None:
        local = _local_for(executors, op_kind) if config.fallback_to_local else None
        if local is None:
            return Selection(None, wanted, error=PolicyEngineError(
                ErrorCode.PROVIDER_UNAVAILABLE, why, audit={"backend": wanted}))
        degraded.append(f"{why}; fell back to local backend `{local.name}`")
        chosen = local
    assert chosen is not None  # narrowed above: either found or replaced by the local one
    missing = _missing(chosen.capabilities, profile, op_kind)
    hard = [m for m in missing if m.capability in NEVER_DEGRADED]
    if hard:
        what = ("enforce the mandatory denies" if hard[0].capability == "mandatory_denies"
                else f"provide `{hard[0].capability}`")
        return Selection(None, chosen.name, error=PolicyEngineError(
            ErrorCode.CAPABILITY_BLOCKED,
            f"backend `{chosen.name}` cannot {what}: {hard[0].why} "
            f"({_never_degraded_why(hard[0])}, in strict or compat mode)",
            audit={"backend": chosen.name, "missing": [m.capability for m in hard],
                   "why": [m.why for m in hard]}))
    if missing and config.mode == "strict":
        names = ", ".join(f"`{m.capability}`" for m in missing)
        return Selection(None, chosen.name, error=PolicyEngineError(
            ErrorCode.CAPABILITY_BLOCKED,
            f"backend `{chosen.name}` lacks {names} required by the profile",
            audit={"backend": chosen.name, "missing": [m.capability for m in missing],
                   "why": [m.why for m in missing]}))
    degraded.extend(f"backend `{chosen.name}` lacks `{m.capability}` ({m.why})"
                    for m in missing)
    refused = refusal_of(chosen, profile, op) if op is not None else None
    if refused is not None:
        audit = {"backend": chosen.name, **(refused.audit or {})}
        return Selection(None, chosen.name, tuple(degraded), error=PolicyEngineError(
            refused.code, refused.reason, audit=audit))
    return Selection(chosen, chosen.name, tuple(degraded))
