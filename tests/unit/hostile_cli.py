"""Run `policy-engine` in a child process under a memory cap, measuring its peak RSS and time.

The hostile-input tests start from inputs that, before the fix, grew to 8 GB or segfaulted:
a child process with an address-space limit keeps a regression from taking the machine down
with it. Its peak RSS is the ``VmHWM`` of its own address space, written at exit: ``ru_maxrss``
would include the test process's own size, since Linux carries the high-water mark across
fork and exec.
"""

from __future__ import annotations

import os
import resource
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
HOSTILE = ROOT / "tests" / "data" / "hostile"
ORG = EXAMPLES / "policies" / "org.sbpolicy"
SHELL_MANIFEST = EXAMPLES / "manifests" / "shell.json"
SHELL_GRANT = EXAMPLES / "grants" / "shell-agent.json"
GIT_STATUS = EXAMPLES / "requests" / "git-status.json"
GITHUB_GET = EXAMPLES / "requests" / "github-api-get.json"

_WRAPPER = """
import atexit, os, runpy, sys
def _peak():
    with open("/proc/self/status") as status, open(os.environ["HOSTILE_HWM_FILE"], "w") as out:
        out.write(next(x for x in status if x.startswith("VmHWM:")).split()[1])
atexit.register(_peak)
sys.argv = ["policy-engine", *sys.argv[1:]]
runpy.run_module("policy_engine.cli", run_name="__main__", alter_sys=True)
"""


@dataclass(frozen=True)
class Ran:
    """What one command did: exit code (negative: killed by that signal), output, peak RSS in
    KiB and wall time in seconds."""

    code: int
    out: str
    err: str
    max_rss_kb: int
    seconds: float

    @property
    def output(self) -> str:
        return self.out + self.err

    def __str__(self) -> str:
        return (f"exit {self.code}, {self.max_rss_kb} KiB, {self.seconds:.1f} s\n"
                f"stdout: {self.out[-1500:]}\nstderr: {self.err[-1500:]}")


def run_cli(args: list[str], cwd: Path | None = None, *, stdin: bytes = b"",
            mem_mb: int = 1500, timeout: float = 120) -> Ran:
    """``policy-engine ARGS`` as ``python -m policy_engine.cli``, capped at ``mem_mb`` MiB of
    address space and killed after ``timeout`` seconds."""
    def cap() -> None:
        limit = mem_mb * 1024 * 1024
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))

    with tempfile.TemporaryFile() as fin, tempfile.TemporaryFile() as fout, \
            tempfile.TemporaryFile() as ferr, tempfile.TemporaryDirectory() as tmp:
        hwm = Path(tmp) / "hwm"
        env = {**os.environ, "PYTHONPATH": str(ROOT), "HOSTILE_HWM_FILE": str(hwm)}
        env.pop("POLICY_ENGINE_DEBUG", None)
        fin.write(stdin)
        fin.seek(0)
        start = time.monotonic()
        proc = subprocess.Popen(  # noqa: S603 - our own CLI with the test's arguments
            [sys.executable, "-c", _WRAPPER, *args], cwd=cwd, env=env,
            stdin=fin, stdout=fout, stderr=ferr, preexec_fn=cap,  # noqa: PLW1509
        )
        timer = threading.Timer(timeout, proc.kill)
        timer.start()
        try:
            _, status, usage = os.wait4(proc.pid, 0)
        finally:
            timer.cancel()
        proc.returncode = os.waitstatus_to_exitcode(status)  # reaped here, not by Popen
        seconds = time.monotonic() - start
        fout.seek(0)
        ferr.seek(0)
        # no VmHWM when the child died without exiting (a crash): fall back to rusage
        peak = int(hwm.read_text()) if hwm.exists() else usage.ru_maxrss
        return Ran(proc.returncode, fout.read().decode("utf-8", "replace"),
                   ferr.read().decode("utf-8", "replace"), peak, seconds)
