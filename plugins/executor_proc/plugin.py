"""Registers `proc-bwrap`, `proc-landlock` and `proc-unshare` through the public hook, as a third
party would.

All are always returned, each declaring honestly whether it can run here: a backend that
cannot (bwrap missing, Landlock disabled) refuses every call with ``PROVIDER.UNAVAILABLE`` and
its reason, rather than running unconfined.
"""

from __future__ import annotations

from plugins.executor_proc.executor import ProcExecutor, ProcOptions
from policy_engine.config import EngineConfig
from policy_engine.executor import Executor
from policy_engine.hookspecs import hookimpl


@hookimpl
def policy_engine_executors(config: EngineConfig) -> list[Executor]:
    """Validate ``config.plugin_options("proc")`` first, then construct the backends."""
    options = ProcOptions.parse(config.plugin_options("proc"))
    return [ProcExecutor(backend, options, mode=config.mode, warm_ahead=config.warm_ahead)
            for backend in ("bwrap", "landlock", "unshare")]
