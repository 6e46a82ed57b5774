"""Registers the `tmp` executor through the public hook, exactly as a third party would."""

from __future__ import annotations

from plugins.executor_tmp.executor import TmpExecutor, TmpOptions
from policy_engine.config import EngineConfig
from policy_engine.executor import Executor
from policy_engine.hookspecs import hookimpl


@hookimpl
def policy_engine_executors(config: EngineConfig) -> list[Executor]:
    """Validate ``config.plugin_options("tmp")`` first, then construct the executor."""
    options = TmpOptions.parse(config.plugin_options("tmp"))
    return [TmpExecutor(options)]
