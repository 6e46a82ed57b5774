"""Install throwaway plugin packages for a test module with pip, from copies, and remove them."""

from __future__ import annotations

import importlib.util
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
    """pip-install each source tree (distribution name -> directory), then uninstall them all.

    Builds from a copy under ``workdir``: an in-tree build would leave build/ and *.egg-info in
    the repository. No build isolation when the build backend is already here (nothing to
    download); setuptools without `wheel` cannot build one, so then pip fetches the build
    requirements itself.
    """
    has_backend = all(importlib.util.find_spec(m) for m in ("setuptools", "wheel"))
    isolation = ["--no-build-isolation"] if has_backend else []
    try:
        for dist, src in sources.items():
            copy = workdir / dist
            shutil.copytree(src, copy)
            pip("install", "--no-deps", *isolation, str(copy))
        yield
    finally:
        pip("uninstall", "-y", *sources)
