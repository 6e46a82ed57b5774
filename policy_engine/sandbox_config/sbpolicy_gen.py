"""The merged sandbox config as `.sbpolicy` source, compiled by the normal compiler.

No second enforcement path: the config becomes an ordinary policy (plus the grant and manifest
a call needs), so the guard decides, `explain` explains and the proc executors bind, mask and
refuse exactly as for any policy:

- the whitelist (with the run's working directory, and ``$TMPDIR`` unless it is ``/tmp``)
  → ``permit fs.read, fs.write, fs.list`` over each tree: a writable bind;
- ``allowReadOutside`` → ``permit fs.read, fs.list paths ["/**"]``: the rest read-only;
- the blacklist (seed defaults + the file's) and the engine's own state directory (evidence,
  its key, budgets: a command run from a project must not rewrite its own record) → one
  ``forbid mandatory`` rule for fs.read, fs.write and fs.list, which nothing lifts and which
  wins over every permit (the sandboxes mask what it covers); the engine's
  ``builtin:mandatory-secrets`` is added by the compiler;
- ``defaults { network off }`` whatever the file asked;
- ``permit proc.exec tool "<argv[0]>"`` for the command being run (no argument template).
"""

from __future__ import annotations

import getpass
import hashlib
import os
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from policy_engine.compiler import compile_files
from policy_engine.errors import ErrorCode, PolicyEngineError
from policy_engine.graph.policyset import PolicySet
from policy_engine.model import (
    Consent,
    FsCapability,
    Grant,
    Manifest,
    ProcCapability,
    SafetyClass,
    Settings,
    SideEffect,
)
from policy_engine.model.capability import Capability
from policy_engine.patterns.paths import is_literal
from policy_engine.sandbox.enginedirs import tree_refusal
from policy_engine.sandbox.masks import beneath
from policy_engine.sandbox_config.sbconfig import Entry, SandboxConfig
from policy_engine.sandbox_config.sbexpand import whitelist_refusal

POLICY_NAME = "sandbox/config"
TOOL_NAME = "sandbox"
GRANT_TTL_MS = 3_600_000


@dataclass(frozen=True, slots=True)
class SandboxPolicy:
    """Everything one run needs: the compiled policy and the call's grant, manifest, settings.

    :param source: the generated `.sbpolicy` text; :param path: where it was written (rule
        spans in decisions and evidence point into it).
    """

    source: str
    path: Path
    policyset: PolicySet
    grant: Grant
    manifest: Manifest
    settings: Settings
    writable: tuple[Entry, ...]


def _q(text: str) -> str:
    # INVARIANT: entries never hold `"`, `\` or control characters (sbexpand.py refuses them);
    # escaping anyway keeps a future caller from injecting policy text
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _rule(head: str, items: Iterable[str]) -> list[str]:
    """``head  paths [...]`` in `policy-engine fmt`'s layout: on one line when it fits in 100
    columns, else the clause on the next line, and its paths one a line if still too long."""
    quoted = [_q(p) for p in dict.fromkeys(items)]
    clause = f"paths [{', '.join(quoted)}]"
    if len(head) + 2 + len(clause) <= 100:
        return [f"{head}  {clause}"]
    if 2 + len(clause) <= 100:
        return [head, f"  {clause}"]
    return [head, "  paths [", *(f"    {q}," for q in quoted), "  ]"]


def run_whitelist(config: SandboxConfig, cwd: str, tmpdir: str | None,
                  home: str = "/", engine: Sequence[tuple[str, str]] = ()) -> tuple[Entry, ...]:
    """The seed's ``generatePolicy``: the working directory, the whitelist, then ``$TMPDIR``.

    ``/tmp`` is never bound from the host: every sandbox has its own empty ``/tmp``. A
    ``$TMPDIR`` the whitelist itself would refuse (``/``, ``/etc``, the home directory) is left
    out: the environment must not make what a config file may not.
    """
    out = [Entry(cwd, cwd, "working directory")]
    out += config.whitelist
    if tmpdir and os.path.isabs(tmpdir):
        real = os.path.realpath(tmpdir)
        if real not in ("/tmp", "/var/tmp") and whitelist_refusal(
                real, os.path.realpath(home)) is None and tree_refusal(real, engine) is None:
            out.append(Entry(tmpdir, real, "$TMPDIR"))
    return tuple(dict((e.path, e) for e in out).values())


def _deny_globs(blacklist: Sequence[Entry]) -> list[str]:
    """Each entry and everything beneath it; an existing literal symlink's target too (the
    guard and the masks see resolved paths)."""
    out: list[str] = []
    for e in blacklist:
        p = e.path
        out += [p] if p.endswith("/**") else [p, p + "/**"]
        if is_literal(p) and p.startswith("/") and os.path.islink(p):
            real = os.path.realpath(p)
            out += [real, real + "/**"]
    return out


def policy_source(config: SandboxConfig, writable: Sequence[Entry], tool: str,
                  origin: str, protected: Sequence[Entry] = ()) -> str:
    """The `.sbpolicy` text for one run (deterministic: same inputs, same text)."""
    lines = [
        f"# generated by `policy-engine sandbox` from {origin}; do not edit (regenerated per run)",
        f'policy "{POLICY_NAME}" version "1.0.0"',
        "",
        "defaults { network off }",
        "",
        "# blacklist: seed 003 defaults + the file's entries; wins over every permit",
        *_rule('forbid mandatory "sandbox-blacklist" fs.read, fs.write, fs.list',
               _deny_globs((*config.blacklist, *protected))),
        "",
        "# whitelist: read and write",
        *_rule('permit "sandbox-whitelist" fs.read, fs.write, fs.list',
               (e.path + "/**" for e in writable)),
    ]
    if config.allow_read_outside:
        lines += ["", "# allowReadOutside: everything else read-only",
                  'permit "sandbox-read-outside" fs.read, fs.list  paths ["/**"]']
    lines += ["", "# the command being run (argv, no shell)",
              f'permit "sandbox-command" proc.exec  tool {_q(tool)}', ""]
    return "\n".join(lines)


def _capabilities(config: SandboxConfig, writable: Sequence[Entry],
                  tool: str) -> tuple[Capability, ...]:
    trees = tuple(e.path + "/**" for e in writable)
    reads = trees + (("/**",) if config.allow_read_outside else ())
    return (FsCapability(kind="fs.read", paths=reads), FsCapability(kind="fs.list", paths=reads),
            FsCapability(kind="fs.write", paths=trees), ProcCapability(tool=tool))


def build_sandbox_policy(config: SandboxConfig, *, cwd: str, tool: str, home: str,
                         state_dir: Path, origin: str, tmpdir: str | None = None,
                         now_ms: int | None = None, subject: str | None = None,
                         engine: Sequence[tuple[str, str]] = (),
                         config_file: str | None = None) -> SandboxPolicy:
    """Generate, write (under ``state_dir/sandbox/``) and compile the policy for one run.

    :param subject: who the grant and its consent name (default ``local-user:<login>``).

    :raises DiagnosticsError: the generated policy does not compile (a bug: entries are
        vetted before they get here).
    """
    writable = run_whitelist(config, cwd, tmpdir, home, engine)
    state = os.path.realpath(state_dir)
    for entry in writable:
        if beneath(entry.path, state):
            raise PolicyEngineError(ErrorCode.CAPABILITY_BLOCKED, f"`{entry.path}` "
                                    f"({entry.origin}) lies inside the engine's state directory "
                                    f"`{state}`; run from elsewhere or move the state "
                                    "(`--state-dir`, `POLICY_ENGINE_STATE`)")
        why = tree_refusal(entry.path, engine, f"`{entry.path}` ({entry.origin})")
        if why is not None:  # the launcher cache, the config, login hooks (round 3, F7/F8)
            raise PolicyEngineError(ErrorCode.CAPABILITY_BLOCKED, f"{why}; run from elsewhere")
    # INVARIANT: the state dir (evidence, its key, budgets, this policy) exists before the
    # sandbox is planned, so the blacklist masks it even inside a whitelisted working directory
    (state_dir / "sandbox").mkdir(parents=True, exist_ok=True)
    protected = [Entry(str(state_dir), state, "engine state directory")]
    if config_file:  # the config in use: never rewritten from inside (attack round 3, F8)
        real = os.path.realpath(config_file)
        folder = os.path.dirname(real)
        holds = any(beneath(e.path, folder) for e in writable)
        protected.append(Entry(config_file, real if holds else folder, "sandbox config in use"))
    source = policy_source(config, writable, tool, origin, tuple(protected))
    digest = hashlib.sha256(f"{home}\0{source}".encode()).hexdigest()[:16]
    where = state_dir / "sandbox"
    path = where / f"sandbox-{digest}.sbpolicy"
    if not path.is_file() or path.read_text(encoding="utf-8") != source:
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(source, encoding="utf-8")
        os.replace(tmp, path)
    policyset = compile_files([path], home=home)
    now = now_ms if now_ms is not None else int(time.time() * 1000)
    caps = _capabilities(config, writable, tool)
    who = subject or f"local-user:{_user()}"
    # the person running `sandbox exec` (or the runner's `subject`, who configured the sandbox
    # for an agent) is the consent the built-in rule asks for a process: recorded as such
    consent = Consent(granted_by=who, granted_at=now, expires_at=now + GRANT_TTL_MS,
                      scope="sandbox exec")
    grant = Grant(tenant="local", subject_id=who, tool_name=TOOL_NAME,
                  call_id=f"sandbox-{digest}-{now}", capabilities=caps,
                  expires_at=now + GRANT_TTL_MS, consent=consent)
    manifest = Manifest(name=TOOL_NAME, version="1.0.0",
                        description="a command run under the seed 003 sandbox config",
                        permissions=caps, safety_class=SafetyClass.MEDIUM,
                        side_effects=(SideEffect.PROCESS, SideEffect.READ, SideEffect.WRITE))
    return SandboxPolicy(source, path, policyset, grant, manifest, Settings(root_fs="/"),
                         writable)


def _user() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return str(os.getuid())
