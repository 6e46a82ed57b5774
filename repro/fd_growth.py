"""Engine fds over 4x50 calls of one kind (timeout|kill|refuse|close|true); prints counts and the fds added. PYTHONPATH=<checkout> python3 repro/fd_growth.py KIND"""
import os, time, tempfile, threading, sys
from pathlib import Path
from plugins.executor_proc.executor import ProcExecutor, ProcOptions
from policy_engine.executor import ExecContext
from policy_engine.model import ProcExecOp
from policy_engine.errors import PolicyEngineError
from tests.integration.test_proc_sandbox import make_profile
base = Path(tempfile.mkdtemp(prefix="a39-")); root=base/"root"; (root/"out").mkdir(parents=True)
ex = ProcExecutor("bwrap", ProcOptions())
p = make_profile(root)
def call(cmd, dl=30, cwd=None):
    ctx = ExecContext(profile=p, deadline=time.monotonic()+dl)
    try: return ex.execute(ctx, ProcExecOp(tool="sh", args=("-c", cmd), cwd=cwd))
    except PolicyEngineError as e: return e.code
kind = sys.argv[1]
cmds = {"timeout": lambda: call("sleep 5", dl=0.3), "refuse": lambda: call("true", cwd="/etc"),
        "kill": lambda: call("kill -9 $$"), "close": lambda: call("exec >&-; sleep 0.05"), "true": lambda: call("true")}
for i in range(3): call("true")
def fds(): 
    r=[]
    for f in os.listdir("/proc/self/fd"):
        try: r.append(os.readlink(f"/proc/self/fd/{f}").split("[")[0])
        except OSError: pass
    return sorted(r)
f0 = fds()
out=[]
for r in range(4):
    for i in range(50): cmds[kind]()
    time.sleep(0.5); out.append(len(os.listdir("/proc/self/fd")))
print(kind, len(f0), out, threading.active_count())
f1=fds()
import collections
print(collections.Counter(f1)-collections.Counter(f0))
ex.close()
