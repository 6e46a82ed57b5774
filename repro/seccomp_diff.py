"""Independent check of the seccomp number search (attack 40): a classic-BPF machine written
from the kernel's sk_run_filter / bpf_check_classic / seccomp_check_filter / seccomp_is_const_allow
(not the project's test interpreter), run over both programs for every flag combination.

Checks: (1) the kernel would accept the program (jumps in range, ends on RET, <= 4096, only
seccomp-allowed opcodes, LD offsets aligned inside seccomp_data); (2) fast == linear for every
nr in 0..2047, x32 numbers, huge numbers, both arches, with argument words drawn from every
single bit, every constant and random values; (3) the kernel action cache (const-allow
emulation) never marks a number always-allowed that the linear program refuses for some args.
Run: python3 repro/seccomp_diff.py  (exit 1 on any difference)."""
from __future__ import annotations

import itertools
import random
import struct
import sys

sys.path.insert(0, ".")
from plugins.executor_proc import seccomp  # noqa: E402

X86_64, I386 = 0xC000003E, 0x40000003
OK_CODES = {0x20, 0x15, 0x35, 0x25, 0x45, 0x05, 0x54, 0x06, 0x00, 0x01, 0x61, 0x02, 0x04,
            0x14, 0x24, 0x34, 0x44, 0x64, 0x74, 0x84, 0x87, 0xa4, 0x0c, 0x1c, 0x2c, 0x3c,
            0x4c, 0x5c, 0x6c, 0x7c, 0xac, 0x16, 0x07, 0x80, 0x1d, 0x3d, 0x2d, 0x4d, 0x03,
            0x05}


def decode(p: bytes) -> list[tuple[int, int, int, int]]:
    return [struct.unpack_from("=HBBI", p, o) for o in range(0, len(p), 8)]


def kernel_accepts(prog: list[tuple[int, int, int, int]]) -> str | None:
    n = len(prog)
    if n == 0 or n > 4096:
        return "length"
    for pc, (code, jt, jf, k) in enumerate(prog):
        if code not in OK_CODES:
            return f"opcode {code:#x} at {pc}"
        if code == 0x20 and (k >= 64 or k & 3):
            return f"LD offset {k} at {pc}"
        if code == 0x05 and k >= n - pc - 1:
            return f"JA out of range at {pc}"
        if code in (0x15, 0x35, 0x25, 0x45) and (pc + jt + 1 >= n or pc + jf + 1 >= n):
            return f"cond jump out of range at {pc}"
    if prog[-1][0] not in (0x06, 0x16):
        return "last insn not RET"
    return None


def run(prog, nr: int, arch: int, args) -> int:
    data = struct.pack("<iI Q 6Q", nr if nr < 2**31 else nr - 2**32, arch, 0x401000, *args)
    a = pc = 0
    while True:
        code, jt, jf, k = prog[pc]
        pc += 1
        if code == 0x20:
            a = struct.unpack_from("<I", data, k)[0]
        elif code == 0x05:
            pc += k
        elif code in (0x15, 0x35, 0x25, 0x45):
            r = {0x15: a == k, 0x35: a >= k, 0x25: a > k, 0x45: bool(a & k)}[code]
            pc += jt if r else jf
        elif code == 0x54:
            a &= k
        elif code == 0x06:
            return k
        else:
            raise SystemExit(f"unmodelled {code:#x}")


def const_allow(prog, nr: int, arch: int) -> bool:
    """seccomp_is_const_allow (kernel/seccomp.c)."""
    a = pc = 0
    while pc < len(prog):
        code, jt, jf, k = prog[pc]
        if code == 0x20:
            if k == 0:
                a = nr
            elif k == 4:
                a = arch
            else:
                return False
        elif code == 0x06:
            return k == 0x7FFF0000
        elif code == 0x05:
            pc += k
        elif code in (0x15, 0x35, 0x25, 0x45):
            r = {0x15: a == k, 0x35: a >= k, 0x25: a > k, 0x45: bool(a & k)}[code]
            pc += jt if r else jf
        elif code == 0x54:
            a &= k
        else:
            return False
        pc += 1
    return False


def main() -> int:
    bad = 0
    rng = random.Random(40)
    for inet, setsid, unix, bind in itertools.product((False, True), repeat=4):
        kw = dict(deny_inet=inet, deny_setsid=setsid, deny_unix=unix, deny_bind=bind)
        fast, lin = decode(seccomp.build_filter(**kw)), decode(seccomp.build_filter(**kw, fast=False))
        for name, p in (("fast", fast), ("linear", lin)):
            why = kernel_accepts(p)
            if why:
                print("KERNEL WOULD REJECT", name, kw, why)
                bad += 1
        consts = sorted({k for _, _, _, k in lin})
        words = sorted({0, 0xFFFFFFFF, *consts, *(1 << b for b in range(32)),
                        *(c | 1 << b for c in consts[:40] for b in range(0, 32, 3))})
        nrs = [*range(0, 2048), *(n | 0x40000000 for n in range(0, 1024)),
               0x3FFFFFFF, 0x7FFFFFFF, 0x80000000, 0xFFFFFFFF, 0xFFFFFFFE]
        named = set(seccomp.named_numbers(seccomp.build_filter(**kw, fast=False)[48:]))
        for nr in nrs:
            for arch in (X86_64, I386, 0):
                argsets = [(0,) * 6, (0xFFFFFFFFFFFFFFFF,) * 6]
                if nr in named and arch == X86_64:
                    for i in range(4):
                        for w in words:
                            for hi in (0, 0xFFFFFFFF00000000):
                                argsets.append(tuple((w | hi) if j == i else rng.getrandbits(64)
                                                     for j in range(6)))
                for args in argsets:
                    f, s = run(fast, nr, arch, args), run(lin, nr, arch, args)
                    if f != s:
                        bad += 1
                        print("DIFF", kw, hex(nr), hex(arch), [hex(x) for x in args], hex(f), hex(s))
                if arch != 0 and const_allow(fast, nr, arch):
                    if any(run(lin, nr, arch, a) != 0x7FFF0000 for a in argsets):
                        bad += 1
                        print("CACHE WOULD ALLOW A REFUSED CALL", kw, hex(nr))
    print("differences:", bad)
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
