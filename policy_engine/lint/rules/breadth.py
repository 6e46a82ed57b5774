"""Rules SBP300-SBP303: what a permit reaches (secrets, any host, public-suffix wildcards)."""

from __future__ import annotations

from collections.abc import Iterator

from policy_engine.compiler.builtins import MANDATORY_DENY_PATHS
from policy_engine.dsl import ast
from policy_engine.lint.cover import may_contain, may_meet
from policy_engine.lint.model import FileView, Finding, LintConfig
from policy_engine.lint.psl import public_suffix
from policy_engine.lint.rules.base import RuleView, finding, rule_views, unconditional, where
from policy_engine.model import FsCapability
from policy_engine.patterns import HostPattern, expand_home
from policy_engine.patterns.path_meet import contains, disjoint

EXTRA_SECRETS: tuple[str, ...] = (
    "~/.kube/**", "~/.docker/config.json", "~/.netrc", "~/.git-credentials", "~/.npmrc",
    "~/.pypirc", "~/.config/gh/**", "~/.pgpass", "~/.vault-token", "/etc/sudoers",
)
"""Credential stores the built-in mandatory denies do not cover (SBP303)."""

_FS_KINDS = ("fs.read", "fs.write", "fs.list")
_NET_KINDS = ("net.http", "browser.use")


def mandatory_globs(view: FileView, home: str) -> list[tuple[str, str]]:
    """(as written, expanded) for the built-in secrets and the policy's `forbid mandatory`."""
    out = [(p, expand_home(p, home)) for p in MANDATORY_DENY_PATHS]
    for draft in view.policy.rules:
        if draft.node.effect == "forbid" and draft.node.mandatory and unconditional(draft.node):
            for cap in draft.capabilities.values():
                if isinstance(cap, FsCapability):
                    out.extend((p, expand_home(p, home)) for p in cap.paths)
    return out


def _fs_permits(view: FileView) -> Iterator[RuleView]:
    for rv in rule_views(view):
        if rv.node.effect == "permit" and any(k in _FS_KINDS for k in rv.capabilities):
            yield rv


def check_secrets(view: FileView, cfg: LintConfig) -> Iterator[Finding]:
    """SBP300 (a permit glob contains a mandatory-deny glob) and SBP303 (it reaches a secret
    no mandatory deny covers)."""
    mandatory = mandatory_globs(view, cfg.home)
    # SBP300 measures against the built-in secrets: a policy's own `forbid mandatory` carving a
    # directory out of a broader permit (`/workspace/.secrets/**`) is the intended pattern
    builtin = mandatory[:len(MANDATORY_DENY_PATHS)]
    secrets = [(s, expand_home(s, cfg.home)) for s in EXTRA_SECRETS]
    unprotected = [(s, e) for s, e in secrets if not any(contains(m, e) for _, m in mandatory)]
    for rv in _fs_permits(view):
        for value in rv.resources("paths"):
            if not isinstance(value, ast.Str):
                continue
            glob = expand_home(value.value, cfg.home)
            covered = [w for w, m in builtin if may_contain(glob, m) and contains(glob, m)]
            if covered:
                yield finding(
                    "SBP300", f"`{value.value}` in {where(rv)} contains the mandatory deny "
                    f"`{covered[0]}`" + (f" and {len(covered) - 1} more" if len(covered) > 1
                                         else ""), value.span, rv.anchor)
            reached = [s for s, e in unprotected if may_meet(glob, e) and not disjoint(glob, e)]
            if reached:
                yield finding(
                    "SBP303", f"`{value.value}` in {where(rv)} reaches "
                    + ", ".join(f"`{s}`" for s in reached[:3])
                    + (f" and {len(reached) - 3} more" if len(reached) > 3 else "")
                    + " with no mandatory deny", value.span, rv.anchor)


def is_any_host(host: HostPattern) -> bool:
    if host.kind == "any":
        return True
    return host.kind == "cidr" and host.network is not None and host.network.prefixlen == 0


def host_patterns(rv: RuleView) -> Iterator[tuple[ast.Str, HostPattern]]:
    for value in rv.resources("hosts"):
        if isinstance(value, ast.Str):
            try:
                yield value, HostPattern.of(value.value)
            except ValueError:  # an invalid host is the checker's SBP207
                continue


def check_hosts(view: FileView, cfg: LintConfig) -> Iterator[Finding]:
    """SBP301 (any host) and SBP302 (wildcard at a public suffix), rules and tool blocks."""
    for rv in rule_views(view):
        if rv.node.effect != "permit" or not any(k in _NET_KINDS for k in rv.capabilities):
            continue
        for value, host in host_patterns(rv):
            if is_any_host(host):
                yield finding("SBP301", f"{where(rv)} permits any host (`{value.value}`)",
                              value.span, rv.anchor)
            elif host.kind == "suffix":
                why = public_suffix(host.value)
                if why is not None:
                    yield finding(
                        "SBP302", f"`{value.value}` in {where(rv)} is a wildcard over "
                        f"`{host.value}`, {why}", value.span, rv.anchor)


CHECKS = (check_secrets, check_hosts)
