"""A generated N-rule policy (sbpolicy and Cedar), with a narrow grant and a wide manifest.

Rule ``i`` is, by ``i % 5``: a read permit on ``/data/t{i}/**``, a write permit on
``/data/t{i}/out/**``, an HTTPS GET permit on ``svc{i}.example.com``, an exec permit for
``tool{i}``, or a read forbid on ``/data/t{i-4}/private/**``. The grant names four capabilities
of one team (the read of team ``k``, the write of team ``k+1``, the host of ``k+2``, the tool of
``k+3``); the manifest declares wide ones, so the grant and the policy decide.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

CEDAR_SECRETS = """
@id("builtin-secrets")
forbid (principal, action in [Action::"fs.read", Action::"fs.write"], resource is File)
when {
  resource.path like "/home/agent/.ssh/*" || resource.path like "/home/agent/.aws/*" ||
  resource.path like "/home/agent/.gnupg/*" || resource.path like "/home/agent/.azure/*" ||
  resource.path like "/home/agent/.config/gcloud/*" ||
  resource.path == "/etc/shadow" || resource.path == "/etc/gshadow" ||
  resource.path like "*/.env" || resource.path like "*/.envrc" ||
  resource.path like "*/.env.local" || resource.path like "*/credentials.json" ||
  resource.path like "*/secrets.json" ||
  resource.path == "/var/run/docker.sock" || resource.path == "/run/docker.sock"
};
"""
"""The compiler's built-in mandatory denies (``policy_engine/compiler/builtins.py``), in Cedar."""

FAR_FUTURE_MS = 4_102_444_800_000


@dataclass(frozen=True, slots=True)
class ScalePolicy:
    n_rules: int
    sbpolicy: str
    cedar: str
    grant: dict[str, Any]
    manifest: dict[str, Any]
    read_path: str  # allowed by the grant's read rule
    first_path: str  # allowed by rule 0 (first in the policy)
    last_path: str  # allowed by the last read permit
    denied_path: str  # matches no permit: a deny that scans every read rule


def _rule(i: int) -> tuple[str, str]:
    kind = i % 5
    if kind == 0:
        return (f'permit "r{i}" fs.read  paths ["/data/t{i}/**"]',
                f'@id("r{i}")\npermit (principal, action == Action::"fs.read", resource is File)'
                f'\nwhen {{ resource.path like "/data/t{i}/*" }};')
    if kind == 1:
        return (f'permit "w{i}" fs.write  paths ["/data/t{i}/out/**"]',
                f'@id("w{i}")\npermit (principal, action == Action::"fs.write", '
                f'resource is File)\nwhen {{ resource.path like "/data/t{i}/out/*" }};')
    if kind == 2:
        return (f'permit "h{i}" net.http  hosts ["svc{i}.example.com"]  schemes ["https"]  '
                f'methods ["GET"]',
                f'@id("h{i}")\npermit (principal, action == Action::"net.http", resource is Url)'
                f'\nwhen {{ resource.host == "svc{i}.example.com" && resource.scheme == "https"'
                f' && resource.method == "GET" }};')
    if kind == 3:
        return (f'permit "x{i}" proc.exec  tool "tool{i}"',
                f'@id("x{i}")\npermit (principal, action == Action::"proc.exec", '
                f'resource is Command)\nwhen {{ resource.tool == "tool{i}" }};')
    return (f'forbid "f{i}" fs.read  paths ["/data/t{i - 4}/private/**"]',
            f'@id("f{i}")\nforbid (principal, action == Action::"fs.read", resource is File)'
            f'\nwhen {{ resource.path like "/data/t{i - 4}/private/*" }};')


def scale_policy(n_rules: int) -> ScalePolicy:
    """The ``n_rules``-rule policy (at least 10) and a grant for team ``k`` in its middle."""
    if n_rules < 10:
        raise ValueError("at least 10 rules")
    sb = [f'policy "bench/scale-{n_rules}" version "1.0.0"', ""]
    cedar = [CEDAR_SECRETS]
    for i in range(n_rules):
        s, c = _rule(i)
        sb.append(s)
        cedar.append(c)
    k = (n_rules // 2) // 5 * 5  # a read permit's index
    last_read = (n_rules - 1) // 5 * 5
    grant = {
        "tenant": "acme", "subject_id": "agent:scale", "tool_name": "scale-tool",
        "call_id": "call-0", "expires_at": FAR_FUTURE_MS,
        "capabilities": [
            {"kind": "fs.read", "paths": [f"/data/t{k}/**"]},
            {"kind": "fs.write", "paths": [f"/data/t{k + 1}/out/**"]},
            {"kind": "net.http", "hosts": [f"svc{k + 2}.example.com"]},
            {"kind": "proc.exec", "tool": f"tool{k + 3}"},
        ],
    }
    manifest = {
        "name": "scale-tool", "version": "1.0.0",
        "permissions": [
            {"kind": "fs.read", "paths": ["/data/**"]},
            {"kind": "fs.write", "paths": ["/data/**"]},
            {"kind": "net.http", "hosts": ["*.example.com"]},
            {"kind": "proc.exec", "tool": f"tool{k + 3}"},
        ],
        "side_effects": ["Read"], "safety_class": "Low",
    }
    return ScalePolicy(
        n_rules=n_rules, sbpolicy="\n".join(sb) + "\n", cedar="\n".join(cedar) + "\n",
        grant=grant, manifest=manifest, read_path=f"/data/t{k}/src/main.py",
        first_path="/data/t0/src/main.py", last_path=f"/data/t{last_read}/src/main.py",
        denied_path="/data/nowhere/main.py",
    )
