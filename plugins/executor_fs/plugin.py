"""Registers the `fs` executor through the public hook, exactly as a third party would."""

from __future__ import annotations

from plugins.executor_fs.executor import FsExecutor, FsOptions
from policy_engine.config import EngineConfig
from policy_engine.executor import Executor
from policy_engine.hookspecs import hookimpl


@hookimpl
def policy_engine_executors(config: EngineConfig) -> list[Executor]:
    """Validate ``config.plugin_options("fs")`` first, then construct the executor."""
    options = FsOptions.parse(config.plugin_options("fs"))
    return [FsExecutor(options)]
