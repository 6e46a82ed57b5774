"""What every compiled PolicySet contains whether or not the policy says so (seeds 003, 004, 000).

- the mandatory secret deny list (seed 003): a `forbid mandatory` rule for fs.read, fs.write and
  fs.list that nothing — grant, manifest, override or named profile — can lift;
- the four named profiles of seed 004, unless the policy defines a profile of the same name;
- the built-in consent rule (``ConsentRule(condition=None)``: High safety, or Write/Process side
  effects, seed 000 §6) when the policy has no `require consent` statement.

Built-in items live in the file ``<builtin>`` at line 0, column 0 (no source position).
"""

from __future__ import annotations

from policy_engine.compiler.context import CompileContext, RuleDraft, Unit
from policy_engine.dsl import ast
from policy_engine.errors import Span
from policy_engine.graph import NamedProfile
from policy_engine.model import CapabilityKind, FsCapability, Limits, NetworkMode, RuleRef

BUILTIN_FILE = "<builtin>"
BUILTIN_SPAN = Span(BUILTIN_FILE, 0, 0)

MANDATORY_DENY_ID = "builtin:mandatory-secrets"
CONSENT_ID = "builtin:consent"

MANDATORY_DENY_PATHS: tuple[str, ...] = (
    "~/.ssh/**",
    "~/.aws/**",
    "~/.gnupg/**",
    "~/.config/gcloud/**",
    "~/.azure/**",
    "/etc/shadow",
    "/etc/gshadow",
    "/etc/passwd",
    "/etc/group",
    "**/.env",
    "**/.envrc",
    "**/.env.local",
    "**/credentials.json",
    "**/secrets.json",
    "/var/run/docker.sock",
    "/run/docker.sock",
    "/run/**",
    "/var/run/**",
)
"""Seed 003's secrets: unexpanded (``~`` is the compile's ``home``). ``/run/**`` and
``/var/run/**`` hold every host control socket (docker, containerd, dbus, systemd, podman, the
user's runtime dir); the sandboxes hide those trees whatever a policy says
(``policy_engine.sandbox.runtime_dirs.RUNTIME_DIRS``)."""

MANDATORY_DENY_KINDS: tuple[CapabilityKind, ...] = (
    CapabilityKind.FS_READ, CapabilityKind.FS_WRITE, CapabilityKind.FS_LIST,
)


def builtin_ref(rule_id: str) -> RuleRef:
    return RuleRef(id=rule_id, file=BUILTIN_FILE, line=0, column=0)


def mandatory_capabilities() -> dict[CapabilityKind, FsCapability]:
    """One fs capability per denied kind, over the unexpanded secret globs."""
    return {k: FsCapability(kind=k.value, paths=MANDATORY_DENY_PATHS)
            for k in MANDATORY_DENY_KINDS}


BUILTIN_PROFILES: dict[str, NamedProfile] = {
    p.name: p
    for p in (
        NamedProfile(
            name="safe-readonly", span=BUILTIN_SPAN,
            network=NetworkMode.OFF, fs_mode="read-only",
        ),
        NamedProfile(
            name="workspace-write", span=BUILTIN_SPAN,
            network=NetworkMode.OFF, fs_mode="read-write", writable=("/workspace/**",),
        ),
        NamedProfile(
            name="networked-dev", span=BUILTIN_SPAN,
            network=NetworkMode.ON, fs_mode="read-write",
        ),
        NamedProfile(
            name="high-isolation", span=BUILTIN_SPAN,
            network=NetworkMode.OFF, fs_mode="read-only",
            limits=Limits(
                timeout_ms=10_000, memory_bytes=256 * 1024 * 1024, pids=32, cpu_cores=0.5,
                max_concurrency=1, max_files=50, max_bytes_in=1024 * 1024,
                max_bytes_out=256 * 1024,
            ),
        ),
    )
}
"""Seed 004's profiles; a policy may redefine any of them by name."""


def add_builtins(ctx: CompileContext) -> None:
    """Add the mandatory deny rule, missing seed profiles and the default consent rule.

    Runs after the policy's own profiles are collected (a policy may redefine a seed profile)
    and before the version hash (built-ins are part of what a policy version means).
    """
    ctx.builtin_rules.append(RuleDraft(
        node=ast.Rule("forbid", True, None, (), (), BUILTIN_SPAN),
        id=MANDATORY_DENY_ID,
        unit=Unit(ast.PolicyFile(BUILTIN_FILE, ""), BUILTIN_FILE, root=False),
        capabilities=dict(mandatory_capabilities()),
    ))
    for name, profile in BUILTIN_PROFILES.items():
        ctx.profiles.setdefault(name, profile)
