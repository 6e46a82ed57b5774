"""A wildcard glob binds what it matches, never its whole literal prefix (outsider round 5, F09):
with `fs.read /w/*/pub/**` the sandbox used to bind `/w`, and since every handed-over workspace
belongs to the one sandbox uid, a permitted process read another tenant's 0600 files that the
guard refuses. Run for real on every proc backend, strict profile semantics."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import textwrap
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from plugins.executor_proc.executor import ProcExecutor, ProcOptions
from policy_engine import PolicyEngineError
from policy_engine.executor import ExecContext
from policy_engine.guard.binds import MAX_GLOB_BINDS, glob_binds
from policy_engine.model import ProcExecOp, Profile
from tests.integration.test_proc_sandbox import fs_cap, make_profile

pytestmark = pytest.mark.integration

PYTHON = "/usr/bin/python3"
PROBE = textwrap.dedent("""
    import json, os, sys
    out = {}
    for key, path in json.loads(sys.argv[1]).items():
        try:
            out[key] = open(path).read() if key.startswith("read") else sorted(os.listdir(path))
        except OSError as e:
            out[key] = "refused: " + os.strerror(e.errno or 0)
    print(json.dumps(out))
""")


@pytest.fixture(scope="module")
def executors() -> Iterator[dict[str, ProcExecutor]]:
    made = {b: ProcExecutor(b) for b in ("bwrap", "landlock", "unshare")}
    for ex in made.values():
        assert ex.available() is True, ex.unavailable_reason
    yield made
    for ex in made.values():
        ex.close()


@pytest.fixture
def tenants() -> Iterator[Path]:
    """/w/A: another tenant's handed-over workspace; /w/B: ours; /w/C: a project with a public
    dir, a notes file and a private file of root's (world-readable on the host)."""
    w = Path(tempfile.mkdtemp(prefix="globbinds-", dir="/var/tmp"))
    w.chmod(0o755)
    (w / "A" / "work").mkdir(parents=True)
    (w / "A" / "work" / "s.txt").write_text("A-SECRET-marker")
    owned = ((w / "A", 0o700), (w / "A" / "work", 0o700), (w / "A" / "work" / "s.txt", 0o600))
    for p, mode in owned:
        os.chown(p, 65533, 65533)
        p.chmod(mode)
    for d in ("B/out", "B/home", "C/pub"):
        (w / d).mkdir(parents=True, mode=0o755)
    (w / "B" / "mine.txt").write_text("mine")
    (w / "C" / "pub" / "readme").write_text("public")
    (w / "C" / "notes.md").write_text("notes")
    (w / "C" / "private.txt").write_text("C-PRIVATE-marker")
    for p in (w / "B", w / "C", w / "B" / "mine.txt", w / "C" / "pub" / "readme",
              w / "C" / "notes.md", w / "C" / "private.txt"):
        p.chmod(0o755 if p.is_dir() else 0o644)
    yield w
    shutil.rmtree(w, ignore_errors=True)


def _profile(w: Path) -> Profile:
    base = make_profile(w / "B")
    return base.model_copy(update={
        "capabilities": (fs_cap("fs.read", f"{w}/B/**", f"{w}/*/pub/**", f"{w}/*/notes.md"),
                         fs_cap("fs.write", f"{w}/B/out/**")),
        "mappings": base.mappings.model_copy(update={"root_fs": str(w)})})


@pytest.mark.parametrize("backend", ["bwrap", "landlock", "unshare"])
def test_a_wildcard_glob_exposes_only_its_matches(executors: dict[str, ProcExecutor],
                                                  tenants: Path, backend: str) -> None:
    w = tenants
    ctx = ExecContext(profile=_profile(w), deadline=time.monotonic() + 60)
    targets = {"read:other-tenant": f"{w}/A/work/s.txt", "read:private": f"{w}/C/private.txt",
               "read:pub": f"{w}/C/pub/readme", "read:notes": f"{w}/C/notes.md",
               "read:mine": f"{w}/B/mine.txt", "list:root": str(w)}
    res = executors[backend].execute(ctx, ProcExecOp(
        tool=PYTHON, args=("-c", PROBE, json.dumps(targets)), cwd=str(w / "B")))
    assert res.ok, res
    assert res.out["exit_code"] == 0, res
    seen = json.loads(str(res.out["stdout"]))
    assert seen["read:pub"] == "public", seen
    assert seen["read:notes"] == "notes", seen
    assert seen["read:mine"] == "mine", seen
    assert str(seen["read:other-tenant"]).startswith("refused"), seen
    assert str(seen["read:private"]).startswith("refused"), seen
    assert "marker" not in json.dumps(seen)
    # the root's listing shows at most the bound names, never the other tenant's
    assert "A" not in seen["list:root"] or str(seen["list:root"]).startswith("refused"), seen


def test_glob_expansion_is_bounded_and_fails_closed(tmp_path: Path) -> None:
    """More matches than a sandbox view takes: nothing is bound for that glob (the tool sees
    less than the policy allows, never more)."""
    for i in range(MAX_GLOB_BINDS + 5):
        (tmp_path / f"p{i}" / "pub").mkdir(parents=True)
    assert glob_binds(f"{tmp_path}/*/pub/**") == []
    assert glob_binds(f"{tmp_path}/p1/pub/**") == [f"{tmp_path}/p1/pub"]
    ones = [i for i in range(MAX_GLOB_BINDS + 5) if str(i).startswith("1")]
    assert glob_binds(f"{tmp_path}/p1*/pub/**") == sorted(f"{tmp_path}/p{i}/pub" for i in ones)


@pytest.mark.parametrize("backend", ["bwrap", "landlock", "unshare"])
def test_a_wildcard_write_glob_hands_over_only_its_matches(executors: dict[str, ProcExecutor],
                                                           tenants: Path, backend: str) -> None:
    """Outsider round 5, F10: `fs.write /w/*/pub/**` handed the whole `/w` to the sandbox uid
    (root's 0600 files chowned for good) and mounted it writable."""
    w = tenants
    (w / "C" / "root-only").write_text("ROOT-marker")
    (w / "C" / "root-only").chmod(0o600)
    base = _profile(w)
    profile = base.model_copy(update={"capabilities": (
        *base.capabilities, fs_cap("fs.write", f"{w}/*/pub/**"))})
    code = textwrap.dedent("""
        import json, os, sys
        w = sys.argv[1]
        out = {}
        for key, fn in (("pub", lambda: open(w + "/C/pub/new", "w").write("ok")),
                        ("outside", lambda: open(w + "/C/planted", "w").write("x")),
                        ("readme", lambda: open(w + "/C/notes.md", "a").write("x")),
                        ("root-only", lambda: open(w + "/C/root-only").read())):
            try:
                out[key] = fn()
            except OSError as e:
                out[key] = "refused: " + os.strerror(e.errno or 0)
        print(json.dumps(out))
    """)
    ctx = ExecContext(profile=profile, deadline=time.monotonic() + 60)
    res = executors[backend].execute(ctx, ProcExecOp(tool=PYTHON, args=("-c", code, str(w)),
                                                     cwd=str(w / "B")))
    assert res.ok, res
    seen = json.loads(str(res.out["stdout"]))
    assert seen["pub"] == 2, seen
    assert all(str(seen[k]).startswith("refused") for k in ("outside", "readme", "root-only")), seen
    assert not (w / "C" / "planted").exists()
    assert (w / "C" / "notes.md").read_text() == "notes"
    assert os.stat(w / "C" / "root-only").st_uid == 0  # not handed over
    assert os.stat(w / "C").st_uid == 0


@pytest.mark.parametrize("backend", ["bwrap", "landlock", "unshare"])
def test_a_file_glob_never_binds_a_denied_or_hard_linked_file(
        executors: dict[str, ProcExecutor], tenants: Path, backend: str) -> None:
    """Outsider round 6, F05/F06: a glob matching files bound each match, and the mask walk
    only lists directories, so `pub/*` exposed the `.env` it matched (a mandatory deny) and
    `**/*.md` a hard link to a private key; the fs executor refuses both."""
    w = tenants
    pub = w / "C" / "pub"
    (pub / ".env").write_text("DOTENV-marker")
    (pub / ".env").chmod(0o644)
    key = w / "C" / "id_rsa"
    key.write_text("KEY-marker")
    key.chmod(0o644)
    os.link(key, pub / "k.md")
    base = _profile(w)
    profile = base.model_copy(update={"capabilities": (
        fs_cap("fs.read", f"{w}/B/**", f"{w}/C/pub/*", f"{w}/**/*.md"),
        fs_cap("fs.write", f"{w}/B/out/**"))})
    ctx = ExecContext(profile=profile, deadline=time.monotonic() + 60)
    targets = {"read:env": str(pub / ".env"), "read:link": str(pub / "k.md"),
               "read:pub": str(pub / "readme"), "read:notes": f"{w}/C/notes.md"}
    res = executors[backend].execute(ctx, ProcExecOp(
        tool=PYTHON, args=("-c", PROBE, json.dumps(targets)), cwd=str(w / "B")))
    assert res.ok, res
    seen = json.loads(str(res.out["stdout"]))
    assert seen["read:pub"] == "public", seen
    assert seen["read:notes"] == "notes", seen
    for key in ("read:env", "read:link"):  # masked (/dev/null over it) or refused
        assert seen[key] == "" or str(seen[key]).startswith("refused"), seen
    assert "marker" not in json.dumps(seen)


class _SwapAfterPlan(ProcExecutor):
    """Outsider round 6, F01 at its worst moment: the matched `C/pub` is swapped for a link to
    the other tenant's workspace after the plan and before the sandbox mounts it. The timing
    is forced here (a host-side swapper won 3 of 10 real races); the sandbox is real."""

    def __init__(self, launcher: str, swap: Callable[[], None]) -> None:
        super().__init__("bwrap", ProcOptions(launcher=launcher))  # type: ignore[arg-type]
        self.swap = swap

    def _reach(self, plan: Any, private_tmp: str | None, exe: str | None) -> Any:
        reach = super()._reach(plan, private_tmp, exe)
        self.swap()
        return reach


def _sandbox_owned_out(w: Path, launcher: str) -> None:
    """The writable ``B/out`` as an earlier call leaves it, for the Python launcher: it cannot
    carry an id-mapped bind, so a root-owned one is refused in strict mode first (issue 26)."""
    if launcher == "python":
        os.chown(w / "B" / "out", 65533, 65533)


@pytest.mark.parametrize("launcher", ["native", "python"])
def test_a_directory_swapped_for_a_link_after_the_plan_is_never_bound(tenants: Path,
                                                                     launcher: str) -> None:
    w = tenants
    pub = w / "C" / "pub"
    _sandbox_owned_out(w, launcher)

    def swap() -> None:
        pub.rename(w / "C" / "pub.old")
        pub.symlink_to(w / "A" / "work")

    ex = _SwapAfterPlan(launcher, swap)
    try:
        assert ex.available() is True, ex.unavailable_reason
        ctx = ExecContext(profile=_profile(w), deadline=time.monotonic() + 60)
        targets = {"read:swapped": f"{w}/C/pub/s.txt", "list:swapped": f"{w}/C/pub"}
        with pytest.raises(PolicyEngineError) as refused:
            ex.execute(ctx, ProcExecOp(tool=PYTHON, args=("-c", PROBE, json.dumps(targets)),
                                       cwd=str(w / "B")))
        assert refused.value.code.value == "TOOL.EXECUTION_FAILED", refused.value
        assert "symlink on its path" in refused.value.reason, refused.value  # the link named
    finally:
        ex.close()


def test_more_binds_than_the_launcher_stages_are_refused_by_name(
        executors: dict[str, ProcExecutor], tenants: Path) -> None:
    """Three globs of 250 matches each: 751 binds, over what the launcher stages (480). The
    refusal is the executor's `refusal`, so the backend selection (explain) answers it too."""
    w = tenants
    for i in range(250):
        for letter in "pqr":
            (w / "C" / f"{letter}{i}" / "pub").mkdir(parents=True)
    base = _profile(w)
    profile = base.model_copy(update={"capabilities": (
        fs_cap("fs.read", f"{w}/B/**", *(f"{w}/C/{x}*/pub/**" for x in "pqr")),)})
    op = ProcExecOp(tool=PYTHON, args=("-c", "1"), cwd=str(w / "B"))
    why = executors["bwrap"].refusal(profile, op)
    assert why is not None
    assert why.code.value == "SANDBOX.CAPABILITY_BLOCKED"
    assert "would bind 751 paths" in why.reason, why.reason
    with pytest.raises(PolicyEngineError) as refused:
        executors["bwrap"].execute(ExecContext(profile=profile,
                                               deadline=time.monotonic() + 60), op)
    assert refused.value.reason == why.reason


@pytest.mark.parametrize("launcher", ["native", "python"])
def test_a_link_swapped_in_before_the_plan_resolves_it_is_not_followed(
        tenants: Path, launcher: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Outsider round 7, F01: the swap landed after the glob was expanded but before the plan
    resolved its binds, and `realpath` followed the link (3 of 43 tries). A link in a directory
    someone other than root may write is never resolved: the launcher refuses it. The timing
    is forced (the swap runs right after the expansion); the sandbox is real."""
    from plugins.executor_proc import spec

    w = tenants
    pub = w / "C" / "pub"
    _sandbox_owned_out(w, launcher)
    (w / "C").chmod(0o777)  # a workspace others write (the sandbox uid's, a shared tree)
    expand = spec.bound_paths

    def expand_then_swap(profile: Profile) -> tuple[list[str], list[str]]:
        out = expand(profile)
        if not pub.is_symlink():
            pub.rename(w / "C" / "pub.old")
            pub.symlink_to(w / "A" / "work")
        return out

    monkeypatch.setattr(spec, "bound_paths", expand_then_swap)
    ex = ProcExecutor("bwrap", ProcOptions(launcher=launcher))  # type: ignore[arg-type]
    try:
        ctx = ExecContext(profile=_profile(w), deadline=time.monotonic() + 60)
        targets = {"read:swapped": f"{w}/C/pub/s.txt"}
        with pytest.raises(PolicyEngineError) as refused:
            ex.execute(ctx, ProcExecOp(tool=PYTHON, args=("-c", PROBE, json.dumps(targets)),
                                       cwd=str(w / "B")))
        assert refused.value.code.value == "TOOL.EXECUTION_FAILED", refused.value
    finally:
        ex.close()
        (w / "C").chmod(0o755)


def test_an_engine_path_through_a_symlink_still_runs(tmp_path: Path) -> None:
    """Outsider round 7, F02: with the launcher cache below a symlinked HOME (closed to the
    sandbox uid, so staged), every proc-bwrap call failed once staging refused symlinks."""
    real = Path(tempfile.mkdtemp(prefix="cache-real-", dir="/var/tmp"))
    link = Path(tempfile.mkdtemp(prefix="cache-link-", dir="/var/tmp"))
    try:
        real.chmod(0o700)
        link.rmdir()
        link.symlink_to(real)
        root = Path(tempfile.mkdtemp(prefix="ws-", dir="/var/tmp"))
        root.chmod(0o755)
        (root / "out").mkdir()
        (root / "home").mkdir()
        ex = ProcExecutor("bwrap", ProcOptions(launcher_cache=str(link / "bin"), prespawn=0))
        try:
            assert ex.available() is True, ex.unavailable_reason
            res = ex.execute(ExecContext(profile=make_profile(root),
                                         deadline=time.monotonic() + 60),
                             ProcExecOp(tool=PYTHON, args=("-c", "print('ran')")))
        finally:
            ex.close()
            shutil.rmtree(root, ignore_errors=True)
        assert res.ok, res
        assert res.out["stdout"] == "ran\n", res.out
    finally:
        link.unlink()
        shutil.rmtree(real, ignore_errors=True)
