"""`explain` and `check` end without interpreter teardown when nothing but ``atexit`` handlers
is left to run: the handlers still run, and the output and exit code are the same either way."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# an atexit handler registered before main() (a wrapper's) must run either way; `os._exit`
# says when the shortcut is taken
PROBE = ("import atexit, os, sys\n"
         "atexit.register(lambda: sys.stderr.write('ATEXIT\\n'))\n"
         "_real_exit = os._exit\n"
         "def _exit(code):\n"
         "    os.write(2, b'SHORTCUT\\n')\n"
         "    _real_exit(code)\n"
         "os._exit = _exit\n"
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
    assert "SHORTCUT" in fast.stderr
    assert "SHORTCUT" not in slow.stderr
    assert "ATEXIT" in fast.stderr  # the wrapper's handler ran all the same
    assert fast.returncode == slow.returncode
    assert fast.stdout == slow.stdout
    assert fast.stdout.strip() or fast.stderr.strip()  # it said something either way
    assert fast.stderr.replace("SHORTCUT\n", "") == slow.stderr


def test_a_handler_registered_during_the_command_runs_once() -> None:
    # a plugin or logging registering cleanup after main() started
    extra = ("import policy_engine.cli.explain as e, atexit\n"
             "_orig = e.compile_files\n"
             "def _wrapped(*a, **k):\n"
             "    atexit.register(lambda: sys.stderr.write('LATE\\n'))\n"
             "    return _orig(*a, **k)\n"
             "e.compile_files = _wrapped\n")
    done = _run(EXPLAIN, extra=extra)
    assert done.returncode == 0
    assert done.stderr.count("LATE") == 1
    assert done.stderr.count("ATEXIT") == 1
    assert "SHORTCUT" in done.stderr


def test_a_live_thread_keeps_the_normal_exit() -> None:
    extra = ("import threading, time\n"
             "threading.Thread(target=time.sleep, args=(30,), daemon=True).start()\n")
    done = _run(EXPLAIN, extra=extra)
    assert done.returncode == 0
    assert "SHORTCUT" not in done.stderr


def test_commands_holding_resources_never_take_it() -> None:
    done = _run(["schema", "grant"])
    assert done.returncode == 0
    assert "SHORTCUT" not in done.stderr


def test_a_profiler_still_gets_its_report() -> None:
    # cProfile prints after the program returns, not from an atexit handler
    done = subprocess.run([sys.executable, "-m", "cProfile", "-m", "policy_engine.cli", *EXPLAIN],
                          capture_output=True, text=True, cwd=ROOT, check=False,
                          env={**os.environ, "POLICY_ENGINE_FAST_EXIT": "1"})
    assert done.returncode == 0
    assert "allowed by git-readonly" in done.stdout
    assert "function calls" in done.stdout  # the profile's report
