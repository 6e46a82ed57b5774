"""F01 stress: 4 threads call spec._mask_patterns with fresh profiles (switch interval 1 us); prints the KeyErrors seen. PYTHONPATH=<checkout> python3 repro/mask_memo_race_stress.py"""
import sys, threading, tempfile
from pathlib import Path
from plugins.executor_proc import spec
from tests.integration.test_proc_sandbox import make_profile
root = Path(tempfile.mkdtemp(prefix="a39-")) / "root"; (root/"out").mkdir(parents=True)
base = make_profile(root)
sys.setswitchinterval(1e-6)
errs = []
def run(n):
    for i in range(n):
        p = base.model_copy(update={"call_id": f"c{i}"})
        try:
            spec._mask_patterns(p)
        except Exception as e:
            errs.append(repr(e)); return
ts = [threading.Thread(target=run, args=(20000,)) for _ in range(4)]
[t.start() for t in ts]; [t.join() for t in ts]
print(len(errs), errs[:3])
