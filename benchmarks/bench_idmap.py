"""What writing a root-owned tree through an id-mapped bind costs (issue 26 item 5).

Usage::

    python benchmarks/bench_idmap.py           # 2,000 files in 21 directories, 40 rounds
    python benchmarks/bench_idmap.py --quick   # 10 rounds

Run as root (as the engine that writes root-owned trees). Rows: the walk for hard-linked root
files (``uid.linked_files``) cold and warm, one id-mapped mount made and detached
(``idmap.IdMapped``, with one hard-linked file bound read-only), and a whole proc-bwrap call of
``true`` with ``fs.write`` on the tree, root-owned (mapped) against owned by the sandbox uid
(nothing mapped), interleaved. Medians in milliseconds. The hand-over this replaces cost 26 ms
the first time and 0.1 ms per call for the same tree (docs/operations.md).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run as a script from anywhere
    sys.path.insert(0, str(ROOT))

from plugins.executor_proc import idmap, uid  # noqa: E402 - needs the checkout root first
from plugins.executor_proc.executor import ProcExecutor  # noqa: E402 - same
from policy_engine.executor import ExecContext  # noqa: E402 - same
from policy_engine.model import ProcExecOp  # noqa: E402 - same
from tests.integration.test_proc_sandbox import make_profile  # noqa: E402 - same


def _tree(where: Path) -> Path:
    """make_profile's layout: ``where/out`` writable, 2,000 files in 21 directories."""
    out = where / "out"
    out.mkdir()
    for d in range(20):
        sub = out / f"d{d}"
        sub.mkdir()
        for f in range(100):
            (sub / f"f{f}.txt").write_text("x")
    (where / "host.txt").write_text("host")
    os.link(where / "host.txt", out / "d0" / "hard")
    return out


def _median_ms(fn: Callable[[], object], rounds: int) -> float:
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1000)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="10 rounds instead of 40")
    ns = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("run as root: only a root engine maps root-owned trees")
    rounds = 10 if ns.quick else 40
    where = Path(tempfile.mkdtemp(prefix="pe-bench-idmap-", dir="/tmp"))
    where.chmod(0o755)
    trees = [where]
    ex = ProcExecutor("bwrap")
    try:
        out = _tree(where)
        start = time.perf_counter()
        found = uid.linked_files([str(out)])
        cold = (time.perf_counter() - start) * 1000
        assert found == [str(out / "d0" / "hard")], found
        time.sleep(uid.RACY_NS / 1e9 + 0.2)  # listings of just-changed directories are redone
        uid.linked_files([str(out)])  # remembered from here on
        warm = _median_ms(lambda: uid.linked_files([str(out)]), rounds)

        def mount() -> None:
            idmap.IdMapped([str(out)], *uid.DEFAULT_RUN_AS,
                           readonly={str(out): found}).close()

        mapped = _median_ms(mount, rounds)
        op = ProcExecOp(tool="/usr/bin/true", args=())
        other = Path(tempfile.mkdtemp(prefix="pe-bench-idmap-", dir="/tmp"))
        trees.append(other)
        other.chmod(0o755)
        os.chown(_tree(other), *uid.DEFAULT_RUN_AS)  # the sandbox uid's: nothing mapped

        def call(root: Path) -> float:
            ctx = ExecContext(profile=make_profile(root), deadline=time.monotonic() + 60)
            start = time.perf_counter()
            assert ex.execute(ctx, op).out["exit_code"] == 0
            return (time.perf_counter() - start) * 1000

        call(where)
        call(other)
        mapped_calls, plain_calls = [], []
        for _ in range(rounds):  # interleaved: a load shift hits both rows alike
            time.sleep(0.02)
            mapped_calls.append(call(where))
            time.sleep(0.02)
            plain_calls.append(call(other))
        root_call = statistics.median(mapped_calls)
        plain_call = statistics.median(plain_calls)
    finally:
        ex.close()
        for tree in trees:
            shutil.rmtree(tree, ignore_errors=True)
    print(f"load: {os.getloadavg()[0]:.2f} (1 min); {rounds} rounds; medians in ms")
    print("| what | ms |\n| --- | ---: |")
    print(f"| linked_files, first walk (2,000 files, 21 dirs) | {cold:.2f} |")
    print(f"| linked_files, warm (directories unchanged) | {warm:.3f} |")
    print(f"| id-mapped mount + 1 read-only file bind, made and detached | {mapped:.2f} |")
    print(f"| proc-bwrap `true`, fs.write on the root-owned tree (mapped) | {root_call:.2f} |")
    print(f"| proc-bwrap `true`, same tree owned by the sandbox uid | {plain_call:.2f} |")


if __name__ == "__main__":
    main()
