"""200 calls fd/thread/RSS check, then two threads with sibling-root profiles checking neither sandbox sees the other. PYTHONPATH=<checkout> python3 repro/concurrent_profiles.py"""
import os, time, tempfile, threading, resource
from pathlib import Path
from plugins.executor_proc.executor import ProcExecutor, ProcOptions
from policy_engine.executor import ExecContext
from policy_engine.model import ProcExecOp
from tests.integration.test_proc_sandbox import make_profile, fs_cap
base = Path(tempfile.mkdtemp(prefix="a39-"))
ex = ProcExecutor("bwrap", ProcOptions())
def prof(name):
    root = base/name; (root/"out").mkdir(parents=True, exist_ok=True); (root/f"only-{name}").write_text(name)
    return make_profile(root)
pa, pb = prof("A"), prof("B")
def call(p, cmd):
    ctx = ExecContext(profile=p, deadline=time.monotonic()+30)
    return ex.execute(ctx, ProcExecOp(tool="sh", args=("-c", cmd)))
for i in range(5): call(pa, "true")
fd0 = len(os.listdir("/proc/self/fd")); t0=threading.active_count(); rss0=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
st=time.monotonic()
for i in range(200): call(pa if i%2 else pb, "true")
print("200 calls", round(time.monotonic()-st,1), "s fds", fd0, "->", len(os.listdir("/proc/self/fd")), "threads", t0, threading.active_count(), "maxrss KB", rss0, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
# concurrency
bad=[]
def worker(p, mine, other, n):
    for i in range(n):
        r = call(p, f"ls {base}/A {base}/B 2>&1; true")
        s = r.out["stdout"]
        if f"only-{other}" in s or f"only-{mine}" not in s: bad.append(s)
ts=[threading.Thread(target=worker,args=(pa,"A","B",40)), threading.Thread(target=worker,args=(pb,"B","A",40))]
[t.start() for t in ts]; [t.join() for t in ts]
print("cross-binds seen:", len(bad), bad[:1])
ex.close()
