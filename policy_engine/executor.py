"""The executor SPI: what an isolating backend declares and how the orchestrator calls it.

Executors are plugins (see ``policy_engine.hookspecs``); first-party ones live under the top-level
``plugins/`` package and import only this module, the model and the errors — exactly what a third
party could import.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from policy_engine.errors import ErrorCode, PolicyEngineError
from policy_engine.model import Limits, NetworkMode, Usage
from policy_engine.model.unchecked import assembled

if TYPE_CHECKING:  # annotations only: `explain` imports this module and never the records
    from policy_engine.model import (
        Decision,
        ExecOp,
        ExecResult,
        Isolation,
        OpKind,
        Profile,
        SideEffectRec,
    )


@dataclass(frozen=True, slots=True)
class ExecutorCapabilities:
    """What a backend can enforce (seed 004 ``SandboxCapabilities``).

    When a profile needs something a backend lacks, strict mode refuses and compat mode runs
    degraded, recording ``degraded=true`` and the reason in the evidence.
    """

    op_kinds: frozenset[OpKind]
    network_modes: frozenset[NetworkMode] = frozenset({NetworkMode.OFF})
    bind_mounts: bool = False
    readonly_rootfs: bool = False
    resource_limits: bool = False
    env_filtering: bool = False
    streaming_output: bool = False
    mandatory_denies: bool = False
    """proc.exec: the process can reach no path under a mandatory deny (the policy's and the
    built-in secrets, masked) and no host control socket (docker, containerd, dbus, systemd,
    podman, another call's policy proxy). Never degraded: a backend without it is refused."""
    isolation: frozenset[Isolation] = frozenset()
    """proc.exec: the stronger isolation levels the backend provides when a profile requires
    one (``Profile.isolation``, a named profile's `isolation gvisor`). Never degraded."""

    def to_json(self) -> dict[str, Any]:
        return {
            "op_kinds": sorted(k.value for k in self.op_kinds),
            "network_modes": sorted(m.value for m in self.network_modes),
            "bind_mounts": self.bind_mounts,
            "readonly_rootfs": self.readonly_rootfs,
            "resource_limits": self.resource_limits,
            "env_filtering": self.env_filtering,
            "streaming_output": self.streaming_output,
            "mandatory_denies": self.mandatory_denies,
            "isolation": sorted(i.value for i in self.isolation),
        }


_MADE = threading.Lock()  # makes a token's event once, whichever thread asks first


class CancelToken:
    """Cooperative cancellation: executors poll ``cancelled`` or wait on it.

    The event is made on first ``cancel`` or ``wait``: most calls never cancel nor wait, and
    an ``Event`` (a condition and two locks) cost ≈ 3 µs of every call (issue 27)."""

    __slots__ = ("_event", "reason")

    def __init__(self) -> None:
        self._event: threading.Event | None = None
        self.reason: str | None = None

    def _made(self) -> threading.Event:
        event = self._event
        if event is None:
            with _MADE:
                event = self._event
                if event is None:
                    event = self._event = threading.Event()
        return event

    def cancel(self, reason: str = "cancelled") -> None:
        self.reason = reason
        self._made().set()

    @property
    def cancelled(self) -> bool:
        event = self._event
        return event is not None and event.is_set()

    def wait(self, timeout: float | None = None) -> bool:
        return self._made().wait(timeout)


class Decider(Protocol):
    """What executors that re-decide mid-operation use: the orchestrator's policy-aware guard
    (``policy_engine.guard.Guard``). Redirect hops, browser subrequests and proxied requests
    are decided with exactly the rules, conditions and private-address refusal of the guard.
    """

    def decide(self, profile: Profile, op: ExecOp, *, context: Any = None,
               now_ms: int | None = None, trace: bool = False) -> Decision:
        ...


def _no_usage() -> Usage:
    """``Usage()``, assembled (every field 0, none given): one per call (issue 27)."""
    return assembled(Usage, dict(_ZEROES), _NONE_GIVEN)


_ZEROES = Usage().model_dump()
_NONE_GIVEN: frozenset[str] = frozenset()

_PROFILE_LIMITS = Limits()
"""Sentinel default of ``ExecContext.limits``: "not given, use the profile's"."""


@dataclass(slots=True)
class ExecContext:
    """Everything an executor may use for one call.

    :param profile: the call's profile (mappings, network mode, capabilities).
    :param deadline: ``time.monotonic()`` value by which the call must end: the orchestrator
        sets it from ``limits.timeout_ms``.
    :param limits: the call's effective limits (``Decision.limits``: the profile's met with
        the permitting rule's and the op's own), every field set. An executor enforces these,
        never ``profile.limits`` (a rule's narrower limits are only here); docs/plugins.md
        lists which ones each op kind must enforce. Left out, it is the profile's.
    :param degraded: reasons the orchestrator chose to run degraded (compat mode).
    :param record_side_effect: append a side-effect summary (metadata only, never content).
    :param guard: the orchestrator's guard for this call's policy; executors that decide again
        mid-operation (redirects, subrequests, proxied connections) must use it.
    :param consume: charge a budget kind while running (``"bytes_in"``, ``"cpu_ms"`` …); raises
        ``PolicyEngineError(QUOTA.BUDGET_EXCEEDED)`` when over budget.
    :param on_start: what ``started()`` runs once: for an executor declaring
        ``charges_at_start``, the orchestrator charges the grant's ``calls`` budget there.
    :param on_output: ``("stdout" | "stderr", bytes)`` as a process writes them (a session's
        streamed exec); executors that capture output call it, in order, before capping.
    """

    profile: Profile
    deadline: float
    cancel: CancelToken = field(default_factory=CancelToken)
    degraded: tuple[str, ...] = ()
    side_effects: list[SideEffectRec] = field(default_factory=list)
    usage: Usage = field(default_factory=_no_usage)
    consume: Callable[[str, int], None] = field(default=lambda kind, amount: None)
    guard: Decider | None = None
    limits: Limits = _PROFILE_LIMITS
    on_start: Callable[[], None] = field(default=lambda: None)
    has_started: bool = False
    on_output: Callable[[str, bytes], None] | None = None

    def __post_init__(self) -> None:
        if self.limits is _PROFILE_LIMITS:
            self.limits = self.profile.limits

    def started(self) -> None:
        """Say "the first side effect comes now" (a process spawned, a file opened, a socket
        connected): refusals raised before it cost the caller no ``calls`` budget. Idempotent;
        may raise ``QUOTA.BUDGET_EXCEEDED``, and then nothing may start."""
        if not self.has_started:
            self.on_start()
            self.has_started = True

    def record_side_effect(self, rec: SideEffectRec) -> None:
        self.side_effects.append(rec)


@runtime_checkable
class Executor(Protocol):
    """An isolating backend. ``execute`` raises ``PolicyEngineError`` with a registry code on a
    refusal or failure; any other exception is mapped to ``TOOL.EXECUTION_FAILED``.

    Optional members the orchestrator looks for (not part of the structural check):
    ``local: bool`` — runs on the host without extra isolation; the only kind of executor
    ``fallback_to_local`` may fall back to. ``charges_at_start: bool`` — it calls
    ``ctx.started()`` before its first side effect, so the orchestrator charges ``calls`` there
    and a refusal before it is free (without it, ``calls`` is charged before ``execute``).
    ``available() -> bool | str`` — ``True`` when the
    backend can take calls now, else ``False`` or the reason (``PROVIDER.UNAVAILABLE``).
    ``refusal(profile, op) -> PolicyEngineError | None`` — the refusal ``execute`` would raise
    for ``op`` under ``profile``, decided from those two and the executor's settings alone
    (nothing run, nothing contacted); the backend selection asks it, so the dry run
    (``explain --config``, ``/v1/decide``) answers it and the run reports it as a deny.
    ``execute`` must raise exactly this refusal (use :func:`refusal_of`).
    """

    name: str
    capabilities: ExecutorCapabilities

    def execute(self, ctx: ExecContext, op: ExecOp) -> ExecResult:
        """Run ``op`` (already allowed by the guard) under ``ctx.profile``."""
        ...

    def close(self) -> None:
        """Release pools, browsers, temp spaces; called once at shutdown."""
        ...


def refusal_of(executor: object, profile: Profile, op: ExecOp) -> PolicyEngineError | None:
    """``executor.refusal(profile, op)`` when it has one (the selection and ``execute`` both
    ask through here, so what a dry run answers and what the run raises cannot drift); a
    check that crashes refuses the call (``PROVIDER.UNAVAILABLE``, fail closed)."""
    check = getattr(executor, "refusal", None)
    if not callable(check):
        return None
    try:
        found = check(profile, op)
    except PolicyEngineError as exc:  # raised rather than returned: the same refusal
        return exc
    except Exception as exc:  # noqa: BLE001 — a broken check must not let the call through
        return PolicyEngineError(ErrorCode.PROVIDER_UNAVAILABLE,
                                 f"backend `{getattr(executor, 'name', '?')}` could not check "
                                 f"the call: {type(exc).__name__}: {exc}")
    return found if isinstance(found, PolicyEngineError) else None


def check_string_lists(opts: dict[str, Any], keys: tuple[str, ...], owner: str) -> None:
    """Executor options: each of ``keys`` a list of strings (made a tuple in place);
    ``env_base`` sets only PATH, LANG and TZ. Raises ``ValueError`` naming ``owner``."""
    for key in keys:
        v = opts.get(key, ())
        if not isinstance(v, list | tuple) or not all(isinstance(x, str) for x in v):
            raise ValueError(f"{owner}: `{key}` must be a list of strings")
        opts[key] = tuple(v)
    base = opts.get("env_base", {})
    if not isinstance(base, dict) or set(base) - {"PATH", "LANG", "TZ"}:
        raise ValueError(f"{owner}: `env_base` may only set PATH, LANG and TZ")
