"""`policy-engine run`: run one op under policies, a manifest and a grant, writing evidence."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import click

from policy_engine import tracing
from policy_engine.cli.common import (
    EXIT_BAD_INPUT,
    EXIT_FAILED,
    EXIT_OK,
    echo_json,
    engine_config_or_exit,
    format_option,
    load_or_exit,
)
from policy_engine.cli.confirming import confirm_options, confirmation_service
from policy_engine.compiler import compile_files
from policy_engine.compiler.loaders import load_grant, load_manifest
from policy_engine.explain.request import ExplainRequest, load_request, resolve_fixture
from policy_engine.gateway.call import Call, Gateway
from policy_engine.gateway.outcome import Called
from policy_engine.model import ProcExecOp
from policy_engine.orchestrator import Orchestrator

_FILE = click.Path(dir_okay=False, path_type=Path)


def _bad_input(message: str) -> None:
    click.echo(f"error: {message}", err=True)
    sys.exit(EXIT_BAD_INPUT)


def _render(called: Called) -> str:
    outcome = called.outcome
    r, d, end = outcome.result, outcome.decision, outcome.end
    lines = [f"decision: {d.decision}" + (f" ({d.code})" if d.code else "")
             + (f" — {d.reason}" if d.reason else "")]
    if d.rule is not None:
        lines.append(f"rule: {d.rule.id} at {d.rule.file}:{d.rule.line}:{d.rule.column}")
    shadow = outcome.begin.shadow
    if shadow is not None and "decision" in shadow:
        rule = shadow.get("rule") or {}
        lines.append(f"shadow (not enforced): {shadow['decision']}"
                     + (f" ({shadow['code']})" if shadow.get("code") else "")
                     + (f" by {rule.get('id')}" if rule else ""))
    if called.asked is not None:
        seen = called.asked.seen()
        lines.append(f"consent: asked, {seen.answer} by {seen.by}")
    lines.append("result: ok" if r.ok else f"result: {r.code}: {r.message}")
    if called.refusal is not None:
        lines.append(f"refused by: {called.refusal.refused_by}")
    for key, value in r.out.items():
        lines.append(f"  {key}: {value}")
    used = {k: v for k, v in r.used.model_dump().items() if v}
    lines.append("used: " + (", ".join(f"{k}={v}" for k, v in used.items()) or "nothing"))
    extra: list[Any] = [f"backend {end.sandbox_backend or '-'}",
                        f"{end.sandbox_latency_ms} ms"]
    if end.sandbox_degraded:
        extra.append(f"degraded: {end.sandbox_degrade_reason}")
    lines.append(f"evidence: {outcome.envelope_id} ({'; '.join(extra)})")
    return "\n".join(lines)


@click.command("run", context_settings={"ignore_unknown_options": True})
@click.option("--policy", "policies", multiple=True, required=True, type=_FILE,
              help="a .sbpolicy file (repeatable; imports are followed)")
@click.option("--manifest", type=_FILE,
              help="tool manifest (JSON/YAML/.sbpolicy); default: the request's `manifest`")
@click.option("--grant", type=_FILE,
              help="grant for the call (JSON or YAML); default: the request's `grant`")
@click.option("--request", "request_path", type=_FILE,
              help='request file: {"op": ..., "overrides", "context"} (`now_ms` and '
                   '`budget_used` are ignored: a real call is decided at the current time, on '
                   'the metered budget)')
@click.option("--shadow-policy", "shadow_policies", multiple=True, type=_FILE,
              help="an audit-only .sbpolicy decided beside --policy and recorded in the "
              "evidence (`shadow`), never enforced (repeatable)")
@click.option("--config", "config_path", type=_FILE, help="engine configuration (YAML/JSON)")
@click.option("--state-dir", type=click.Path(file_okay=False, path_type=Path),
              help="where evidence, budgets and spools live (overrides the config)")
@confirm_options
@format_option
@click.argument("argv", nargs=-1, type=click.UNPROCESSED)
def command(policies: tuple[Path, ...], manifest: Path | None, grant: Path | None,
            request_path: Path | None, shadow_policies: tuple[Path, ...],
            config_path: Path | None, state_dir: Path | None, confirm_mode: str,
            approver_url: str | None, approver_secret_file: Path | None,
            approver_timeout: float, fmt: str, argv: tuple[str, ...]) -> None:
    """Run one operation: from --request FILE, or `-- TOOL ARGS...` as a proc.exec.

    Exits 0 when it ran, 1 when it was denied or failed, 2 on unusable input.
    """
    if (request_path is None) == (not argv):
        _bad_input("give exactly one of `--request FILE` or `-- TOOL ARGS...`")
    config = engine_config_or_exit(config_path, state_dir, one_call=True)
    problem = tracing.configure()  # OTLP export when OTEL_EXPORTER_OTLP_ENDPOINT is set
    if problem is not None:
        _bad_input(problem)
    policyset = load_or_exit(lambda: compile_files(policies))
    shadow = load_or_exit(lambda: compile_files(shadow_policies)) if shadow_policies else None
    if request_path is not None:
        request = load_or_exit(lambda: load_request(request_path))
        base = request_path
    else:
        if manifest is None or grant is None:
            _bad_input("`-- TOOL ARGS...` needs `--manifest FILE` and `--grant FILE`")
        request = ExplainRequest(op=ProcExecOp(tool=argv[0], args=tuple(argv[1:])))
        base = Path.cwd()
    manifest_path = manifest or load_or_exit(
        lambda: resolve_fixture(base, request.manifest, "manifest"))
    grant_path = grant or load_or_exit(lambda: resolve_fixture(base, request.grant, "grant"))
    tool = load_or_exit(lambda: load_manifest(manifest_path))
    ticket = load_or_exit(lambda: load_grant(grant_path))
    if request.now_ms is not None:
        # a real call is decided at the real time: a request file must not be able to backdate
        # the clock past a grant's or consent's expiry (`explain` and `test` honour it)
        click.echo("note: `now_ms` in the request is ignored by `run` (decided at the current "
                   "time)", err=True)
    if request.budget_used is not None:
        # the run meters the budget itself (the state store's usage), never a file's claim
        click.echo("note: `budget_used` in the request is ignored by `run` (the budget is "
                   "metered from the state dir's recorded usage)", err=True)
    service = confirmation_service(confirm_mode, approver_url, approver_secret_file,
                                   approver_timeout, state_dir=config.state_dir)
    try:
        orch = Orchestrator(policyset, config=config, shadow=shadow)
    except ValueError as exc:  # the configuration asks for a sink or meter nobody provides
        _bad_input(str(exc))
        return
    with orch:
        called = Gateway.with_service(orch, service).run(Call(
            ticket, tool, request.op, settings=request.settings, overrides=request.overrides,
            context=request.context or None))
    if fmt == "json":
        echo_json(called.to_json())
    else:
        click.echo(_render(called))
    sys.exit(EXIT_OK if called.ok else EXIT_FAILED)
