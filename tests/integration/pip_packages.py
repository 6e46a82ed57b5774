"""Install throwaway plugin packages for a test module with pip, from copies, privately."""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path


def pip(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "pip", "--disable-pip-version-check", "-q", *args],
                   check=True, timeout=300)


@contextmanager
def installed_packages(sources: Mapping[str, Path], workdir: Path) -> Iterator[None]:
    """pip-install each source tree (distribution name -> directory) into a directory of this
    test's own, on ``PYTHONPATH`` for the child processes it starts meanwhile.

    Never into the interpreter's site-packages: every other process of that interpreter (the
    other test workers, other suites on the machine) would load these plugins — the broken ones
    too — while they are installed. Entry points are found there as in site-packages.
    Builds from a copy under ``workdir``: an in-tree build would leave build/ and *.egg-info in
    the repository. No build isolation when the build backend is already here (nothing to
    download); setuptools without `wheel` cannot build one, so then pip fetches the build
    requirements itself.
    """
    has_backend = all(importlib.util.find_spec(m) for m in ("setuptools", "wheel"))
    isolation = ["--no-build-isolation"] if has_backend else []
    site = workdir / "site-packages"
    copies = [workdir / dist for dist in sources]
    for src, copy in zip(sources.values(), copies, strict=True):
        shutil.copytree(src, copy)
    # one pip for them all: each pip start costs a second or two of CPU
    pip("install", "--no-deps", *isolation, "--target", str(site), *map(str, copies))
    before = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join([str(site), *([before] if before else [])])
    try:
        yield
    finally:
        if before is None:
            del os.environ["PYTHONPATH"]
        else:
            os.environ["PYTHONPATH"] = before
