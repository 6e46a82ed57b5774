"""The exact diff against brute force: random policy pairs over a small universe, every request.

For each pair, every request of a fixed finite universe is decided by both versions with the
real engine; each request decided differently must fall in a change the diff reports (same kind,
both decisions and codes, both deciding rules): no missed change. Each reported change's witness
is decided again here and must differ: no false change.
"""

from __future__ import annotations

import base64
import os
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from policy_engine.analysis.difference import Report, diff
from policy_engine.analysis.witness import Decider, grant_for, manifest_for, verdict
from policy_engine.compiler import compile_files
from policy_engine.graph.policyset import PolicySet
from policy_engine.model import (
    ExecOp,
    FsCapability,
    FsReadOp,
    FsWriteOp,
    NetHttpCapability,
    NetHttpOp,
    ProcCapability,
    ProcExecOp,
)

GLOBS = ['"/a/**"', '"/a/*"', '"/b/**"', '"**/.env"', '"/a/b"', '"/*/b"', '"/a/b/**"']
HOSTS = ['"a.com"', '"*.a.com"', '"b.com"', '"*"', '"10.0.0.0/8"']
METHODS = ['"GET"', '"POST"', '"DELETE"']
PORTS = ["443", "8443"]
ARGS = ['["status"]', '["log", /--(a|b)/ ...]', '[/x.*/]', '["status" | "log"]', '[/[a-z]+/ ...]',
        '["log", /.*/]']
LIMITS = ["", " limits { bytes_in 10 }", " limits { bytes_in 20 }"]
WRITE_GLOBS = ['"/workspace/**"', '"/workspace/a/**"', '"/workspace/*/b"']
WHEN = ["", " when `request.size <= 3`", " when `request.size > 5 && request.size != 7`"]

PATHS = ["/", "/a", "/a/b", "/a/c", "/a/b/c", "/a/.env", "/b", "/b/b", "/b/.env", "/ab",
         "/a-evil/b", "/c/b", "/c/.env", "/.env", "/a/b/.env"]
HOSTNAMES = ["a.com", "x.a.com", "y.x.a.com", "b.com", "x.b.com", "c.org", "10.0.0.1",
             "1.2.3.4", "127.0.0.1"]
ARGVS = [(), ("status",), ("log",), ("log", "--a"), ("log", "--a", "--b"), ("log", "--c"),
         ("log", "x"), ("x",), ("xy",), ("y",), ("status", "log"), ("log", "")]


def _rule(i: int, effect: str, kind: str, draw: st.DrawFn) -> str:
    name = f'"r{i}"'
    if kind == "fs.read":
        globs = draw(st.lists(st.sampled_from(GLOBS), min_size=1, max_size=2, unique=True))
        limits = draw(st.sampled_from(LIMITS)) if effect == "permit" else ""
        return f"{effect} {name} fs.read paths [{', '.join(globs)}]{limits}"
    if kind == "fs.write":
        globs = draw(st.lists(st.sampled_from(WRITE_GLOBS), min_size=1, max_size=2, unique=True))
        return f"{effect} {name} fs.write paths [{', '.join(globs)}]{draw(st.sampled_from(WHEN))}"
    if kind == "net.http":
        hosts = draw(st.lists(st.sampled_from(HOSTS), min_size=1, max_size=2, unique=True))
        methods = draw(st.lists(st.sampled_from(METHODS), max_size=2, unique=True))
        ports = draw(st.lists(st.sampled_from(PORTS), max_size=2, unique=True))
        text = f"{effect} {name} net.http hosts [{', '.join(hosts)}] schemes [\"https\"]"
        text += f" methods [{', '.join(methods)}]" if methods else ""
        return text + (f" ports [{', '.join(ports)}]" if ports else "")
    args = draw(st.sampled_from(["", *ARGS]))
    return f'{effect} {name} proc.exec tool "git"' + (f" args {args}" if args else "")


@st.composite
def policies(draw: st.DrawFn) -> str:
    n = draw(st.integers(min_value=0, max_value=4))
    rules = [_rule(i, draw(st.sampled_from(["permit", "permit", "forbid"])),
                   draw(st.sampled_from(["fs.read", "fs.write", "net.http", "proc.exec"])), draw)
             for i in range(n)]
    return 'policy "p" version "1"\ndefaults { network on }\n' + "\n".join(rules) + "\n"


def compiled(text: str, where: Path, name: str) -> PolicySet:
    path = where / name
    path.write_text(text)
    return compile_files([path])


def universe() -> list[tuple[ExecOp, object]]:
    out: list[tuple[ExecOp, object]] = []
    for p in PATHS:
        for n in (None, 10, 11, 20, 21):
            out.append((FsReadOp(path=p, len=n), FsCapability(kind="fs.read", paths=(p,))))
    for h in HOSTNAMES:
        for m in ("GET", "POST", "DELETE", "PUT"):
            for port in (443, 8443, 80):
                out.append((NetHttpOp(method=m, url=f"https://{h}:{port}/"),
                            NetHttpCapability(hosts=(h,), ports=(port,), schemes=("https",),
                                              methods=(m,))))
    out += [(ProcExecOp(tool="git", args=a), ProcCapability(tool="git")) for a in ARGVS]
    for p in ("/workspace", "/workspace/a", "/workspace/a/b", "/workspace/c/b", "/workspace/c"):
        for size in range(9):
            out.append((FsWriteOp(path=p, bytes_b64=base64.b64encode(bytes(size)).decode()),
                        FsCapability(kind="fs.write", paths=(p,))))
    return out


UNIVERSE = universe()


def check(old_text: str, new_text: str) -> Report:
    with tempfile.TemporaryDirectory() as tmp:
        old, new = compiled(old_text, Path(tmp), "old.sbpolicy"), compiled(
            new_text, Path(tmp), "new.sbpolicy")
        report = diff(old, new)
        da, db = Decider(old), Decider(new)
        reported = {(c.kind, c.old.key, c.old.rule_id, c.new.key, c.new.rule_id)
                    for c in report.changes}
        for op, cap in UNIVERSE:
            g, m = grant_for(cap), manifest_for(cap)  # type: ignore[arg-type]
            a, b = verdict(da(op, g, m)), verdict(db(op, g, m))
            if a.key != b.key:
                kind = op.kind
                assert (kind, a.key, a.rule_id, b.key, b.rule_id) in reported, (
                    f"missed: {op} {a} -> {b}\nold:\n{old_text}\nnew:\n{new_text}")
        for c in report.changes:  # no false change: each witness differs when decided again
            g, m = grant_for(c.witness.cap, c.setting), manifest_for(c.witness.cap, c.setting)
            a, b = verdict(da(c.witness.op, g, m)), verdict(db(c.witness.op, g, m))
            assert a.key != b.key or c.limits, f"false change: {c.witness.op}"
        assert report.exact
        return report


EXAMPLES = int(os.environ.get("DIFF_EXAMPLES", "20"))  # more in a nightly run: DIFF_EXAMPLES=500


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(old=policies(), new=policies())
def test_no_missed_and_no_false_change(old: str, new: str) -> None:
    check(old, new)


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(old=policies())
def test_a_policy_against_itself_has_no_change(old: str) -> None:
    assert check(old, old).changes == []
