"""Attack 40 F01 repro: a tmpfs holding .env moved onto a walked directory between calls is read
by the sandboxed tool. Modes: new (as shipped), old (quiet check off), nocache (no reuse), nothing
(no plan cache at all); the optional second argument is how many calls ran before the mount
(0: none, masked). Run as root from the worktree: python3 repro/mount_over_walked_dir.py nothing 4"""
import os, subprocess, sys, time, tempfile
from pathlib import Path
sys.path.insert(0, "/work/wt/attack40")
from plugins.executor_proc.executor import ProcExecutor
from policy_engine.executor import ExecContext
from policy_engine.model import ProcExecOp
from policy_engine.sandbox import masks, plancache, dircache
from tests.integration.test_proc_sandbox import make_profile
mode = sys.argv[1]
if mode == "old":
    plancache.PlanCache._quiet = lambda self, w: False
elif mode == "nocache":
    plancache.PlanCache.get = lambda self, key, w: None
elif mode == "nothing":
    plancache.PlanCache.get = lambda self, key, w: None
    plancache.PlanCache.token = lambda self, w: None
if mode == "invalidate":  # the fix direction: a mount-table change invalidates the walks
    real_drain = plancache.PlanCache._drain
    def drain(self):
        before = self.mounts
        real_drain(self)
        w = dircache.DEFAULT_CACHE.watcher
        if self.mounts != before and w is not None:
            with w._lock:
                w._invalidate()
    plancache.PlanCache._drain = drain
tmp = Path(tempfile.mkdtemp(prefix="a40diag"))
root = tmp / "root"
for d in ("out", "home/.ssh", "tmp", "src/pkg"):
    (root / d).mkdir(parents=True)
(root / "src/pkg/main.py").write_text("x")
stage = tmp / "stage"; stage.mkdir()
ex = ProcExecutor("bwrap")
prof = make_profile(root)
def cat(p):
    return ex.execute(ExecContext(profile=prof, deadline=time.monotonic()+60),
        ProcExecOp(tool="sh", args=("-c", f"cat {p} 2>&1; true"), cwd=str(root))).out["stdout"]
subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "pe-a40d", str(stage)], check=True)
moved = False
try:
    (stage / ".env").write_text("MOVED-SECRET")
    subprocess.run(["mount", "--make-private", str(stage)], check=True)
    time.sleep(0.1)
    for _ in range(int(sys.argv[2]) if len(sys.argv) > 2 else 4):
        cat(root / "src/pkg/main.py")
    subprocess.run(["mount", "--move", str(stage), str(root / "src/pkg")], check=True); moved = True
    for i in range(3):
        print(mode, i, repr(cat(root / "src/pkg/.env")), "mounts", plancache.cache().mounts)
finally:
    subprocess.run(["umount", str(root / "src/pkg" if moved else stage)], check=True)
    ex.close()
