"""`policy-engine sandbox`: the seed 003 sandbox config — show it, check it, run under it."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from policy_engine.cli.common import (
    EXIT_BAD_INPUT,
    EXIT_FAILED,
    EXIT_OK,
    NumberRange,
    echo_json,
    engine_config_or_exit,
    format_option,
)
from policy_engine.cli.confirming import MODES, confirmation_service
from policy_engine.errors import ErrorCode, PolicyEngineError
from policy_engine.sandbox_config.sbconfig import LoadedSandboxConfig, load_sandbox_config
from policy_engine.sandbox_runner.runner import SandboxDisabledError, SandboxRunner

if TYPE_CHECKING:
    from policy_engine.confirm.services import ConfirmationService

_FILE = click.Path(dir_okay=False, path_type=Path)
_DIR = click.Path(file_okay=False, path_type=Path)
config_option = click.option(
    "--config", "config_path", type=_FILE,
    help="the sandbox.json to read (default: $POLICY_ENGINE_SANDBOX_CONFIG, else "
         "$XDG_CONFIG_HOME/policy-engine/sandbox.json, else ~/.config/policy-engine/sandbox.json)")
engine_option = click.option("--engine-config", "engine_path", type=_FILE,
                             help="engine configuration (YAML/JSON): backends, state_dir, mode")
state_option = click.option("--state-dir", type=_DIR,
                            help="where evidence and the generated policy live")
cwd_option = click.option("--cwd", type=click.Path(path_type=Path),
                          help="the working directory (whitelisted for the run; default: .)")


def _warn_loudly(loaded: LoadedSandboxConfig) -> None:
    """Every problem with its source line and caret, on stderr (seed 003 test 14: loudly)."""
    from policy_engine.dsl.render import render_diagnostic

    color = sys.stderr.isatty()
    for diag in loaded.problems:
        click.echo(render_diagnostic(diag, color=color), err=True)
    if loaded.fallback:
        click.echo(f"warning: sandbox config `{loaded.path}` refused "
                   f"({len(loaded.problems)} problem(s)); the strict defaults are in force",
                   err=True)
    for note in loaded.notes:
        click.echo(f"warning: {note}", err=True)


def _runner(config_path: Path | None, engine_path: Path | None,
            state_dir: Path | None, confirmation: ConfirmationService | None = None
            ) -> SandboxRunner:
    engine = engine_config_or_exit(engine_path, state_dir, one_call=True)
    loaded = load_sandbox_config(config_path)
    _warn_loudly(loaded)
    return SandboxRunner(loaded, engine=engine, warn=False, confirmation=confirmation)


@click.group("sandbox")
def command() -> None:
    """The sandbox config (seed 003 `sandbox.json`) and running commands under it.

    See docs/sandbox-config.md.
    """


@command.command("show")
@config_option
@engine_option
@state_option
@cwd_option
@format_option
def show(config_path: Path | None, engine_path: Path | None, state_dir: Path | None,
         cwd: Path | None, fmt: str) -> None:
    """The effective config: where each entry came from, and the policy generated from it."""
    with _runner(config_path, engine_path, state_dir) as runner:
        data: dict[str, Any] = runner.loaded.to_json()
        data["protected"] = [str(runner.engine.state_dir)]  # blacklisted too (sbpolicy_gen)
        try:
            policy = runner.policy_for(["COMMAND"], str(cwd) if cwd else None)
            data["run_whitelist"] = [e.to_json() for e in policy.writable]
            data["policy_file"], data["policy"] = str(policy.path), policy.source
        except PolicyEngineError as exc:
            data["policy_error"] = f"{exc.code.value}: {exc.reason}"
    if fmt == "json":
        echo_json(data)
        return
    click.echo(_render_show(data))


def _render_show(data: dict[str, Any]) -> str:
    state = ("refused, strict defaults in force" if data["fallback_to_defaults"]
             else "read" if data["found"] else "not found, defaults in force")
    lines = [f"file:      {data['file'] or '-'} ({data['located_by']}; {state})"]
    if data["sha256"]:
        lines.append(f"sha256:    {data['sha256']}")
    lines.append(f"enabled:   {str(data['enabled']).lower()} (from {data['enabled_from']})")
    lines.append("network:   off (always; " + ("the file asked for it: ignored)"
                                                if data["network"]["requested"] else "as asked)"))
    fs = data["filesystem"]
    lines.append(f"allowReadOutside: {str(fs['allowReadOutside']).lower()}")
    lines.append("whitelist (read/write):")
    for e in data.get("run_whitelist", fs["whitelist"]):
        lines.append(f"  {e['path']}  [{e['origin']}]")
    lines.append("blacklist (never readable or writable, wins over the whitelist):")
    for e in fs["blacklist"]:
        shown = e["written"] if e["written"] == e["path"] else f"{e['written']} -> {e['path']}"
        lines.append(f"  {shown}  [{e['origin']}]")
    lines.append("  + the engine's built-in mandatory denies (`builtin:mandatory-secrets`, "
                 "docs/language.md)")
    for path in data.get("protected", ()):
        lines.append(f"  + the engine's state directory {path} (evidence, its key, budgets)")
    if "policy" in data:
        lines += [f"generated policy ({data['policy_file']}):", data["policy"].rstrip()]
    else:
        lines.append(f"generated policy: none: {data['policy_error']}")
    return "\n".join(lines)


@command.command("check")
@click.argument("file", type=click.Path(path_type=Path))
@format_option
def check(file: Path, fmt: str) -> None:
    """Check a sandbox.json: `file:line:col: SBP105 ...`; exit 0 clean, 1 problems, 2 unusable."""
    from policy_engine.dsl.render import render_diagnostic

    loaded = load_sandbox_config(file)
    diags = list(loaded.problems)
    if not loaded.found:
        click.echo(f"error: `{file}` does not exist", err=True)
        sys.exit(EXIT_BAD_INPUT)
    if fmt == "json":
        echo_json({"diagnostics": [d.to_json() for d in diags], "notes": list(loaded.notes)})
    else:
        for diag in diags:
            click.echo(render_diagnostic(diag, color=sys.stdout.isatty()))
        for note in loaded.notes:
            click.echo(f"warning: {note}")
        click.echo(f"{file}: {len(diags)} problem(s)", err=bool(diags))
    if any(d.id in ("SBP100", "SBP106") for d in diags):
        sys.exit(EXIT_BAD_INPUT)
    sys.exit(EXIT_FAILED if diags else EXIT_OK)


@command.command("exec", context_settings={"ignore_unknown_options": True})
@config_option
@engine_option
@state_option
@cwd_option
@click.option("--confirm", "confirm_mode", type=click.Choice(MODES), default=None,
              help="ask this confirmation service for the command's consent instead of "
              "recording you as consenting (an agent's commands); see docs/consent.md")
@click.option("--approver-url", help="--confirm webhook: where signed requests go")
@click.option("--approver-secret-file", type=_FILE,
              help="--confirm webhook: the shared HMAC secret (at least 16 bytes)")
@click.option("--approver-timeout", default=30.0, show_default=True,
              type=NumberRange(0.1, 600), help="seconds to wait for the approver")
@format_option
@click.argument("argv", nargs=-1, required=True, type=click.UNPROCESSED)
def exec_(config_path: Path | None, engine_path: Path | None, state_dir: Path | None,
          cwd: Path | None, confirm_mode: str | None, approver_url: str | None,
          approver_secret_file: Path | None, approver_timeout: float, fmt: str,
          argv: tuple[str, ...]) -> None:
    """Run `-- CMD ARGS...` in the sandbox (argv, never a shell: `-- bash -c '...'` for one).

    Exits with the command's exit code; 1 when the sandbox refused it (`Permission denied:
    CODE: reason` on stderr); 2 on unusable input or a disabled sandbox.
    """
    confirmation = None if confirm_mode is None else confirmation_service(
        confirm_mode, approver_url, approver_secret_file, approver_timeout)
    with _runner(config_path, engine_path, state_dir, confirmation) as runner:
        try:
            res = runner.run(list(argv), str(cwd) if cwd else None)
        except SandboxDisabledError as exc:
            click.echo(f"error: {exc.code.value}: {exc.reason}", err=True)
            sys.exit(EXIT_BAD_INPUT)
        except ValueError as exc:  # the engine config names a sink or meter nobody provides
            click.echo(f"error: {exc}", err=True)
            sys.exit(EXIT_BAD_INPUT)
    if fmt == "json":
        echo_json(res.to_json())
    else:
        sys.stdout.write(res.stdout)
        sys.stdout.flush()
        sys.stderr.write(res.stderr)
    if res.code == ErrorCode.SCHEMA_VALIDATION_FAILED.value and res.envelope_id is None:
        sys.exit(EXIT_BAD_INPUT)  # refused before any policy: no command, no such directory
    sys.exit(res.exit_code)


@command.command("profile")
@config_option
@engine_option
@state_option
@cwd_option
@click.option("--platform", type=click.Choice(["linux", "macos"]), default="linux",
              show_default=True,
              help="which sandbox to render (linux: the proc backend's bubblewrap argv; macos: "
                   "the sandbox-exec profile of the macos-sandbox-exec backend)")
@format_option
@click.argument("argv", nargs=-1, type=click.UNPROCESSED)
def profile(config_path: Path | None, engine_path: Path | None, state_dir: Path | None,
            cwd: Path | None, platform: str, fmt: str, argv: tuple[str, ...]) -> None:
    """The sandbox that would run `-- CMD...` (default `bash`): decision and backend argv."""
    with _runner(config_path, engine_path, state_dir) as runner:
        try:
            show = runner.preview_sbpl if platform == "macos" else runner.preview
            data = show(list(argv) or ["bash"], str(cwd) if cwd else None)
        except PolicyEngineError as exc:
            click.echo(f"error: {exc.code.value}: {exc.reason}", err=True)
            sys.exit(EXIT_FAILED)
        except ValueError as exc:
            click.echo(f"error: {exc}", err=True)
            sys.exit(EXIT_BAD_INPUT)
    if fmt == "json":
        echo_json({"platform": platform, **data})
    else:
        import shlex

        lines = [f"decision: {data['decision']}" + (f" ({data['code']}) — {data['reason']}"
                                                   if data.get("code") else "")]
        if data.get("backend"):
            lines.append(f"backend: {data['backend']}")
        if "sbpl" in data:
            lines.append(data["sbpl"].rstrip("\n"))
        elif "argv" in data:
            lines.append(shlex.join(data["argv"]))
        if data.get("masked_at_run"):
            lines.append("masked at run time (the host is searched when the command runs, "
                         "every match masked): " + ", ".join(data["masked_at_run"]))
        if data.get("error"):
            lines.append(f"error: {data['error']}")
        click.echo("\n".join(lines))
    sys.exit(EXIT_OK if "argv" in data else EXIT_FAILED)
