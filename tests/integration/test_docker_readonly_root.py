"""The docker backend serves read-only proc.exec calls: its containers' root is read-only (F16).

A profile without fs.write needs ``readonly_rootfs`` from its backend; the docker executor used to
lack it, so `explain` said allow and `run` said ``SANDBOX.CAPABILITY_BLOCKED`` for the README's own
`git --version`. Run for real through the CLI, in both docker modes.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
POLICY = REPO / "examples" / "policies" / "org.sbpolicy"
REQUESTS = REPO / "examples" / "requests"

# writes the read-only root must refuse, and the private /tmp and work/ that stay writable
PROBE = textwrap.dedent("""
    import errno, json, os
    out = {}
    for p in ("/etc/planted", "/workspace/planted", "/tmp/ok", "/workspace/work/ok"):
        try:
            with open(p, "w") as fh:
                fh.write("x")
            out[p] = "written"
        except OSError as e:
            out[p] = errno.errorcode[e.errno]
    opts = {m.split()[1]: m.split()[3].split(",") for m in open("/proc/self/mounts")}
    out["root"], out["tmp"] = opts["/"][0], sorted(set(opts["/tmp"]) & {"rw", "nosuid", "nodev"})
    print(json.dumps(out))
""")
PY_POLICY = """policy "t/ro" version "1.0.0"
defaults { timeout 30s  network off }
permit "py" proc.exec tool "python3"
require consent when `false`
"""


def _cli(tmp_path: Path, mode: str, *args: str) -> subprocess.CompletedProcess[str]:
    cfg = tmp_path / f"engine-{mode}.yaml"
    cfg.write_text(f"state_dir: {tmp_path / 'state'}\nbackends:\n  proc.exec: docker\n"
                   f"options:\n  docker:\n    mode: {mode}\n    pool_size: 1\n")
    config = ["--config", str(cfg)] if args[0] == "run" else []  # explain runs nothing
    return subprocess.run([sys.executable, "-m", "policy_engine.cli", args[0], *config,
                           *args[1:]], capture_output=True, text=True, timeout=180,
                          check=False, cwd=tmp_path)


@pytest.mark.parametrize("mode", ["run-once", "pool"])
def test_explain_and_run_agree_on_a_read_only_git_call(tmp_path: Path, mode: str) -> None:
    req = str(REQUESTS / "git-version.json")
    explained = _cli(tmp_path, mode, "explain", "--policy", str(POLICY), "--request", req,
                     "--format", "json")
    assert json.loads(explained.stdout)["decision"] == "allow", explained.stdout
    ran = _cli(tmp_path, mode, "run", "--policy", str(POLICY), "--request", req,
               "--format", "json")
    assert "Traceback" not in ran.stderr
    out = json.loads(ran.stdout)
    assert out["decision"]["decision"] == "allow"
    assert out["result"]["ok"] is True, out["result"]
    assert out["result"]["out"]["stdout"].startswith("git version ")
    assert out["result"]["out"]["mode"] == mode


@pytest.mark.parametrize("mode", ["run-once", "pool"])
def test_the_image_is_never_written_only_tmp_and_work_are(tmp_path: Path, mode: str) -> None:
    (tmp_path / "p.sbpolicy").write_text(PY_POLICY)
    perms = [{"kind": "proc.exec", "tool": "python3"}]
    (tmp_path / "grant.json").write_text(json.dumps({
        "tenant": "t", "subject_id": "agent:ro", "tool_name": "py", "call_id": "c-ro",
        "capabilities": perms, "expires_at": 4102444800000, "budget": {"calls": 10}}))
    (tmp_path / "manifest.json").write_text(json.dumps({
        "name": "py", "version": "1.0.0", "permissions": perms, "side_effects": ["Process"],
        "safety_class": "Low"}))
    ran = _cli(tmp_path, mode, "run", "--policy", str(tmp_path / "p.sbpolicy"), "--manifest",
               str(tmp_path / "manifest.json"), "--grant", str(tmp_path / "grant.json"),
               "--format", "json", "--", "python3", "-c", PROBE)
    out = json.loads(ran.stdout)
    assert out["result"]["ok"] is True, out["result"]
    seen = json.loads(out["result"]["out"]["stdout"])
    assert seen == {"/etc/planted": "EROFS", "/workspace/planted": "EROFS",
                    "/tmp/ok": "written", "/workspace/work/ok": "written",
                    "root": "ro", "tmp": ["nodev", "nosuid", "rw"]}
