"""`policy-engine analyze POLICY`: properties of a policy set, each proven absent or witnessed."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from policy_engine.cli.common import EXIT_BAD_INPUT, EXIT_FAILED, EXIT_OK, load_or_exit
from policy_engine.compiler import compile_files

_FILE = click.Path(dir_okay=False, path_type=Path)


@click.command("analyze")
@click.argument("policy", type=_FILE)
@click.option("--read", "reads", multiple=True, metavar="GLOB",
              help="can anything read a path matching GLOB (repeatable)")
@click.option("--reach", "hosts", multiple=True, metavar="HOST",
              help="can anything reach HOST: a name, *.suffix, address or CIDR (repeatable)")
@click.option("--rule", "rules", multiple=True, metavar="ID",
              help="is rule ID reachable, not shadowed by the others (repeatable)")
@click.option("--all-rules", is_flag=True, help="ask --rule for every rule of the policy")
@click.option("--shell", is_flag=True,
              help="does any permit allow a shell or interpreter with any arguments")
@click.option("--grant", type=_FILE, help="decide with this grant (JSON/YAML)")
@click.option("--manifest", type=_FILE, help="decide with this tool manifest; with --grant, "
                                             "also asks: is the grant within manifest ∩ policy")
@click.option("--format", "fmt", type=click.Choice(["text", "json", "sarif"]), default="text",
              show_default=True)
def command(policy: Path, reads: tuple[str, ...], hosts: tuple[str, ...],
            rules: tuple[str, ...], all_rules: bool, shell: bool, grant: Path | None,
            manifest: Path | None, fmt: str) -> None:
    """Answer properties of POLICY (an entry .sbpolicy file, imports followed) exactly: each
    "no" is proven over every request of that shape, each "yes" shows a request the engine
    decides so. Nothing is executed.

    Exits 0 when no property finds anything, 1 on a finding (something readable or reachable,
    a shadowed rule, a grant beyond manifest ∩ policy, a shell with any arguments) or an
    answer not proven (a part too complex to decide exactly), 2 on unusable input.
    """
    from policy_engine.analysis import properties as p
    from policy_engine.analysis.render import answers_json, answers_sarif, answers_text
    from policy_engine.compiler.loaders import load_grant, load_manifest

    ps = load_or_exit(lambda: compile_files([policy]))
    given = p.Given(load_or_exit(lambda: load_grant(grant)) if grant else None,
                    load_or_exit(lambda: load_manifest(manifest)) if manifest else None)
    wanted = list(rules) + ([r.id for r in ps.rules if not r.id.startswith("builtin:")]
                            if all_rules else [])
    known = {r.id for r in ps.rules}
    if missing := [r for r in wanted if r not in known]:
        click.echo(f"error: no rule `{missing[0]}` in `{policy}` (rules: "
                   f"{', '.join(sorted(known))})", err=True)
        sys.exit(EXIT_BAD_INPUT)
    try:
        answers = [p.can_read(ps, g, given) for g in reads]
        answers += [p.can_reach(ps, h, given) for h in hosts]
    except ValueError as exc:  # a glob or host pattern that does not parse
        click.echo(f"error: {exc}", err=True)
        sys.exit(EXIT_BAD_INPUT)
    answers += [p.rule_reachable(ps, r) for r in wanted]
    if shell:
        answers.append(p.shell_allowed(ps, given))
    if given.grant is not None and given.manifest is not None:
        answers.append(p.grant_within(ps, given))
    if not answers:
        click.echo("error: nothing to analyze: give --read, --reach, --rule, --all-rules, "
                   "--shell or --grant with --manifest", err=True)
        sys.exit(EXIT_BAD_INPUT)
    if fmt == "json":
        click.echo(json.dumps(answers_json(answers), indent=2, ensure_ascii=False))
    elif fmt == "sarif":
        click.echo(json.dumps(answers_sarif(answers, ps), indent=2, ensure_ascii=False))
    else:
        click.echo(answers_text(answers))
    sys.exit(EXIT_FAILED if any(a.holds or not a.proven for a in answers) else EXIT_OK)
