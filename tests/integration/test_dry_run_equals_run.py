"""Dry run equals run: a Hypothesis corpus of policies and ops, each decided by ``explain`` and
then run through the orchestrator on the real executors (a real workspace, a loopback HTTP
server, bubblewrap for processes, the tmp executor).

The promise checked (issue "What is decided is what runs", DESIGN.md §10):

- explain allows ⇒ the run is not refused with a policy-class code, unless a runtime fact a dry
  run cannot know explains it (listed in docs/cli.md: a file that does not exist yet is the one
  this corpus produces; DNS answers and late symlinks are not generated here);
- explain denies ⇒ the run denies with the same code.

``PE_DIFF_REPORT=FILE`` surveys instead of asserting: every disagreement and the running counts
are appended to FILE. ``PE_DIFF_EXAMPLES`` sets the number of generated policies (each decides
and runs every op of its batch); the default keeps the test command within its budget, a release
run uses thousands.
"""

from __future__ import annotations

import base64
import os
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from policy_engine.compiler import compile_files
from policy_engine.config import EngineConfig
from policy_engine.explain import explain
from policy_engine.explain.request import ExplainRequest
from policy_engine.model import (
    BrowserCapability,
    BrowserNavOp,
    Budget,
    Consent,
    FsCapability,
    FsListOp,
    FsReadOp,
    FsWriteOp,
    Grant,
    Manifest,
    NetHttpCapability,
    NetHttpOp,
    ProcCapability,
    ProcExecOp,
    Settings,
    TmpAllocOp,
    TmpCapability,
)
from policy_engine.orchestrator import Orchestrator
from tests.integration.servers import LoopbackServer, send

pytestmark = pytest.mark.integration

POLICY_CODES = frozenset({"SANDBOX.CAPABILITY_BLOCKED", "POLICY.DENY_TOOL",
                          "SANDBOX.PERMISSION_DENY"})
EXAMPLES = int(os.environ.get("PE_DIFF_EXAMPLES", "60"))
REPORT = os.environ.get("PE_DIFF_REPORT")  # survey mode: append disagreements to this file
NOW = 1_795_000_000_000

ROUTES = {
    "/json": lambda h: send(h, 200, "application/json", b'{"ok": true}'),
    "/text": lambda h: send(h, 200, "text/plain", b"plain text " * 20),
    "/big": lambda h: send(h, 200, "text/plain", b"x" * 200_000),
}


@dataclass
class World:
    """The real workspace and server every generated policy is decided and run against."""

    root: Path
    port: int
    state: Path


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    base = tmp_path_factory.mktemp("diff")
    root = base / "ws"
    (root / "src" / "sub").mkdir(parents=True)
    (root / "work").mkdir()
    (root / "home").mkdir()
    (root / "tmp").mkdir()
    (root / "src" / "a.txt").write_text("A" * 1000)
    (root / "src" / "b.txt").write_text("small")
    (root / "src" / "sub" / "c.txt").write_text("nested")
    (root / "src" / ".env").write_text("TOKEN=not-for-agents")
    # what lies on the disk is decided too (docs/cli.md): in-root links, a link out of the
    # root, a FIFO
    os.symlink("src", root / "l_src")
    os.symlink("src/a.txt", root / "l_a")
    os.symlink("work", root / "l_work")
    os.symlink("/etc", root / "l_etc")
    os.mkfifo(root / "src" / "pipe")
    with LoopbackServer(ROUTES) as srv:
        yield World(root=root, port=srv.port, state=base / "state")


# ---- the corpus -------------------------------------------------------------------------------

SIZES = ["16B", "100B", "4KiB", "1MiB"]
TIMEOUTS = ["1s", "5s", "30s"]


def _limits(draw: st.DrawFn, names: list[str]) -> str:
    chosen = draw(st.lists(st.sampled_from(names), unique=True, max_size=2))
    parts = []
    for name in chosen:
        if name in ("bytes_in", "bytes_out"):
            parts.append(f"{name} {draw(st.sampled_from(SIZES))}")
        elif name == "timeout":
            parts.append(f"timeout {draw(st.sampled_from(TIMEOUTS))}")
        elif name in ("files", "depth"):
            parts.append(f"{name} {draw(st.integers(0, 5))}")
        elif name == "memory":
            parts.append(f"memory {draw(st.sampled_from(['64MiB', '256MiB', '1GiB']))}")
        elif name == "pids":
            parts.append(f"pids {draw(st.sampled_from([8, 64]))}")
    return f"\n  limits {{ {'  '.join(parts)} }}" if parts else ""


@st.composite
def policies(draw: st.DrawFn, root: str, port: int) -> str:
    """A policy over the world's root and port, built from every rule form the corpus knows."""
    rules: list[str] = []
    defaults = []
    if draw(st.booleans()):
        defaults.append(f"timeout {draw(st.sampled_from(TIMEOUTS))}")
    network = draw(st.sampled_from(["on", "off"]))
    defaults.append(f"network {network}")
    lines = ['policy "diff/p" version "1.0.0"', "", "defaults {", *(f"  {d}" for d in defaults),
             "}"]
    read_glob = draw(st.sampled_from([f"{root}/**", f"{root}/src/**", f"{root}/src/*.txt"]))
    kinds = draw(st.sampled_from(["fs.read, fs.list", "fs.read", "fs.list"]))
    rules.append(f'permit "read" {kinds} paths ["{read_glob}"]'
                 + _limits(draw, ["bytes_in", "files", "depth"]))
    if draw(st.booleans()):
        cond = draw(st.sampled_from(["", " when `request.size <= 64`",
                                     ' when `grant.subject_id.startsWith("agent:")`']))
        rules.append(f'permit "write" fs.write paths ["{root}/work/**"]{cond}')
    if draw(st.booleans()):
        rules.append(f'forbid "no-sub" fs.read, fs.list paths ["{root}/src/sub/**"]')
    methods = draw(st.lists(st.sampled_from(["GET", "HEAD", "POST"]), min_size=1, unique=True))
    mime = draw(st.sampled_from(['', ' mime ["application/json"]', ' mime ["text/plain"]']))
    rules.append(f'permit "http" net.http hosts ["127.0.0.1"] schemes ["http"] ports [{port}]'
                 f' methods [{", ".join(map(repr_str, methods))}]{mime}'
                 + _limits(draw, ["bytes_in", "timeout"]))
    args = draw(st.sampled_from(['args [/[a-z]+/ ...]', 'args ["hello"]', '']))
    env = draw(st.sampled_from(['', ' env ["LANG"]', ' env [/^LC_/, "LANG"]',
                                ' env ["GIT_DIR", "LANG"]']))
    rules.append(f'permit "echo" proc.exec tool "echo" {args}{env}'
                 + _limits(draw, ["timeout", "memory", "pids"]))
    rules.append('permit "sleep" proc.exec tool "sleep" args [/[0-9.]+/]'
                 + _limits(draw, ["timeout"]))
    if draw(st.booleans()):
        rules.append('forbid "no-secret-word" proc.exec tool "echo" args ["secret", /.*/ ...]')
    rules.append(f'permit "scratch" tmp.use max_bytes {draw(st.sampled_from(SIZES))}')
    if draw(st.booleans()):
        rules.append(f'permit "browse" browser.use hosts ["127.0.0.1"] schemes ["http"] '
                     f'ports [{port}] scopes [{draw(st.sampled_from(["open", "open, extract"]))}]')
    if draw(st.booleans()):
        rules.append('require consent when `"Write" in profile.side_effects`')
    # the named profile the manifest applies; requiring gVisor, which the corpus's proc backend
    # (bubblewrap) cannot provide, refuses every proc.exec at backend selection: explain, given
    # the engine's executors, must refuse it the same way
    isolation = draw(st.sampled_from(["", "  isolation gvisor\n"]))
    rules.append(f'profile "diff" {{\n{isolation}}}')
    return "\n".join(lines + [""] + rules) + "\n"


def repr_str(s: str) -> str:
    return f'"{s}"'


def ops(root: str, port: int) -> st.SearchStrategy[object]:
    paths = st.sampled_from([f"{root}/src/a.txt", f"{root}/src/b.txt", f"{root}/src/sub/c.txt",
                             f"{root}/src/.env", f"{root}/src/missing.txt", f"{root}/../etc",
                             f"{root}/src", f"{root}/l_a", f"{root}/l_src/b.txt",
                             f"{root}/l_src/.env", f"{root}/src/pipe", f"{root}/l_etc/hostname"])
    dirs = st.sampled_from([f"{root}/src", f"{root}", f"{root}/src/sub", f"{root}/l_src"])
    cwds = st.sampled_from([None, f"{root}/src", f"{root}/l_src", f"{root}/l_etc", "/etc",
                            f"{root}/home", f"{root}/work"])
    url = st.builds(lambda p, q: f"http://127.0.0.1:{port}{p}{q}",
                    st.sampled_from(["/json", "/text", "/big", "/absent"]),
                    st.sampled_from(["", "?q=1"]))
    headers = st.sampled_from([{}, {"Accept": "text/plain"}, {"Host": "evil.example"},
                               {"X-Bad": "a\r\nInjected: 1"}, {"Content-Length": "5"}])
    env = st.sampled_from([{}, {"LANG": "C"}, {"LC_ALL": "C"}, {"LD_PRELOAD": "/tmp/x.so"},
                           {"GIT_DIR": "/tmp/x"}, {"PATH": "/tmp"}])
    return st.one_of(
        st.builds(FsReadOp, path=paths, len=st.sampled_from([None, 8, 5000])),
        st.builds(FsListOp, path=dirs, depth=st.integers(0, 4)),
        st.builds(FsWriteOp, path=st.sampled_from([f"{root}/work/out.txt",
                                                   f"{root}/src/out.txt",
                                                   f"{root}/l_work/linked.txt",
                                                   f"{root}/work"]),
                  bytes_b64=st.sampled_from([base64.b64encode(b"x" * n).decode()
                                             for n in (10, 100)]),
                  overwrite=st.sampled_from([True, True, False])),
        st.builds(NetHttpOp, method=st.sampled_from(["GET", "get", "POST", "HEAD"]), url=url,
                  headers=headers),
        st.builds(ProcExecOp, tool=st.just("echo"),
                  args=st.sampled_from([("hello",), ("secret", "x"), ("UPPER",), ()]), env=env,
                  timeout_ms=st.sampled_from([None, 2000]), cwd=cwds),
        st.builds(ProcExecOp, tool=st.just("sleep"), args=st.sampled_from([("0.1",), ("2",)])),
        st.builds(TmpAllocOp, size_bytes=st.sampled_from([10, 50_000, 5_000_000])),
        st.builds(BrowserNavOp, url=url, extract=st.sampled_from(["text", "none"])),
    )


def fixtures(root: str, port: int, consent: bool) -> tuple[Manifest, Grant]:
    caps = (FsCapability(kind="fs.read", paths=(f"{root}/**",)),
            FsCapability(kind="fs.list", paths=(f"{root}/**",)),
            FsCapability(kind="fs.write", paths=(f"{root}/work/**", f"{root}/src/**")),
            NetHttpCapability(hosts=("127.0.0.1",), ports=(port,), schemes=("http",),
                              methods=("GET", "HEAD", "POST")),
            ProcCapability(tool="echo"), ProcCapability(tool="sleep"),
            BrowserCapability(hosts=("127.0.0.1",), schemes=("http",), ports=(port,)),
            TmpCapability(max_bytes=64 * 1024 * 1024))
    manifest = Manifest(name="diff-tool", version="1", permissions=caps,
                        side_effects=("Read", "Write", "Network", "Process"),  # type: ignore[arg-type]
                        network="on", profile="diff")  # type: ignore[arg-type]
    grant = Grant(tenant="acme", subject_id="agent:diff", tool_name="diff-tool", call_id="c-diff",
                  capabilities=caps, expires_at=4_102_444_800_000, budget=Budget(calls=10**6),
                  consent=Consent(granted_by="user:dana", granted_at=NOW - 1000,
                                  expires_at=4_102_444_800_000) if consent else None)
    return manifest, grant


# ---- the property -------------------------------------------------------------------------------

STATS: Counter[str] = Counter()


# What the server answers is a runtime fact (docs/cli.md, "Dry run equals run"): the response's
# content type against a rule's `mime`, and its size against `bytes_in`.
RESPONSE_FACTS = ("response content type", "declared body of", "response body")


def runtime_fact(op: object, message: str | None) -> bool:
    """A refusal a dry run cannot foresee: the file the op names does not exist (yet), or the
    server's response (type, size) is refused.
    """
    path = getattr(op, "path", None)
    if isinstance(op, FsReadOp | FsListOp) and path is not None and not os.path.exists(path):
        return True
    return isinstance(op, NetHttpOp) and any(f in (message or "") for f in RESPONSE_FACTS)


@settings(max_examples=EXAMPLES, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                 HealthCheck.data_too_large])
@given(data=st.data())
def test_explain_agrees_with_the_run(world: World, tmp_path_factory: pytest.TempPathFactory,
                                     data: st.DataObject) -> None:
    root, port = str(world.root), world.port
    source = data.draw(policies(root, port), label="policy")
    batch = data.draw(st.lists(ops(root, port), min_size=4, max_size=8), label="ops")
    consent = data.draw(st.sampled_from([True, True, True, False]), label="consent")
    folder = tmp_path_factory.mktemp("pol")
    (folder / "p.sbpolicy").write_text(source)
    policyset = compile_files([folder / "p.sbpolicy"])
    manifest, grant = fixtures(root, port, consent)
    settings_ = Settings(root_fs=root, tmp_dir=f"{root}/tmp")
    config = EngineConfig(state_dir=folder / "state", budget_meter="memory",
                          revocation="memory")
    disagreements = []
    with Orchestrator(policyset, config=config, clock=lambda: NOW) as orch:
        for op in batch:
            request = ExplainRequest(op=op, now_ms=NOW, settings=settings_)  # type: ignore[arg-type]
            dry = explain(policyset, manifest, grant, request,
                          executors=orch.components.executors, config=config).decision
            ran = orch.run(grant, manifest, op, settings=settings_, now_ms=NOW)  # type: ignore[arg-type]
            STATS["ops"] += 1
            STATS[f"explain-{dry.decision}"] += 1
            STATS[f"{op.kind}:{dry.decision}"] += 1
            if dry.allowed:
                code = ran.result.code
                if code in POLICY_CODES and not runtime_fact(op, ran.result.message):
                    disagreements.append((op, "explain allowed", code, ran.result.message))
                elif code in POLICY_CODES:
                    STATS["runtime-facts"] += 1
            else:
                if ran.result.ok or ran.result.code != dry.code:
                    disagreements.append((op, f"explain denied {dry.code}: {dry.reason}",
                                          ran.result.code, ran.result.message))
    STATS["disagreements"] += len(disagreements)
    if REPORT:  # a survey run: record every disagreement instead of shrinking the first one
        with open(REPORT, "a") as fh:
            fh.writelines(f"{d[1]} -> {d[2]}: {d[3]} | {d[0]!r}\n" for d in disagreements)
            fh.write(f"# {dict(STATS)}\n")
        return
    assert not disagreements, f"policy:\n{source}\n" + "\n".join(map(str, disagreements))
