"""Mounts the console (``serve --console``) under ``/console``, reading the live engine."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from fastapi import FastAPI

from policy_engine.console.app import console_app
from policy_engine.console.context import ConsoleContext, evidence_sources
from policy_engine.service.config import ServiceConfig

if TYPE_CHECKING:
    from policy_engine.service.app import Engine


def mount_console(app: FastAPI, config: ServiceConfig, engine: Callable[[], Engine]) -> None:
    ctx = ConsoleContext(
        state_dir=config.engine.state_dir,
        tokens=lambda: engine().tokens,
        policyset=lambda: engine().orch.policyset,
        policy_files=config.policy_files,
        sources=evidence_sources(config.engine),
        secure_cookies=config.console_secure_cookies)
    app.mount("/console", console_app(ctx))
