"""`GET /sandbox/health` (seed 002 §5): runtime mode, workspace, docker CLI and version."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import threading
import time

from policy_engine.model import OpKind
from policy_engine.orchestrator import Orchestrator
from policy_engine.service.config import ServiceConfig
from policy_engine.service.models import Health

_CACHE_S = 30.0
_lock = threading.Lock()
_docker: tuple[float, str | None, str | None] | None = None


def _docker_facts(cli: str | None) -> tuple[str | None, str | None]:
    """Server version and context of the docker CLI, cached (health must stay cheap)."""
    global _docker
    if cli is None:
        return None, None
    with _lock:
        if _docker is not None and time.monotonic() - _docker[0] < _CACHE_S:
            return _docker[1], _docker[2]
        version = _run([cli, "version", "--format", "{{.Server.Version}}"])
        context = _run([cli, "context", "show"])
        _docker = (time.monotonic(), version, context)
        return version, context


def _run(argv: list[str]) -> str | None:
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=5, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.strip() or None if done.returncode == 0 else None


def _writable(root: str) -> bool:
    try:
        os.makedirs(root, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=root, prefix=".health-"):
            return True
    except OSError:
        return False


def health_report(config: ServiceConfig, orch: Orchestrator) -> Health:
    root = str(config.workspace_root)
    cli = shutil.which("docker")
    version, context = _docker_facts(cli)
    writable = _writable(root)
    backends = {str(k.value): config.engine.backends.get(k, "default")
                for k in (OpKind.PROC_EXEC, OpKind.FS_READ, OpKind.NET_HTTP)}
    backends["loaded"] = ", ".join(sorted(orch.components.executors))
    return Health(status="ok" if writable else "degraded",
                  runtime_mode=f"linux/{config.engine.mode}", workspace_root=root,
                  workspace_writable=writable, docker_cli_path=cli, docker_version=version,
                  docker_context=context, backends=backends)
