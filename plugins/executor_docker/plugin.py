"""Registers the `docker` executor through the public hook, exactly as a third party would."""

from __future__ import annotations

from plugins.executor_docker.engine import DockerOptions
from plugins.executor_docker.executor import DockerExecutor
from policy_engine.config import EngineConfig
from policy_engine.executor import Executor
from policy_engine.hookspecs import hookimpl


@hookimpl
def policy_engine_executors(config: EngineConfig) -> list[Executor]:
    """Validate ``config.plugin_options("docker")`` first, then construct the executor.

    Construction does not contact the engine: an unreachable engine is reported per call as
    ``PROVIDER.UNAVAILABLE``.
    """
    options = DockerOptions.parse(config.plugin_options("docker"))
    return [DockerExecutor(options, state_dir=config.state_dir, mode=config.mode,
                           warm_ahead=config.warm_ahead)]
