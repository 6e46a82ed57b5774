"""Odd outputs through real proc-bwrap; each result/usage/side effect compared with its validated twin (_same). PYTHONPATH=<checkout> python3 repro/assembled_result_fuzz.py"""
import os, time, tempfile
from pathlib import Path
from plugins.executor_proc.executor import ProcExecutor, ProcOptions
from policy_engine.executor import ExecContext
from policy_engine.model import ProcExecOp
from policy_engine.errors import PolicyEngineError
from tests.integration.test_proc_sandbox import make_profile
from tests.integration.test_proc_call_path import _same
base = Path(tempfile.mkdtemp(prefix="a39-")); root=base/"root"; (root/"out").mkdir(parents=True)
ex = ProcExecutor("bwrap", ProcOptions())
cmds = {
 "nonutf8": r"printf '\377\376\200MARK\n'; printf '\355\240\200' >&2",
 "huge": "head -c 5000000 /dev/zero",
 "sigterm": "kill -TERM $$",
 "sigkill": "kill -KILL $$",
 "closeout": "exec >&-; exec 2>&-; sleep 0.2; exit 5",
 "bg_child": "(sleep 5 &) ; echo hi",
 "nul": r"printf 'a\0b'",
 "oom": "python3 -c 'x=bytearray(10**9)' || exit $?",
 "timeout": "sleep 30",
 "stdin_closed": "cat",
}
for name, c in cmds.items():
    lim = {"timeout_ms": 1500} if name=="timeout" else {}
    p = make_profile(root, **({"memory_bytes": 64*2**20} if name=="oom" else {}))
    ctx = ExecContext(profile=p, deadline=time.monotonic()+(2 if name=="timeout" else 30))
    try:
        r = ex.execute(ctx, ProcExecOp(tool="sh", args=("-c", c)))
        for m in (r, r.used, *ctx.side_effects): _same(m)
        print(name, "ok", r.out["exit_code"], r.out.get("signal"), len(r.out["stdout"]), repr(r.out["stderr"][:40]))
    except PolicyEngineError as e:
        print(name, "ERR", e.code, e.reason[:80])
    except Exception as e:
        print(name, "CRASH", type(e).__name__, e)
ex.close()
