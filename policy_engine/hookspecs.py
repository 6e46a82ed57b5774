"""Hook specifications for policy-engine plugins (executors, evidence sinks, budget meters).

Written like pytest's ``hookspec.py``: each hook is a typed function whose body is only its
docstring; call behaviour is on the decorator. Built-in executors and sinks under the top-level
``plugins/`` package implement these very hooks, exactly as a third-party plugin would.

Third-party plugins are found through the ``policy_engine.plugins`` entry-point group.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pluggy

if TYPE_CHECKING:
    from policy_engine.budget import BudgetMeter
    from policy_engine.config import EngineConfig
    from policy_engine.evidence import EvidenceSink
    from policy_engine.executor import Executor
    from policy_engine.model import Decision, ExecOp, Profile
    from policy_engine.orchestration.revocation import RevocationWatcher

PROJECT_NAME = "policy_engine"
ENTRY_POINT_GROUP = "policy_engine.plugins"

HOOK_API_VERSION = (1, 0)
"""The version of these hooks and of the executor contract (docs/plugins.md, "Hook API
version"). The minor grows when something is added that existing plugins may ignore (a hook, an
optional argument, an `ExecContext` field, an optional executor member); the major when a hook
or field is removed or changes meaning. A plugin may declare the version it was written for as
a module (or object) attribute ``POLICY_ENGINE_HOOK_API = "1.0"``: it is refused at load time
(`policy-engine plugins` names it) when the major differs or the minor is newer than this."""
HOOK_API_ATTRIBUTE = "POLICY_ENGINE_HOOK_API"

hookspec = pluggy.HookspecMarker(PROJECT_NAME)
hookimpl = pluggy.HookimplMarker(PROJECT_NAME)


# -------------------------------------------------------------------------
# Initialization hooks
# -------------------------------------------------------------------------


@hookspec(historic=True)
def policy_engine_configure(config: EngineConfig) -> None:
    """Called once the engine configuration is known.

    Historic: a plugin registered later still receives the call.

    :param config: the engine configuration.
    """


# -------------------------------------------------------------------------
# Factory hooks: executors, evidence sinks, budget meters
# -------------------------------------------------------------------------


@hookspec
def policy_engine_executors(config: EngineConfig) -> list[Executor]:
    """Return the executors this plugin provides (possibly none).

    Validate ``config.plugin_options(<name>)`` before constructing anything; raise ``ValueError``
    with a clear message when it is invalid.

    :param config: the engine configuration.
    :return: executors; each declares its ``capabilities`` and a unique ``name``.
    """


@hookspec
def policy_engine_evidence_sinks(config: EngineConfig) -> list[EvidenceSink]:
    """Return the evidence sinks this plugin provides.

    :param config: the engine configuration (``config.state_dir`` is where files belong).
    :return: sinks; each has a unique ``name``. Only those named in ``config.evidence_sinks``
        receive events.
    """


@hookspec(firstresult=True)
def policy_engine_budget_meter(config: EngineConfig) -> BudgetMeter | None:
    """Return the budget meter named by ``config.budget_meter``, or ``None`` if not this plugin's.

    Stops at the first non-``None`` result.

    :param config: the engine configuration.
    """


@hookspec(firstresult=True)
def policy_engine_revocation_list(config: EngineConfig) -> RevocationWatcher | None:
    """Return the revocation list named by ``config.revocation`` (one that is not built in,
    e.g. ``redis``), or ``None`` if not this plugin's. Stops at the first non-``None`` result.

    :param config: the engine configuration.
    """


# -------------------------------------------------------------------------
# Observation hooks
# -------------------------------------------------------------------------


@hookspec
def policy_engine_decision(profile: Profile, op: ExecOp, decision: Decision) -> None:
    """Observe every guard decision (allow or deny) before anything runs.

    Must not raise and must not block: it runs on the hot path.

    :param profile: the call's profile.
    :param op: the operation decided on.
    :param decision: the guard's decision.
    """
