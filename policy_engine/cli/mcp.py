"""`policy-engine mcp`: the skills as MCP tools over stdio or streamable HTTP (docs/mcp.md)."""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

import click

from policy_engine.cli.common import EXIT_BAD_INPUT, engine_config_or_exit, load_or_exit
from policy_engine.cli.confirming import confirm_options, confirmation_service
from policy_engine.compiler import compile_files
from policy_engine.config import EngineConfig

if TYPE_CHECKING:
    from policy_engine.gateway.call import Gateway
    from policy_engine.mcp.ops import OpTool
    from policy_engine.mcp.session_tools import SessionTools
    from policy_engine.runcode.manager import OrchestratorPool
    from policy_engine.skills.invoke import SkillInvoker

_FILE = click.Path(dir_okay=False, path_type=Path)
_DIR = click.Path(file_okay=False, path_type=Path)


def _fail(message: str) -> NoReturn:
    click.echo(f"error: {message}", err=True)
    sys.exit(EXIT_BAD_INPUT)


@click.command("mcp")
@click.option("--policy", "policies", multiple=True, required=True, type=_FILE,
              help="a .sbpolicy file (repeatable; imports are followed)")
@click.option("--skills", "skills_dir", type=_DIR, default=Path("skills"), show_default=True,
              help="the directory of <id>/manifest.json skills")
@click.option("--manifest", "manifests", multiple=True, type=_FILE,
              help="a tool manifest offered as the tool `op.<name>`: one guarded op of a kind "
              "it declares, granted its permissions (repeatable)")
@click.option("--config", "config_path", type=_FILE, help="engine configuration (YAML/JSON)")
@click.option("--state-dir", type=_DIR, help="evidence and budgets (overrides the config)")
@click.option("--root-fs", type=_DIR, default=Path("/workspace"), show_default=True,
              help="where fs skills find inputs/, work/ and artifacts/")
@click.option("--transport", type=click.Choice(["stdio", "http"]), default="stdio",
              show_default=True)
@click.option("--tenant", help="stdio: the tenant every call runs as (required for stdio)")
@click.option("--subject", help="stdio: the subject every call runs as (required for stdio)")
@click.option("--host", default="127.0.0.1", show_default=True, help="http: address")
@click.option("--port", default=8788, show_default=True, type=click.IntRange(0, 65535),
              help="http: port (0 picks a free one; the chosen port is printed)")
@click.option("--rate-per-minute", default=6000, show_default=True, type=click.IntRange(1),
              help="http: requests per tenant per minute (counted by the budget meter)")
@click.option("--sessions", "with_sessions", is_flag=True,
              help="offer the session tools `session.*` (create, run_code, execs with progress "
              "and cancel, files: docs/mcp.md); the policy must permit them (docs/sessions.md)")
@click.option("--workspace", type=_DIR, help="sessions: the root of their workspaces "
              "(default STATE_DIR/workspace)")
@click.option("--security-mode", type=click.Choice(["strict", "permissive"]), default="strict",
              show_default=True, help="sessions: the default mode (strict: docker for `auto`)")
@confirm_options
def command(policies: tuple[Path, ...], skills_dir: Path, manifests: tuple[Path, ...],
            config_path: Path | None,
            state_dir: Path | None, root_fs: Path, transport: str, tenant: str | None,
            subject: str | None, host: str, port: int, rate_per_minute: int,
            with_sessions: bool, workspace: Path | None, security_mode: str,
            confirm_mode: str, approver_url: str | None, approver_secret_file: Path | None,
            approver_timeout: float) -> None:
    """Serve the skills as MCP tools `skill.<id>`; every call is decided by the policy and
    leaves evidence. stdio runs as one tenant; http takes the service's bearer tokens.

    Exits 2 on unusable input (policy, skills, config, address in use).
    """
    try:
        from policy_engine.mcp.ops import OpTool
        from policy_engine.mcp.server import build_server
        from policy_engine.mcp.transports import fixed_principal, run_stdio
    except ImportError:
        _fail("the MCP server needs the `mcp` extra: pip install 'policy-engine[mcp]'")
    from policy_engine.compiler.loaders import load_manifest
    from policy_engine.gateway.call import Gateway
    from policy_engine.orchestrator import Orchestrator
    from policy_engine.runcode.manager import OrchestratorPool
    from policy_engine.skills.check import load_skills
    from policy_engine.skills.invoke import SkillInvoker

    if transport == "stdio" and not (tenant and subject):
        _fail("--transport stdio runs as one tenant: give --tenant and --subject")
    if tenant is not None:
        from policy_engine.tokens import check_tenant

        try:  # the same names tokens allow: a tenant names directories
            check_tenant(tenant)
        except ValueError as exc:
            _fail(str(exc))
    if subject is not None and not (0 < len(subject) <= 200 and subject.isprintable()):
        _fail("--subject must be 1-200 printable characters")
    engine = engine_config_or_exit(config_path, state_dir)
    confirm = confirmation_service(confirm_mode, approver_url, approver_secret_file,
                                   approver_timeout, stdin_is_protocol=transport == "stdio",
                                   state_dir=engine.state_dir)
    from policy_engine import tracing

    problem = tracing.configure()  # OTLP export when OTEL_EXPORTER_OTLP_ENDPOINT is set
    if problem is not None:
        _fail(problem)
    policyset = load_or_exit(lambda: compile_files(policies))
    skills = load_or_exit(lambda: load_skills(skills_dir))
    op_tools = tuple(OpTool(load_or_exit(lambda p=path: load_manifest(p)))  # type: ignore[misc]
                     for path in manifests)
    # logs go to stderr: on stdio, stdout is the protocol
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr,
                        format="%(levelname)s %(name)s: %(message)s")
    orch = Orchestrator(policyset, config=engine)
    pool = OrchestratorPool(policyset, engine, holder=orch.holder)
    invoker = SkillInvoker(skills, policyset, engine, fs_root=str(root_fs.absolute()),
                           orchestrator=orch, pool=pool)
    gateway = Gateway.with_service(orch, confirm)
    tools = _session_tools(pool, gateway, engine, workspace, security_mode, invoker) \
        if with_sessions else None
    try:
        if transport == "stdio":
            import anyio

            server = build_server(invoker, fixed_principal(str(tenant), str(subject)),
                                  op_tools, gateway, tools)
            anyio.run(run_stdio, server)
        else:
            _serve_http(invoker, gateway, op_tools, engine, host, port, rate_per_minute,
                        tools)
    finally:
        if tools is not None:
            tools.sessions.close()
        pool.close()
        orch.close()


def _session_tools(pool: OrchestratorPool, gateway: Gateway, engine: EngineConfig,
                   workspace: Path | None, security_mode: str,
                   invoker: SkillInvoker) -> SessionTools:
    """The session runtime the service would run on this state directory (its session
    store: PostgreSQL under ``service_postgres``, else ``STATE_DIR/sessions.db``)."""
    from policy_engine.gateway.session_runtime import Sessions
    from policy_engine.mcp.session_tools import SessionTools
    from policy_engine.runcode.risk import SecurityMode
    from policy_engine.service.pg_sessions import open_session_store
    from policy_engine.service.pg_stores import StoreUnavailable

    root = (workspace or engine.state_dir / "workspace").absolute()
    try:
        store = open_session_store(engine)
    except ValueError as exc:
        _fail(str(exc))
    except StoreUnavailable as exc:
        _fail(exc.reason)
    return SessionTools(Sessions(pool, gateway, config=engine, workspace_root=root,
                                 default_mode=SecurityMode(security_mode), store=store),
                        invoker=invoker if invoker.skills else None)


def _serve_http(invoker: SkillInvoker, gateway: Gateway, op_tools: tuple[OpTool, ...],
                engine: EngineConfig, host: str, port: int, rate_per_minute: int,
                sessions: SessionTools | None) -> None:
    import uvicorn

    from policy_engine.mcp.server import build_server
    from policy_engine.mcp.transports import http_app, token_principal
    from policy_engine.service.guards import charge_rate
    from policy_engine.service.listen import tcp_listener
    from policy_engine.service.pg_stores import StoreUnavailable, open_token_store
    from policy_engine.tokens import Principal

    try:  # the service's tokens: PostgreSQL under service_postgres, else tokens.sqlite
        tokens = open_token_store(engine)
    except ValueError as exc:
        _fail(str(exc))
    except StoreUnavailable as exc:
        _fail(exc.reason)
    try:
        sock = tcp_listener(host, port)  # TCP_NODELAY on every connection (issue 27)
    except OSError as exc:
        _fail(f"cannot listen on {host}:{port}: {exc.strerror}")
    bound = sock.getsockname()[1]
    meter = invoker.orch.meter

    def admit(who: Principal) -> None:  # the service's per-tenant rate, the same meter key
        charge_rate(meter, who.tenant, rate_per_minute)

    app = http_app(build_server(invoker, token_principal(tokens), op_tools, gateway,
                                sessions), tokens,
                   host=host, admit=admit)
    click.echo(f"policy-engine mcp: listening on http://{host}:{bound}/mcp "
               f"(state {engine.state_dir})", err=True)
    try:
        uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False,
                                      lifespan="on")).run(sockets=[sock])
    finally:
        tokens.close()
