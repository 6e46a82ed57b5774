"""Per-test CPU for suite-time work (docs/testing.md "Where the time goes"): a pytest plugin
and its report.

Run the suite with ``-p tests.cpu_per_test``: each xdist worker moves itself into a cgroup v1
``cpuacct`` group of its own (``/sys/fs/cgroup/cpuacct/pe-suite/<worker>``; root only) and
appends one JSON line per test to ``$PE_CPU_LOG_DIR/<worker>.jsonl`` (default
``var/cpu-per-test``): its wall time and the CPU its worker and the worker's children (CLI
starts, servers) used meanwhile. Sandboxes and containers run in cgroups of their own and are
not counted. ``python3 -m tests.cpu_per_test [DIR]`` sums the lines by file.
"""

from __future__ import annotations

import collections
import json
import os
import sys
import time
from collections.abc import Generator
from pathlib import Path
from typing import IO

import pytest

_BASE = "/sys/fs/cgroup/cpuacct/pe-suite"


class _State:
    group: str | None = None
    out: IO[str] | None = None


def _log_dir() -> Path:
    return Path(os.environ.get("PE_CPU_LOG_DIR", "var/cpu-per-test"))


def pytest_configure(config: pytest.Config) -> None:
    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    group = f"{_BASE}/{worker}"
    try:
        os.makedirs(group, exist_ok=True)
        with open(f"{group}/cgroup.procs", "w", encoding="ascii") as fh:
            fh.write(str(os.getpid()))
    except OSError as exc:  # no cgroup v1 cpuacct, or not root: say so, measure nothing
        print(f"cpu_per_test: no cpuacct group ({exc}); nothing is measured", file=sys.stderr)
        return
    _log_dir().mkdir(parents=True, exist_ok=True)
    _State.group = group
    _State.out = open(_log_dir() / f"{worker}.jsonl", "a", encoding="utf-8")  # noqa: SIM115


def _usage_s() -> float:
    with open(f"{_State.group}/cpuacct.usage", encoding="ascii") as fh:
        return int(fh.read()) / 1e9


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None
                            ) -> Generator[None, None, None]:
    out = _State.out
    if out is None:
        yield
        return
    cpu, wall = _usage_s(), time.monotonic()
    yield
    out.write(json.dumps({"id": item.nodeid, "wall": round(time.monotonic() - wall, 3),
                          "cpu": round(_usage_s() - cpu, 3)}) + "\n")
    out.flush()


def report(where: Path, top: int = 40) -> str:
    """The files by CPU: wall, CPU, tests, file; the totals first."""
    rows = [json.loads(line) for f in sorted(where.glob("*.jsonl")) for line in f.open()]
    files: dict[str, list[float]] = collections.defaultdict(lambda: [0.0, 0.0, 0.0])
    for r in rows:
        f = files[r["id"].split("::", 1)[0]]
        f[0] += r["wall"]
        f[1] += r["cpu"]
        f[2] += 1
    lines = [f"{len(rows)} tests: {sum(r['wall'] for r in rows):.0f} worker-seconds, "
             f"{sum(r['cpu'] for r in rows):.0f} s of CPU", "   wall     cpu tests file"]
    for name, (wall, cpu, n) in sorted(files.items(), key=lambda kv: -kv[1][1])[:top]:
        lines.append(f"{wall:7.1f} {cpu:7.1f} {int(n):5d} {name}")
    return "\n".join(lines)


if __name__ == "__main__":
    print(report(Path(sys.argv[1]) if len(sys.argv) > 1 else _log_dir()))
