"""Seed 003's `SandboxExecutor.run`: one command under the sandbox config, through the orchestrator.

Each run is an ordinary guarded `proc.exec` call: the config's generated policy
(``sbpolicy_gen.py``) decides it, the configured proc backend (``proc-bwrap`` by default) runs
it, and begin/end evidence is written. A command the engine refuses comes back as a permission
error (``blocked``, the seed's "silent deny"), and the runner takes the next command as usual.

``enabled: false`` never means "run unconfined": the runner refuses, unless the engine
configuration itself chooses a compat run on the ``local`` backend (``backends: {proc.exec:
local}``, ``mode: compat``), which the evidence records as degraded.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from policy_engine.config import EngineConfig
from policy_engine.confirm.services import ConfirmationService, DenyConfirmation
from policy_engine.errors import DiagnosticsError, ErrorCode, PolicyEngineError
from policy_engine.executor import ExecContext
from policy_engine.gateway.call import Call, Gateway
from policy_engine.guard.argv import check_argv_shape
from policy_engine.model import Decision, OpKind, ProcExecOp, Profile
from policy_engine.orchestration.budgeting import call_limits
from policy_engine.orchestration.selection import select
from policy_engine.orchestrator import Orchestrator
from policy_engine.plugin_manager import PluginManager
from policy_engine.refusal import engine_refusal
from policy_engine.sandbox.enginedirs import protected_trees
from policy_engine.sandbox_config.sbconfig import (
    ENV_ENABLED,
    LoadedSandboxConfig,
    describe_problem,
    load_sandbox_config,
)
from policy_engine.sandbox_config.sbexpand import usable_home, whitelist_refusal
from policy_engine.sandbox_config.sbpolicy_gen import SandboxPolicy, build_sandbox_policy

log = logging.getLogger(__name__)
BLOCKED_EXIT = 1  # the seed's SandboxResult for a blocked command
MAX_CACHED_POLICIES = 64  # compiled policies kept per runner, one per (cwd, tool)
INVALID_TOOL = "invalid-command"
"""The tool a generated policy names when argv[0] is no valid tool (a shell string, a newline):
the op still goes to the guard, which refuses it (``POLICY.DENY_TOOL``) and leaves evidence."""


class SandboxDisabledError(PolicyEngineError):
    """``enabled: false`` and no explicit compat run on the ``local`` backend."""


@dataclass(slots=True)
class SandboxResult:
    """Seed 003 ``SandboxResult`` plus what the engine adds (code, evidence, backend)."""

    stdout: str
    stderr: str
    exit_code: int
    blocked: bool
    blocked_reason: str | None = None
    code: str | None = None
    envelope_id: str | None = None
    backend: str | None = None
    rule: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    refusal: dict[str, Any] | None = None  # the refusal document (policy_engine/refusal.py)

    def to_json(self) -> dict[str, Any]:
        return {"stdout": self.stdout, "stderr": self.stderr, "exitCode": self.exit_code,
                "blocked": self.blocked, "blockedReason": self.blocked_reason,
                "code": self.code, "evidence": self.envelope_id, "backend": self.backend,
                "rule": self.rule, "refusal": self.refusal, **self.extra}


def disabled_refusal(loaded: LoadedSandboxConfig, engine: EngineConfig) -> str | None:
    """Why a disabled sandbox may not run (``None`` when it is enabled or a compat run on the
    ``local`` backend was chosen explicitly)."""
    if loaded.config.enabled:
        return None
    if engine.backends.get(OpKind.PROC_EXEC) == "local" and engine.mode == "compat":
        return None
    where = (f"`{ENV_ENABLED}`" if loaded.config.enabled_origin.startswith("$")
             else f"`enabled: false` at {loaded.config.enabled_origin}")
    return (f"the sandbox is disabled by {where}, and policy-engine never runs a command "
            "unconfined; remove the setting, or choose the unisolated runner explicitly in the "
            "engine config (`backends: {proc.exec: local}` and `mode: compat`; recorded as "
            "degraded)")


class SandboxRunner:
    """Runs commands under one loaded sandbox configuration; reuse it for many commands.

    :param loaded: the configuration (default: :func:`load_sandbox_config` from ``env``).
    :param engine: the engine configuration (backends, state dir, evidence sinks, mode).
    :param env: where ``HOME`` and ``TMPDIR`` come from (default ``os.environ``).
    :param warn: log the config's problems and notes as warnings (the CLI prints them itself).
    :param subject: who the evidence names as subject and consenting (default
        ``local-user:<login>``), e.g. ``agent:builder-7`` for an agent runtime's commands.
    :param confirmation: ask this service for each command's consent instead of recording the
        person running it as consenting (an agent runtime's commands: `sandbox exec
        --confirm webhook`); the gateway asks it about the command's own decision.
    """

    def __init__(self, loaded: LoadedSandboxConfig | None = None, *,
                 engine: EngineConfig | None = None, env: Mapping[str, str] | None = None,
                 plugins: PluginManager | None = None, warn: bool = True,
                 subject: str | None = None,
                 confirmation: ConfirmationService | None = None) -> None:
        self.env = dict(os.environ if env is None else env)
        self.loaded = loaded or load_sandbox_config(env=self.env)
        self.engine = engine or EngineConfig()
        self.home = usable_home(self.env)[0]
        self.env["HOME"] = self.home
        self._plugins = plugins
        self.subject = subject
        self.confirmation = confirmation
        self._orch: Orchestrator | None = None
        self._policies: dict[tuple[str, str], SandboxPolicy] = {}
        for problem in self.loaded.problems if warn else ():  # loudly (and in the evidence)
            log.warning("sandbox config refused, strict defaults in force: %s",
                        describe_problem(problem))
        for note in self.loaded.notes if warn else ():
            log.warning("sandbox config: %s", note)

    # -- the policy of one command -----------------------------------------------------------

    def policy_for(self, argv: Sequence[str], cwd: str | None = None) -> SandboxPolicy:
        """The generated, compiled policy (and grant, manifest) ``argv`` in ``cwd`` runs under.

        :raises PolicyEngineError: ``SANDBOX.CAPABILITY_BLOCKED`` for a working directory the
            sandbox may not make writable, ``SCHEMA.VALIDATION_FAILED`` for an empty argv.
        """
        if not argv or not argv[0]:
            raise PolicyEngineError(ErrorCode.SCHEMA_VALIDATION_FAILED, "no command given")
        where = self.working_dir(cwd)
        tool = argv[0]
        try:  # the guard's own argv check, before the tool's name is written into the policy
            check_argv_shape(tool, tuple(argv[1:]))
        except PolicyEngineError:
            tool = INVALID_TOOL  # the guard refuses the op itself (with evidence)
        key = (where, tool)
        cached = self._policies.get(key)
        if cached is None:
            origin = (f"`{self.loaded.path}`" if self.loaded.found and not self.loaded.fallback
                      else "the built-in defaults")
            try:
                cached = build_sandbox_policy(
                    self.loaded.config, cwd=where, tool=tool, home=self.home,
                    state_dir=self.engine.state_dir, origin=origin,
                    tmpdir=self.env.get("TMPDIR"), subject=self.subject,
                    engine=protected_trees(self.env),
                    config_file=str(self.loaded.path) if self.loaded.found else None)
            except DiagnosticsError as exc:  # vetted entries compile: this is a bug
                raise PolicyEngineError(ErrorCode.UNKNOWN_INTERNAL, "the generated sandbox "
                                        f"policy does not compile: {exc}") from None
            if len(self._policies) >= MAX_CACHED_POLICIES:  # a long-lived runner, many tools
                self._policies.pop(next(iter(self._policies)))
            self._policies[key] = cached
        return cached

    def working_dir(self, cwd: str | None) -> str:
        """The resolved working directory, refused when it may not be made writable."""
        raw = os.path.abspath(cwd if cwd is not None else os.getcwd())
        real = os.path.realpath(raw)
        unfit = _unfit_path(real)
        if unfit is not None:  # it is written into the generated policy: vetted first
            raise PolicyEngineError(
                ErrorCode.CAPABILITY_BLOCKED, f"the working directory {ascii(real)} {unfit}; "
                "run from (or pass --cwd) a directory whose path has neither")
        if not os.path.isdir(real):
            raise PolicyEngineError(ErrorCode.SCHEMA_VALIDATION_FAILED,
                                    f"working directory `{raw}` is not a directory")
        why = whitelist_refusal(real, os.path.realpath(self.home))
        if why is not None:
            raise PolicyEngineError(
                ErrorCode.CAPABILITY_BLOCKED, f"the working directory is made writable in the "
                f"sandbox, and {why}; run from (or pass --cwd) a project directory")
        return real

    # -- running -------------------------------------------------------------------------------

    def orchestrator(self, policy: SandboxPolicy) -> Orchestrator:
        if self._orch is None:
            self._orch = Orchestrator(policy.policyset, config=self.engine,
                                      plugins=self._plugins)
        elif self._orch.policyset is not policy.policyset:
            self._orch.swap_policy(policy.policyset)
        return self._orch

    def decide(self, argv: Sequence[str], cwd: str | None = None) -> tuple[Decision, Profile,
                                                                          ProcExecOp]:
        """What the guard decides for ``argv`` (nothing runs): `sandbox profile` and tests."""
        policy = self.policy_for(argv, cwd)
        orch = self.orchestrator(policy)
        op = self._op(argv, policy, cwd)
        profile = orch.builder.build(policy.grant, policy.manifest, settings=policy.settings)
        return orch.guard.decide(profile, op), profile, op

    def preview(self, argv: Sequence[str], cwd: str | None = None) -> dict[str, Any]:
        """What would run for ``argv``: the decision, the backend and the argv it would spawn
        (its ``preview_command``); nothing runs and no evidence is written."""
        decision, profile, op = self.decide(argv, cwd)
        out: dict[str, Any] = {"decision": decision.decision, "code": decision.code,
                               "reason": decision.reason,
                               "rule": decision.rule.id if decision.rule else None,
                               "profile_hash": profile.profile_hash}
        if not decision.allowed:
            return out
        assert self._orch is not None  # INVARIANT: decide() built it
        sel = select(self._orch.components.executors, self.engine, profile, OpKind.PROC_EXEC,
                     op)
        out["backend"] = sel.backend
        if sel.error is not None or sel.executor is None:
            out["error"] = sel.error.reason if sel.error else "no backend"
            return out
        previewer = getattr(sel.executor, "preview_command", None)
        if not callable(previewer):
            out["error"] = f"backend `{sel.backend}` cannot show the command it would run"
            return out
        # the run's guard: the executor masks what it knows (the engine's state dir) as the run
        ctx = ExecContext(profile=profile, deadline=float("inf"),
                          limits=call_limits(decision, profile), guard=self._orch.guard)
        try:
            out["argv"] = list(previewer(ctx, op))
            # host-wide globs over a whole-host bind: masked by the run, not searched here
            later = getattr(sel.executor, "masked_at_run", ())
            if later:
                out["masked_at_run"] = list(later)
        except PolicyEngineError as exc:
            out["error"] = f"{exc.code.value}: {exc.reason}"
        return out

    def preview_sbpl(self, argv: Sequence[str], cwd: str | None = None) -> dict[str, Any]:
        """What macOS would run for ``argv``: the decision and the ``sandbox-exec`` profile the
        ``macos-sandbox-exec`` backend generates from the same profile (without the per-call
        private ``TMPDIR`` rule it adds at run time); nothing runs, on any platform."""
        from policy_engine.sandbox.sbpl import SbplPathError, render_sbpl

        decision, profile, _op = self.decide(argv, cwd)
        out: dict[str, Any] = {"decision": decision.decision, "code": decision.code,
                               "reason": decision.reason,
                               "rule": decision.rule.id if decision.rule else None,
                               "profile_hash": profile.profile_hash,
                               "backend": "macos-sandbox-exec"}
        if not decision.allowed:
            return out
        try:
            out["sbpl"] = render_sbpl(profile)
        except SbplPathError as exc:
            out["error"] = str(exc)
            return out
        out["argv"] = ["/usr/bin/sandbox-exec", "-p", out["sbpl"], "--", *argv]
        return out

    def _op(self, argv: Sequence[str], policy: SandboxPolicy, cwd: str | None) -> ProcExecOp:
        return ProcExecOp(tool=argv[0], args=tuple(argv[1:]), cwd=policy.writable[0].path,
                          timeout_ms=None)

    def run(self, argv: Sequence[str], cwd: str | None = None) -> SandboxResult:
        """Run ``argv`` (never a shell string: pass ``["bash", "-c", cmd]`` for one) in the
        sandbox; a refusal is a ``blocked`` result, never an exception, so a caller simply
        goes on with its next command.

        :raises SandboxDisabledError: the sandbox is disabled (see :func:`disabled_refusal`).
        """
        why = disabled_refusal(self.loaded, self.engine)
        if why is not None:
            raise SandboxDisabledError(ErrorCode.PERMISSION_DENY, why)
        try:
            policy = self.policy_for(argv, cwd)
        except PolicyEngineError as exc:
            res = _blocked(exc.code.value, exc.reason)
            res.refusal = engine_refusal(exc, "service" if exc.code is ErrorCode.
                                         SCHEMA_VALIDATION_FAILED else "policy").to_json()
            return res
        orch = self.orchestrator(policy)
        grant = policy.grant
        if self.confirmation is not None:  # the approver, not the runner, consents
            grant = grant.model_copy(update={"consent": None})
        gateway = Gateway.with_service(orch, self.confirmation or DenyConfirmation())
        called = gateway.run(Call(grant, policy.manifest, self._op(argv, policy, cwd),
                                  settings=policy.settings,
                                  annotations={"sandbox_config": self._note(policy)}))
        outcome = called.outcome
        r, d = outcome.result, outcome.decision
        rule = d.rule.id if d.rule is not None else None
        if not r.ok:
            code, message = r.code or ErrorCode.UNKNOWN_INTERNAL.value, r.message or "failed"
            res = _blocked(code, message)
            if outcome.end.status != "denied":  # it failed (timeout, backend): not a refusal
                res.blocked, res.blocked_reason = False, None
                res.stderr = f"{code}: {message}\n"
            res.envelope_id, res.rule = outcome.envelope_id, rule
            res.backend = outcome.end.sandbox_backend
            res.refusal = called.refusal.to_json() if called.refusal else None
            return res
        out = r.out
        return SandboxResult(
            stdout=str(out.get("stdout", "")), stderr=str(out.get("stderr", "")),
            exit_code=int(out.get("exit_code", 0)), blocked=False, code=None,
            envelope_id=outcome.envelope_id, backend=outcome.end.sandbox_backend, rule=rule,
            extra={"network": out.get("network"), "masked": len(out.get("masked") or ())})

    def _note(self, policy: SandboxPolicy) -> dict[str, Any]:
        """What the evidence records about the config (paths and digests, no contents)."""
        lo = self.loaded
        return {"file": lo.path, "found": lo.found, "sha256": lo.digest,
                "fallback_to_defaults": lo.fallback,
                "problems": [describe_problem(p) for p in lo.problems],
                "network_requested": lo.config.network_requested,
                "policy": str(policy.path)}

    def close(self) -> None:
        if self._orch is not None:
            self._orch.close()
            self._orch = None

    def __enter__(self) -> SandboxRunner:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


_REFUSALS = frozenset({ErrorCode.PERMISSION_DENY.value, ErrorCode.CAPABILITY_BLOCKED.value,
                       ErrorCode.DENY_TOOL.value})


def _blocked(code: str, reason: str) -> SandboxResult:
    """A refusal is the seed's permission error; anything else (malformed input) says what."""
    if code in _REFUSALS:
        return SandboxResult(stdout="", stderr=f"Permission denied: {code}: {reason}\n",
                             exit_code=BLOCKED_EXIT, blocked=True, blocked_reason=reason,
                             code=code)
    return SandboxResult(stdout="", stderr=f"error: {code}: {reason}\n", exit_code=BLOCKED_EXIT,
                         blocked=False, code=code)


def _unfit_path(path: str) -> str | None:
    """Why ``path`` cannot be named in a generated policy: a control character (a newline would
    end the string literal) or bytes that are not UTF-8 (``os.fsdecode`` surrogates)."""
    if any(ord(ch) < 0x20 or ord(ch) == 0x7F for ch in path):
        return "contains a control character"
    try:
        path.encode("utf-8")
    except UnicodeEncodeError:
        return "is not valid UTF-8"
    return None
