"""Build hook for the one optional native part: the guard's openat2 probe (policy_engine/guard).

Everything else about the package is in pyproject.toml. The extension is optional: without a C
compiler or Python's headers (Debian: ``gcc``, ``python3-dev``) the install still succeeds and
``policy_engine.guard.nofollow`` asks the kernel through ctypes instead (same answers, ≈ 0.4 µs
more per fs decision; ``nofollow.NATIVE`` says which one runs).
"""

import sys

from setuptools import Extension, setup

NATIVE_PROBE = Extension(
    "policy_engine.guard._nofollow",
    sources=["policy_engine/guard/_nofollow.c"],
    extra_compile_args=["-O2", "-Wall", "-Wextra", "-Werror=implicit-function-declaration"],
    optional=True,  # a failed build leaves the ctypes probe, not a failed install
)

setup(ext_modules=[NATIVE_PROBE] if sys.platform.startswith("linux") else [])
