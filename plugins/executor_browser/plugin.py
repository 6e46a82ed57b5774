"""Registers the `browser` executor through the public hook, exactly as a third party would."""

from __future__ import annotations

from plugins.executor_browser.executor import BrowserExecutor, BrowserOptions
from policy_engine.config import EngineConfig
from policy_engine.executor import Executor
from policy_engine.hookspecs import hookimpl


@hookimpl
def policy_engine_executors(config: EngineConfig) -> list[Executor]:
    """Validate ``config.plugin_options("browser")`` first, then construct the executor."""
    options = BrowserOptions.parse(config.plugin_options("browser"), config.state_dir)
    return [BrowserExecutor(options)]
