"""Registers the `local` executor through the public hook (entry point ``executor_local``)."""

from __future__ import annotations

from plugins.executor_local.executor import LocalExecutor
from plugins.executor_proc.executor import ProcOptions
from policy_engine.config import EngineConfig
from policy_engine.executor import Executor
from policy_engine.hookspecs import hookimpl


@hookimpl
def policy_engine_executors(config: EngineConfig) -> list[Executor]:
    """Built with the ``proc`` plugin options (one ``run_as``, ``env_allow``, quotas); the
    engine's state directory is kept out of its host view."""
    return [LocalExecutor(ProcOptions.parse(config.plugin_options("proc")), mode=config.mode,
                          hidden=(str(config.state_dir),), warm_ahead=config.warm_ahead)]
