"""What one ``execve`` costs by C library: why the proc launcher is built with musl.

Usage::

    python benchmarks/bench_exec_start.py            # 2,000 starts per program
    python benchmarks/bench_exec_start.py --n 500    # quicker

Builds, in a temporary directory, programs that do nothing (no C library at all; glibc static;
glibc dynamic; musl static, when ``musl-gcc`` is installed), one that asks ``cpuid`` 30 times and
nothing else, and the proc launcher (``plugins/executor_proc/launcher/sb_launch.c``) with each
C library. A small C driver starts each one ``--n`` times (``vfork`` + ``execv`` + ``waitpid``)
and reports the wall time per start and the CPU the children used (``RUSAGE_CHILDREN``).
On a virtual machine ``cpuid`` traps to the hypervisor, and glibc's start (static or dynamic)
asks it dozens of times to pick its string functions and learn the caches. Prints a table;
writes nothing to docs/.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from plugins.executor_proc import native  # noqa: E402 - needs the checkout root on sys.path

PROGRAMS = {
    "nop.c": "int main(void) { return 0; }\n",
    "bare.c": 'void _start(void) { __asm__ volatile("mov $60, %eax; xor %edi, %edi; syscall"); }\n',
    "cpuid.c": (
        "void _start(void) {\n"
        "    for (int i = 0; i < 30; i++) {\n"
        "        unsigned a = 0, b, c = 0, d;\n"
        '        __asm__ volatile("cpuid" : "+a"(a), "=b"(b), "+c"(c), "=d"(d));\n'
        "    }\n"
        '    __asm__ volatile("mov $60, %eax; xor %edi, %edi; syscall");\n'
        "}\n"),
    "driver.c": r"""
#include <stdio.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
int main(int argc, char **argv) {
    int n = atoi(argv[1]);
    struct timespec a, b;
    clock_gettime(CLOCK_MONOTONIC, &a);
    for (int i = 0; i < n; i++) {
        pid_t p = vfork();
        if (p == 0) { execv(argv[2], argv + 2); _exit(127); }
        int st; waitpid(p, &st, 0);
    }
    clock_gettime(CLOCK_MONOTONIC, &b);
    struct rusage r; getrusage(RUSAGE_CHILDREN, &r);
    double wall = ((b.tv_sec - a.tv_sec) * 1e9 + (b.tv_nsec - a.tv_nsec)) / 1e3 / n;
    double cpu = (r.ru_utime.tv_sec + r.ru_stime.tv_sec) * 1e6 + r.ru_utime.tv_usec
                 + r.ru_stime.tv_usec;
    printf("%.1f %.1f\n", wall, cpu / n);
    return 0;
}
""",
}


def build(out: Path, have_musl: bool) -> list[tuple[str, list[str]]]:
    """Compile every program; the rows to time as (label, argv)."""
    for name, text in PROGRAMS.items():
        (out / name).write_text(text)
    cc = ["gcc", "-O2"]
    subprocess.run([*cc, "-o", str(out / "driver"), str(out / "driver.c")], check=True)
    subprocess.run([*cc, "-static", "-nostdlib", "-o", str(out / "bare"), str(out / "bare.c")],
                   check=True)
    subprocess.run([*cc, "-static", "-nostdlib", "-o", str(out / "cpuid"), str(out / "cpuid.c")],
                   check=True)
    subprocess.run([*cc, "-static", "-o", str(out / "nop-glibc-static"), str(out / "nop.c")],
                   check=True)
    subprocess.run([*cc, "-o", str(out / "nop-glibc-dynamic"), str(out / "nop.c")], check=True)
    # the launcher, each way: without arguments it prints its usage and exits 2 (to /dev/null)
    headers = out / "kernel-headers"
    headers.mkdir()
    native._link_kernel_headers(str(headers))
    # exactly the command lines the engine builds with (``native._attempts``): glibc static
    glibc_static = native._attempts(None, "gcc", str(headers))[0]
    subprocess.run([*glibc_static, "-o", str(out / "launcher-glibc"), str(native.SOURCE)],
                   check=True)
    rows = [("no C library (exit syscall only)", [str(out / "bare")]),
            ("no C library, 30 × cpuid", [str(out / "cpuid")]),
            ("glibc static, main returns 0", [str(out / "nop-glibc-static")]),
            ("glibc dynamic, main returns 0", [str(out / "nop-glibc-dynamic")]),
            ("sb_launch, glibc static", [str(out / "launcher-glibc")])]
    if have_musl:
        subprocess.run(["musl-gcc", "-O2", "-static", "-o", str(out / "nop-musl"),
                        str(out / "nop.c")], check=True)
        musl_static = native._attempts("musl-gcc", None, str(headers))[0]
        subprocess.run([*musl_static, "-o", str(out / "launcher-musl"), str(native.SOURCE)],
                       check=True)
        rows[3:3] = [("musl static, main returns 0", [str(out / "nop-musl")])]
        rows.append(("sb_launch, musl static", [str(out / "launcher-musl")]))
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=2000, help="starts per program")
    args = ap.parse_args()
    if shutil.which("gcc") is None:
        print("bench_exec_start: gcc is not installed (Debian package `gcc`)", file=sys.stderr)
        return 1
    have_musl = shutil.which("musl-gcc") is not None
    with tempfile.TemporaryDirectory(prefix="pe-exec-start-") as tmp:
        out = Path(tmp)
        rows = build(out, have_musl)
        load = os.getloadavg()[0]
        print(f"{args.n} starts each (vfork + execv + waitpid); load average {load:.2f}\n")
        print("| program | wall µs per start | CPU µs per start |")
        print("|---|---:|---:|")
        for label, argv in rows:
            done = subprocess.run([str(out / "driver"), str(args.n), *argv], check=True,
                                  stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
            wall, cpu = done.stdout.split()
            print(f"| {label} | {float(wall):.0f} | {float(cpu):.0f} |")
    if not have_musl:
        print("\n(musl-gcc is not installed: Debian package `musl-tools`)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
