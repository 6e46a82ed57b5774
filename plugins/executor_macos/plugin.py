"""Registers `macos-sandbox-exec` through the public hook, as a third party would.

Always returned, on every platform, so `policy-engine plugins` lists it and a configuration
naming it loads: off macOS it reports itself unavailable by name (``available()``) and every
call is refused with ``PROVIDER.UNAVAILABLE`` and that reason, never run unconfined.
"""

from __future__ import annotations

from plugins.executor_macos.executor import MacosOptions, MacosSandboxExecutor
from policy_engine.config import EngineConfig
from policy_engine.executor import Executor
from policy_engine.hookspecs import hookimpl


@hookimpl
def policy_engine_executors(config: EngineConfig) -> list[Executor]:
    """Validate ``config.plugin_options("macos")`` first, then construct the executor."""
    return [MacosSandboxExecutor(MacosOptions.parse(config.plugin_options("macos")))]
