"""This checkout's wheel, built once per test run and shared by the files that install it.

``test_plain_install.py`` and ``test_ci_wheel_install.py`` each built the same wheel from a copy
of the checkout (a copy: an in-tree build leaves build/ and *.egg-info in the repository). The
wheel is only read (each file installs it into a virtualenv of its own), so one build serves
both: the first file to ask builds it under the run's temporary root, which every xdist worker
of the run shares, while a lock holds the others; a later run builds afresh (another root).
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
IGNORED = (".git", "__pycache__", "*.egg-info", "build", "dist", "var", ".venv", "node_modules")


def _run_root(factory: pytest.TempPathFactory) -> Path:
    """The temporary root of this whole run: a worker's base is ``<root>/popen-gwN``."""
    base = factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


def project_wheel(factory: pytest.TempPathFactory) -> Path:
    """The path of this checkout's wheel (``pip wheel --no-deps``), built on first use."""
    where = _run_root(factory) / "project-wheel"
    where.mkdir(exist_ok=True)
    with open(where / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        built = sorted((where / "dist").glob("policy_engine-*.whl"))
        if built:
            return built[0]
        src = where / "src"
        shutil.rmtree(src, ignore_errors=True)  # a build that failed half-way
        shutil.copytree(ROOT, src, ignore=shutil.ignore_patterns(*IGNORED))
        subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                        "-q", "-w", str(where / "dist"), str(src)], check=True, timeout=600)
        shutil.rmtree(src, ignore_errors=True)
        return next((where / "dist").glob("policy_engine-*.whl"))
