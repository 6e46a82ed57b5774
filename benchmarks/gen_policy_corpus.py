"""Generate a deterministic corpus of realistic `.sbpolicy` files with passing `.sbtest.yaml` tests.

The authoring benchmark (`bench_authoring.py`) runs `lint`, `fmt --check` and `test` over it.
Layout of ``OUT``::

    shared/{secrets,network,process}.sbpolicy   imported by the team policies
    fixtures/bench-agent.json, bench-grant.json the manifest and grant every test case uses
    policies/team-NNNN.sbpolicy                 ~100 lines: every capability kind, CEL, a
    policies/team-NNNN.sbtest.yaml              profile, a tool block, comments; ~5 cases each

Each team file is drawn from its own ``random.Random(f"{seed}:{index}")``, so the first 20 files
of a 1,000-file corpus are the same as a 20-file corpus, and the same seed gives the same bytes.
Unless ``--no-fmt``, the corpus is then put in canonical layout by ``policy-engine fmt``.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

NOW_MS = 1795000000000

# ---- shared files ------------------------------------------------------------------------------

SHARED: dict[str, str] = {
    "secrets.sbpolicy": """\
# Secrets of every team; mandatory, so no grant, manifest or profile can lift them.
policy "bench/shared-secrets" version "1.0.0"

forbid mandatory "shared-secrets" fs.read, fs.write, fs.list
  paths ["/workspace/**/secrets/**", "**/*.pem", "**/*.p12"]
""",
    "network.sbpolicy": """\
# Package mirrors every team may read from.
policy "bench/shared-network" version "1.2.0"

permit "shared-pypi" net.http  hosts ["pypi.mirror.example.com"]  schemes ["https"]
  methods ["GET", "HEAD"]

permit "shared-npm" net.http  hosts ["npm.mirror.example.com"]  schemes ["https"]
  methods ["GET"]
""",
    "process.sbpolicy": """\
# Harmless inspection commands.
policy "bench/shared-process" version "1.0.3"

permit "shared-ls" proc.exec  tool "ls"  args [/^-[alhtr]+$/ ..., /^[A-Za-z0-9_.\\/-]+$/ ...]
  limits { timeout 10s }
""",
}

MANIFEST = {
    "name": "bench-agent",
    "version": "1.0.0",
    "description": "The coding agent every generated test case runs as",
    "permissions": [
        {"kind": "fs.read", "paths": ["/workspace/**"]},
        {"kind": "fs.list", "paths": ["/workspace/**"]},
        {"kind": "fs.write", "paths": ["/workspace/**"]},
        {"kind": "proc.exec", "tool": "git"},
        {"kind": "proc.exec", "tool": "make"},
        {"kind": "net.http", "hosts": ["*.example.com"]},
        {"kind": "tmp.use", "max_bytes": 1073741824},
    ],
    "side_effects": ["Read", "Write", "Network", "Process"],
    "safety_class": "Medium",
}

GRANT = {
    "tenant": "acme",
    "subject_id": "agent:bench-1",
    "tool_name": "bench-agent",
    "call_id": "call-bench-0001",
    "capabilities": MANIFEST["permissions"],
    "expires_at": 4102444800000,
    "budget": {"calls": 1000},
    "consent": {"granted_by": "user:bench", "granted_at": 1790000000000,
                "expires_at": 4102444800000},
}

# ---- one team policy ---------------------------------------------------------------------------

_TOPICS = ["payments", "search", "billing", "ingest", "reports", "mobile", "identity", "ml",
           "storage", "alerts", "catalog", "checkout", "support", "analytics", "infra"]
_LANGS = ["python", "go", "rust", "typescript", "java", "kotlin"]
_SIZES = ["256KiB", "1MiB", "4MiB", "16MiB"]
_BLOCK = list[str]


class Team:
    """The names one generated policy uses, and its random source."""

    def __init__(self, index: int, seed: int) -> None:
        self.index = index
        self.rng = random.Random(f"{seed}:{index}")
        self.name = f"team-{index:04d}"
        self.prefix = f"t{index:04d}"
        self.root = f"/workspace/{self.name}"
        self.topic = self.rng.choice(_TOPICS)
        self.lang = self.rng.choice(_LANGS)

    def rule(self, name: str) -> str:
        return f'"{self.prefix}-{name}"'


def _comment(t: Team, text: str) -> _BLOCK:
    return [f"# {text}"] if t.rng.random() < 0.85 else []


def _read_src(t: Team) -> _BLOCK:
    return [*_comment(t, f"The {t.lang} sources and docs of the {t.topic} service."),
            f'permit {t.rule("read-src")} fs.read, fs.list',
            f'  paths ["{t.root}/src/**", "{t.root}/docs/**"]']


def _write_out(t: Team) -> _BLOCK:
    size = t.rng.choice([65536, 1048576, 4194304])
    return [*_comment(t, "Build output; large writes need a human."),
            f'permit {t.rule("write-out")} fs.write  paths ["{t.root}/out/**"]',
            f"  when `request.size <= {size} || grant.subject_id.startsWith(\"user:\")`"]


def _no_release(t: Team) -> _BLOCK:
    return [*_comment(t, "Releases are cut by the release pipeline only."),
            f'forbid {t.rule("no-release")} fs.write  paths ["{t.root}/out/release/**"]']


def _git(t: Team) -> _BLOCK:
    return [*_comment(t, "Read-only git."),
            f'permit {t.rule("git")} proc.exec  tool "git"',
            '  args ["status" | "log" | "diff" | "show", /^--(oneline|stat|name-only)$/ ...]',
            f"  limits {{ cpu 1  memory 512MiB  pids 64  timeout {t.rng.choice([10, 20, 30])}s }}"]


def _api(t: Team) -> _BLOCK:
    return [*_comment(t, f"The {t.topic} API, JSON only."),
            f'permit {t.rule("api")} net.http',
            f'  hosts ["api.{t.name}.example.com"]  schemes ["https"]  ports [443]',
            '  methods ["GET", "HEAD"]  mime ["application/json"]']


def _list_logs(t: Team) -> _BLOCK:
    return [*_comment(t, "Logs may be listed, not read."),
            f'permit {t.rule("list-logs")} fs.list  paths ["{t.root}/logs/**"]',
            f"  limits {{ files {t.rng.choice([100, 200, 500])}  depth 6 }}"]


def _write_cache(t: Team) -> _BLOCK:
    return [*_comment(t, "Agents keep a cache between runs."),
            f'permit {t.rule("write-cache")} fs.write  paths ["{t.root}/cache/**"]',
            '  when `grant.subject_id.startsWith("agent:") && tenant.id == "acme"`']


def _make(t: Team) -> _BLOCK:
    return [*_comment(t, "Build targets."),
            f'permit {t.rule("make")} proc.exec  tool "make"',
            '  args ["build" | "test" | "lint" | "clean", /^[A-Z_]+=[A-Za-z0-9_.-]+$/ ...]',
            f"  limits {{ cpu 2  memory {t.rng.choice(['1GiB', '2GiB'])}  pids 128  timeout 30s }}"]


def _pytest(t: Team) -> _BLOCK:
    return [*_comment(t, "Unit tests, by path."),
            f'permit {t.rule("pytest")} proc.exec  tool "pytest"',
            '  args [/^-(q|x|v)$/ ..., /^tests\\/[A-Za-z0-9_.\\/-]*$/ ...]',
            "  limits { timeout 25s }"]


def _npm(t: Team) -> _BLOCK:
    return [*_comment(t, "Frontend scripts."),
            f'permit {t.rule("npm")} proc.exec  tool "npm"',
            '  args ["ci" | "test" | "run", /^[a-z:-]+$/ ...]',
            "  limits { timeout 30s  memory 2GiB }"]


def _browser(t: Team) -> _BLOCK:
    return [*_comment(t, "Internal docs for the browser tool."),
            f'permit {t.rule("docs")} browser.use  hosts ["docs.{t.name}.example.com"]',
            "  scopes [open, extract, screenshot]"]


def _tmp(t: Team) -> _BLOCK:
    return [*_comment(t, "Scratch space."),
            f'permit {t.rule("scratch")} tmp.use  max_bytes {t.rng.choice(["64MiB", "256MiB"])}']


def _gpu(t: Team) -> _BLOCK:
    return [*_comment(t, "Training jobs of the ML tenant."),
            f'permit {t.rule("gpu")} sys.gpu  class "{t.rng.choice(["a100", "h100", "l4"])}"',
            '  when `tenant.id == "acme" && grant.subject_id.startsWith("agent:")`']


def _no_tokens(t: Team) -> _BLOCK:
    return [*_comment(t, "Tokens stay out of agent hands."),
            f'forbid {t.rule("no-tokens")} fs.read, fs.write  paths ["{t.root}/**/*.token"]']


def _keys(t: Team) -> _BLOCK:
    return [*_comment(t, "Signing keys: mandatory."),
            f'forbid mandatory {t.rule("keys")} fs.read, fs.write, fs.list',
            f'  paths ["{t.root}/keys/**"]']


def _artifacts(t: Team) -> _BLOCK:
    return [*_comment(t, "The artifact store: reads for everyone, uploads for CI agents."),
            f'permit {t.rule("artifacts")} net.http  hosts ["artifacts.{t.name}.example.com"]',
            '  schemes ["https"]  methods ["GET", "PUT"]',
            '  when `request.method == "GET" || grant.subject_id.startsWith("agent:ci-")`',
            f"  limits {{ bytes_out {t.rng.choice(['256KiB', '512KiB', '1MiB'])} }}"]


_OPTIONAL: list[Callable[[Team], _BLOCK]] = [
    _list_logs, _write_cache, _make, _pytest, _npm, _browser, _tmp, _gpu, _no_tokens, _keys,
    _artifacts,
]


def _profile_and_tool(t: Team) -> _BLOCK:
    major, minor = t.rng.randint(1, 4), t.rng.randint(0, 9)
    return [
        f"# ---- the {t.topic} build tool {'-' * 60}"[:98],
        f'profile "{t.prefix}-ci" {{',
        "  network restricted",
        "  fs read-write",
        f'  writable ["{t.root}/out/**", "{t.root}/cache/**"]',
        f"  timeout {t.rng.choice(['10s', '20s', '30s'])}",
        f"  limits {{ memory {t.rng.choice(['1GiB', '2GiB', '4GiB'])}  pids 128 }}",
        "}",
        "",
        f'tool "{t.prefix}-builder" version "{major}.{minor}.0" {{',
        f'  description "Builds and tests the {t.topic} service"',
        '  permit proc.exec tool "make" args ["build" | "test"]',
        f'  permit fs.read paths ["{t.root}/src/**"]',
        "  side_effects [Read, Write, Process]",
        f"  safety {t.rng.choice(['Low', 'Medium'])}",
        "  network off",
        f'  profile "{t.prefix}-ci"',
        "  limits { cpu 2 }",
        "}",
    ]


def team_policy(t: Team) -> str:
    """The text of one team's policy (not yet in fmt's layout)."""
    imports = sorted(t.rng.sample(sorted(SHARED), 2))
    lines = [
        f"# Policy of {t.name}: the {t.topic} service ({t.lang}).",
        "# Generated by benchmarks/gen_policy_corpus.py for the authoring benchmark.",
        f'policy "bench/{t.name}" version "1.{t.rng.randint(0, 20)}.{t.rng.randint(0, 9)}"',
        "",
        *[f'import "../shared/{name}"' for name in imports],
        "",
        "defaults {",
        f"  timeout {t.rng.choice(['30s', '60s', '120s'])}",
        "  network restricted",
        f"  limits {{ bytes_in {t.rng.choice(_SIZES)}  bytes_out 1MiB  files 500  depth 8"
        "  concurrency 4 }",
        "}",
        "",
        f"# ---- rules {'-' * 86}",
    ]
    blocks: list[Callable[[Team], _BLOCK]] = [_read_src, _write_out, _no_release, _git, _api]
    blocks += t.rng.sample(_OPTIONAL, k=t.rng.randint(8, len(_OPTIONAL)))
    for block in blocks:
        lines += [*block(t), ""]
    lines += ["# Anything that writes or starts processes needs a human's recorded consent.",
              'require consent when `profile.safety == "High" || "Write" in profile.side_effects',
              '                     || "Process" in profile.side_effects`', ""]
    lines += _profile_and_tool(t)
    return "\n".join(lines) + "\n"


def team_tests(t: Team) -> str:
    """Five cases that pass: allows by named rules, a forbid, a mandatory and a default deny."""
    src = t.rng.choice(["main.py", "app/server.go", "lib/core.rs", "index.ts"])
    cases = [
        ("reading a source file is allowed", {"kind": "fs.read", "path": f"{t.root}/src/{src}"},
         "allow", "read-src"),
        ("a release write is refused", {"kind": "fs.write", "path": f"{t.root}/out/release/v1.tar",
                                        "bytes_b64": "AA=="}, "deny", "no-release"),
        ("git status is allowed", {"kind": "proc.exec", "tool": "git", "args": ["status"]},
         "allow", "git"),
        ("the team API is reachable", {"kind": "net.http", "method": "GET",
                                       "url": f"https://api.{t.name}.example.com/v1/items"},
         "allow", "api"),
        ("another team's files are not", {"kind": "fs.read",
                                          "path": f"/workspace/team-x{t.index}/src/main.py"},
         "deny", None),
    ]
    out = [f"policy: {t.name}.sbpolicy", "manifest: ../fixtures/bench-agent.json",
           "grant: ../fixtures/bench-grant.json", f"now_ms: {NOW_MS}", "cases:"]
    for name, op, decision, rule in cases:
        out += [f"  - name: {name}", f"    op: {json.dumps(op)}", f"    want_decision: {decision}"]
        if rule:
            out.append(f"    want_rule: {t.prefix}-{rule}")
    return "\n".join(out) + "\n"


# ---- the corpus --------------------------------------------------------------------------------

def generate(out: Path, files: int = 1000, seed: int = 1) -> list[Path]:
    """Write the corpus into ``out`` (emptied first); returns the team policy paths."""
    if out.exists():
        shutil.rmtree(out)
    (out / "shared").mkdir(parents=True)
    (out / "fixtures").mkdir()
    (out / "policies").mkdir()
    for name, text in SHARED.items():
        (out / "shared" / name).write_text(text, encoding="utf-8")
    (out / "fixtures" / "bench-agent.json").write_text(json.dumps(MANIFEST, indent=2) + "\n")
    (out / "fixtures" / "bench-grant.json").write_text(json.dumps(GRANT, indent=2) + "\n")
    paths = []
    for index in range(files):
        team = Team(index, seed)
        path = out / "policies" / f"{team.name}.sbpolicy"
        path.write_text(team_policy(team), encoding="utf-8")
        (out / "policies" / f"{team.name}.sbtest.yaml").write_text(team_tests(team))
        paths.append(path)
    return paths


def format_corpus(out: Path) -> None:
    """Rewrite the corpus in canonical layout with the real `policy-engine fmt`."""
    proc = subprocess.run(
        [sys.executable, "-m", "policy_engine.cli", "fmt", str(out / "shared"),
         str(out / "policies")],
        capture_output=True, text=True, check=False,
    )
    if proc.returncode != 0:
        raise SystemExit(
            f"policy-engine fmt failed ({proc.returncode}):\n{proc.stdout}{proc.stderr}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("build/policy-corpus"),
                        help="directory to (re)create (default: build/policy-corpus)")
    parser.add_argument("--files", type=int, default=1000, help="team policies (default 1000)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--no-fmt", action="store_true",
                        help="leave the files as generated instead of running policy-engine fmt")
    args = parser.parse_args()
    paths = generate(args.out, args.files, args.seed)
    if not args.no_fmt:
        format_corpus(args.out)
    lines = sum(p.read_text(encoding="utf-8").count("\n") for p in paths)
    print(f"{len(paths)} policies, {lines} lines, {len(paths)} test files in {args.out}")


if __name__ == "__main__":
    main()
