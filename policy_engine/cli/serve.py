"""`policy-engine serve`: the HTTP service (docs/service.md) on uvicorn."""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

import click

from policy_engine import tracing
from policy_engine.cli.common import (
    EXIT_BAD_INPUT,
    NumberRange,
    engine_config_or_exit,
    load_or_exit,
)
from policy_engine.cli.confirming import confirmation_service
from policy_engine.compiler import compile_files
from policy_engine.compiler.loaders import load_manifest

if TYPE_CHECKING:
    pass

_FILE = click.Path(dir_okay=False, path_type=Path)


def _fail(message: str) -> NoReturn:
    click.echo(f"error: {message}", err=True)
    sys.exit(EXIT_BAD_INPUT)


@click.command("serve")
@click.option("--policy", "policies", multiple=True, required=True, type=_FILE,
              help="a .sbpolicy file (repeatable; imports are followed)")
@click.option("--config", "config_path", type=_FILE, help="engine configuration (YAML/JSON)")
@click.option("--state-dir", type=click.Path(file_okay=False, path_type=Path),
              help="evidence, budgets, tokens and exec records (overrides the config)")
@click.option("--manifest", "manifests", multiple=True, type=_FILE,
              help="a tool manifest requests may name instead of sending it (repeatable); "
              "one named `sandbox.exec` replaces the built-in exec manifest")
@click.option("--skills", "skills_dir", type=click.Path(file_okay=False, path_type=Path),
              help="a directory of <id>/manifest.json skills to serve (GET /skills)")
@click.option("--workspace", type=click.Path(file_okay=False, path_type=Path),
              help="exec workspace root [default: STATE_DIR/workspace]")
@click.option("--root-fs", type=click.Path(file_okay=False, path_type=Path),
              help="root of the file system ops of /v1/decide and /v1/ops (operator setting)")
@click.option("--max-artifacts-bytes", default=50 * 1024 * 1024, show_default=True,
              type=click.IntRange(0), help="total size of one exec's artifacts (seed 002 §5.2)")
@click.option("--max-artifacts", default=1000, show_default=True, type=click.IntRange(1, 100_000),
              help="files of one exec listed (and other entries looked at); beyond, the "
                   "listing stops and the record says `artifacts_truncated`")
@click.option("--security-mode", type=click.Choice(["strict", "permissive"]),
              default="strict", show_default=True,
              help="run_code: strict sends anything not SAFE to a container")
@click.option("--confirmation", type=click.Choice(["deny", "auto", "webhook", "console"]),
              default="deny",
              show_default=True, help="who stands in for a missing consent (docs/service.md)")
@click.option("--approver-url", help="webhook confirmation: where signed requests are POSTed")
@click.option("--approver-secret-file", type=_FILE,
              help="webhook confirmation: the shared HMAC secret (at least 16 bytes)")
@click.option("--approver-timeout", default=30.0, show_default=True,
              type=NumberRange(0.1, 600), help="seconds to wait for the approver")
@click.option("--allow-inline-manifests", is_flag=True,
              help="accept manifests in request bodies (they declare the side effects the "
              "consent rules read); default: only --manifest files, by name")
@click.option("--host", default="127.0.0.1", show_default=True, help="address to listen on")
@click.option("--port", default=8787, show_default=True, type=click.IntRange(0, 65535),
              help="port (0 picks a free one; the chosen port is printed)")
@click.option("--max-body-bytes", default=4 * 1024 * 1024, show_default=True,
              type=click.IntRange(1024), help="largest request body accepted")
@click.option("--rate-per-minute", default=6000, show_default=True, type=click.IntRange(1),
              help="requests per tenant per minute (counted by the budget meter)")
@click.option("--max-concurrent-execs", default=2, show_default=True, type=click.IntRange(1),
              help="sandbox execs running at once (seed 002 §5.1)")
@click.option("--reload-interval", default=2.0, show_default=True,
              type=click.FloatRange(0, 3600),
              help="seconds between checks of the policy files for changes (hot reload: a "
              "bundle that compiles is swapped in for new requests; one that does not is "
              "reported by /sandbox/health and the old policy stays); 0 turns it off")
@click.option("--console", "console", is_flag=True,
              help="serve the console (evidence, approvals, policy changes) under /console/ "
              "(docs/console.md); people sign in with viewer, approver or admin tokens")
@click.option("--console-secure-cookies", is_flag=True,
              help="mark console cookies Secure (set this behind a TLS-terminating proxy)")
@click.option("--workers", default=1, show_default=True, type=click.IntRange(1, 64),
              help="worker processes accepting on the one socket (one Python process uses one "
              "core: give the number of cores for throughput); docs/service.md, `Workers`")
@click.option("--metrics-port", default=None, type=click.IntRange(0, 65535),
              help="serve Prometheus `/metrics` on this port, a listener of its own (worker i "
              "of --workers takes PORT+i; 0 picks free ones, printed); off by default")
@click.option("--metrics-host", default="127.0.0.1", show_default=True,
              help="address of the metrics listener (it shows every tenant's counts: keep it "
              "on loopback or a monitoring network)")
def command(policies: tuple[Path, ...], config_path: Path | None, state_dir: Path | None,
            manifests: tuple[Path, ...], skills_dir: Path | None, workspace: Path | None,
            root_fs: Path | None, max_artifacts_bytes: int, max_artifacts: int,
            security_mode: str, confirmation: str,
            approver_url: str | None, approver_secret_file: Path | None,
            approver_timeout: float, allow_inline_manifests: bool, host: str, port: int,
            max_body_bytes: int, rate_per_minute: int, max_concurrent_execs: int,
            reload_interval: float, console: bool, console_secure_cookies: bool,
            workers: int, metrics_port: int | None, metrics_host: str) -> None:
    """Serve the HTTP API: decide, run ops and sandbox execs for token-holding tenants.

    Exits 2 on unusable input (policy, config, manifest, address in use).
    """
    try:
        import fastapi  # noqa: F401  # the app's; checked here for one clear line
        import uvicorn
    except ImportError:
        _fail("the HTTP service needs the `serve` extra: pip install 'policy-engine[serve]'")

    from policy_engine.model import Settings
    from policy_engine.runcode.risk import SecurityMode
    from policy_engine.service.app import Engine, asgi_app, open_engine
    from policy_engine.service.coalesce import JoinedH11Protocol
    from policy_engine.service.config import ServiceConfig
    from policy_engine.service.listen import tcp_listener
    from policy_engine.service.metrics import ServiceMetrics
    from policy_engine.service.prefork import serve_workers

    engine = engine_config_or_exit(config_path, state_dir)
    problem = tracing.configure()  # OTLP export when OTEL_EXPORTER_OTLP_ENDPOINT is set
    if problem is not None:
        _fail(problem)
    if workers > 1:
        local = [f"{name}: memory" for name, kind in (("budget_meter", engine.budget_meter),
                                                      ("revocation", engine.revocation))
                 if kind == "memory"]
        if local:  # each worker would count and revoke on its own
            _fail(f"--workers {workers} needs state the workers share; the config sets "
                  f"{', '.join(local)} (per process): use sqlite (the default) or redis")
    policyset = load_or_exit(lambda: compile_files(policies))
    named = {}
    for path in manifests:
        tool = load_or_exit(lambda p=path: load_manifest(p))  # type: ignore[misc]
        named[tool.name] = tool
    skills = {}
    if skills_dir is not None:
        from policy_engine.skills.check import load_skills

        skills = load_or_exit(lambda: load_skills(skills_dir))
    confirm = confirmation_service(confirmation, approver_url, approver_secret_file,
                                   approver_timeout, state_dir=engine.state_dir)
    root = (workspace or engine.state_dir / "workspace").absolute()
    config = ServiceConfig(policyset=policyset, engine=engine, workspace_root=root,
                           manifests=named, max_body_bytes=max_body_bytes,
                           rate_per_minute=rate_per_minute,
                           max_concurrent_execs=max_concurrent_execs,
                           op_settings=(Settings(root_fs=str(root_fs.absolute()))
                                        if root_fs is not None else None),
                           security_mode=SecurityMode(security_mode), confirmation=confirm,
                           allow_inline_manifests=allow_inline_manifests,
                           max_artifacts_bytes=max_artifacts_bytes, max_artifacts=max_artifacts,
                           skills=skills,
                           policy_files=tuple(p.absolute() for p in policies),
                           reload_interval_s=reload_interval, console=console,
                           console_secure_cookies=console_secure_cookies)
    try:
        # opened here, not in the server's start-up, so a configuration naming a backend or
        # sink nobody provides is one clear line and exit 2, not a traceback
        opened = open_engine(config)
    except ValueError as exc:
        _fail(str(exc))
        return
    try:
        sock = tcp_listener(host, port)  # TCP_NODELAY on every connection (issue 27)
    except OSError as exc:
        opened.close()
        _fail(f"cannot listen on {host}:{port}: {exc.strerror}")
        return
    bound = sock.getsockname()[1]
    logging.basicConfig(level=logging.INFO, format=(
        "%(levelname)s [%(process)d] %(name)s: %(message)s" if workers > 1
        else "%(levelname)s %(name)s: %(message)s"))
    plural = f", {workers} workers" if workers > 1 else ""
    click.echo(f"policy-engine serve: listening on http://{host}:{bound} "
               f"(state {engine.state_dir}, workspace {root}{plural})", err=True)

    def run(engine_now: Engine, index: int = 0) -> None:
        import asyncio

        from policy_engine.serving import (
            SERVE_CONCURRENT_CALLS,
            bound_worker_threads,
            limit_malloc_arenas,
        )

        metrics = None
        if metrics_port is not None:
            metrics = ServiceMetrics()
            metrics.track(engine_now)
            try:
                at = metrics.serve(metrics_host, metrics_port + index if metrics_port else 0)
            except OSError as exc:
                _fail(f"cannot serve metrics on {metrics_host}:{metrics_port + index}: "
                      f"{exc.strerror or exc}")
            click.echo(f"policy-engine serve: metrics on http://{metrics_host}:{at}/metrics"
                       + (f" (worker {index})" if workers > 1 else ""), err=True)
        # each answer in one write (coalesce.py): a second segment costs as much CPU again
        server = uvicorn.Server(uvicorn.Config(asgi_app(config, engine_now, metrics=metrics),
                                               log_level="warning", access_log=False,
                                               lifespan="on", http=JoinedH11Protocol))

        async def bounded() -> None:
            # a bounded worker pool (calls wait their turn) and shared malloc arenas: an
            # address-space limit is never filled by threads (docs/service.md "Bounds")
            bound_worker_threads(SERVE_CONCURRENT_CALLS)
            await server.serve(sockets=[sock])

        limit_malloc_arenas()
        asyncio.run(bounded())

    if workers == 1:
        run(opened)
        return
    # each worker opens its own engine: SQLite connections and threads do not survive a fork
    opened.close()

    def worker(index: int) -> int:
        try:
            now = open_engine(config)
        except ValueError as exc:
            click.echo(f"error: worker {index}: {exc}", err=True)
            return EXIT_BAD_INPUT
        run(now, index)
        return 0

    sys.exit(serve_workers(sock, workers, worker,
                           lambda line: click.echo(f"policy-engine serve: {line}", err=True)))
