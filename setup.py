"""Build hook for the optional native parts: the guard's openat2 probe (policy_engine/guard) and
the mask store's revalidation loop (policy_engine/sandbox).

Everything else about the package is in pyproject.toml. Both extensions are optional: without a
C compiler or Python's headers (Debian: ``gcc``, ``python3-dev``) the install still succeeds;
``policy_engine.guard.nofollow`` then asks the kernel through ctypes (same answers, ≈ 0.4 µs
more per fs decision; ``nofollow.NATIVE`` says which one runs) and
``policy_engine.sandbox.revalidate`` loops in Python (same answers, a slower first plan;
``revalidate.NATIVE``).
"""

import sys

from setuptools import Extension, setup

FLAGS = ["-O2", "-Wall", "-Wextra", "-Werror=implicit-function-declaration"]

NATIVE_PROBE = Extension(
    "policy_engine.guard._nofollow",
    sources=["policy_engine/guard/_nofollow.c"],
    extra_compile_args=FLAGS,
    optional=True,  # a failed build leaves the ctypes probe, not a failed install
)
NATIVE_REVALIDATE = Extension(
    "policy_engine.sandbox._revalidate",
    sources=["policy_engine/sandbox/_revalidate.c"],
    extra_compile_args=[*FLAGS, "-pthread"],
    extra_link_args=["-pthread"],
    optional=True,  # a failed build leaves the Python loop, not a failed install
)

setup(ext_modules=[NATIVE_PROBE, NATIVE_REVALIDATE] if sys.platform.startswith("linux") else [])
