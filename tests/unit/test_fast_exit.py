"""`explain` and `check` end without interpreter teardown only when nothing is left to clean up,
and their output and exit code are the same either way."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# an atexit handler registered before main() (in the baseline) prints a marker at normal exit
PROBE = ("import atexit, sys\n"
         "atexit.register(lambda: sys.stderr.write('TEARDOWN\\n'))\n"
         "{extra}"
         "sys.argv = ['policy-engine', *{argv!r}]\n"
         "from policy_engine.cli.main import main\nmain()")
EXPLAIN = ["explain", "--policy", "examples/policies/org.sbpolicy",
           "--request", "examples/requests/git-status.json"]


def _run(argv: list[str], *, fast: bool = True,
         extra: str = "") -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "POLICY_ENGINE_FAST_EXIT": "1" if fast else "0"}
    return subprocess.run([sys.executable, "-c", PROBE.format(extra=extra, argv=argv)],
                          capture_output=True, text=True, cwd=ROOT, env=env, check=False)


@pytest.mark.parametrize("argv", [EXPLAIN, [*EXPLAIN, "--format", "json"],
                                  ["check", "examples/policies/org.sbpolicy"],
                                  ["explain", "--policy", "nope.sbpolicy",
                                   "--request", "examples/requests/git-status.json"]])
def test_same_output_and_code_with_and_without_teardown(argv: list[str]) -> None:
    fast, slow = _run(argv), _run(argv, fast=False)
    assert "TEARDOWN" not in fast.stderr  # the shortcut was taken
    assert "TEARDOWN" in slow.stderr
    assert fast.returncode == slow.returncode
    assert fast.stdout == slow.stdout
    assert fast.stdout.strip() or fast.stderr.strip()  # it said something either way
    assert fast.stderr == slow.stderr.replace("TEARDOWN\n", "")


def test_a_handler_registered_during_the_command_still_runs() -> None:
    # a plugin or logging registering cleanup after main() started: the normal exit runs it
    extra = ("import policy_engine.compiler.pipeline as p, atexit, sys\n"
             "_orig = p.compile_files\n"
             "def _wrapped(*a, **k):\n"
             "    atexit.register(lambda: sys.stderr.write('LATE\\n'))\n"
             "    return _orig(*a, **k)\n"
             "p.compile_files = _wrapped\n"
             "import policy_engine.cli.explain as e\n"
             "e.compile_files = _wrapped\n")
    done = _run(EXPLAIN, extra=extra)
    assert done.returncode == 0
    assert "LATE" in done.stderr
    assert "TEARDOWN" in done.stderr


def test_a_live_thread_keeps_the_normal_exit() -> None:
    extra = ("import threading, time\n"
             "threading.Thread(target=time.sleep, args=(0.3,), daemon=True).start()\n")
    done = _run(EXPLAIN, extra=extra)
    assert done.returncode == 0
    assert "TEARDOWN" in done.stderr


def test_commands_holding_resources_never_take_it() -> None:
    done = _run(["schema", "grant"])
    assert "TEARDOWN" in done.stderr
