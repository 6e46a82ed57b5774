"""The seccomp filter's number search (``seccomp._allow_unnamed``) changes no answer: the same
program run by a classic-BPF interpreter with and without the search answers alike for every
syscall number, both architectures, the x32 bit, and the argument values each rule tests.

The kernel runs the installed program the same way (tests/integration's sandboxes run it for
real: denied calls answer EPERM there); this test pins that the search is only a shortcut to
what the linear rules answered."""

from __future__ import annotations

import itertools
import random
import struct

import pytest

from plugins.executor_proc import seccomp

X86_64, I386, X32 = 0xC000003E, 0x40000003, 0x40000000
ALLOW = 0x7FFF0000


def _compiled(prog: bytes) -> list[tuple[int, int, int, int]]:
    return [struct.unpack_from("=HBBI", prog, off) for off in range(0, len(prog), 8)]


def run(prog: list[tuple[int, int, int, int]], nr: int, arch: int, args: tuple[int, ...]) -> int:
    """What the kernel's classic-BPF machine returns for ``struct seccomp_data``."""
    data = struct.pack("=IIQ6Q", nr & 0xFFFFFFFF, arch, 0, *args, *(0,) * (6 - len(args)))
    a, pc = 0, 0
    for _ in range(4096):
        code, jt, jf, k = prog[pc]
        pc += 1
        if code == 0x20:  # LD W ABS
            a = struct.unpack_from("=I", data, k)[0]
        elif code == 0x15:  # JEQ K
            pc += jt if a == k else jf
        elif code == 0x35:  # JGE K
            pc += jt if a >= k else jf
        elif code == 0x25:  # JGT K
            pc += jt if a > k else jf
        elif code == 0x45:  # JSET K
            pc += jt if a & k else jf
        elif code == 0x05:  # JA
            pc += k
        elif code == 0x54:  # ALU AND K
            a &= k
        elif code == 0x06:  # RET K
            return k
        else:
            raise AssertionError(f"opcode {code:#x} this test does not model")
    raise AssertionError("no return within BPF_MAXINSNS steps")


COMBOS = list(itertools.product((False, True), repeat=4))


@pytest.mark.parametrize(("inet", "setsid", "unix", "bind"), COMBOS)
def test_every_number_gets_the_linear_programs_answer(inet: bool, setsid: bool, unix: bool,
                                                      bind: bool) -> None:
    flags = {"deny_inet": inet, "deny_setsid": setsid, "deny_unix": unix, "deny_bind": bind}
    fast = seccomp.build_filter(**flags)
    linear = seccomp.build_filter(**flags, fast=False)
    assert len(fast) > len(linear)  # the search is there
    assert len(fast) // 8 < 4096
    new, old = _compiled(fast), _compiled(linear)
    named = seccomp.named_numbers(linear[6 * 8:])
    assert set(named) >= set(seccomp.DENIED_X86_64.values())
    rng = random.Random(f"{inet}{setsid}{unix}{bind}")
    numbers = [*range(0, 1100), *(n | X32 for n in range(0, 600, 7)), 0xFFFFFFFF, 0x7FFFFFFF]
    for nr in numbers:
        for arch in (X86_64, I386):
            args = tuple(rng.getrandbits(64) for _ in range(6))
            assert run(new, nr, arch, args) == run(old, nr, arch, args), (nr, arch, args)
    # each rule's argument tests: every constant of the program in each of the first four
    # arguments, the others zero, all ones or random
    consts = sorted({k for _, _, _, k in old} | {0, 1, 0xFFFFFFFF, 0x7FFFFFFF, 0o6000, 0o20000})
    for nr in named:
        for i, c in itertools.product(range(4), consts):
            for rest in (0, 0xFFFFFFFF, None):
                args = tuple(c if j == i else (rng.getrandbits(32) if rest is None else rest)
                             for j in range(6))
                got, want = run(new, nr, X86_64, args), run(old, nr, X86_64, args)
                assert got == want, (nr, i, hex(c), args)


def test_a_number_no_rule_names_is_allowed_within_a_dozen_steps() -> None:
    prog = seccomp.build_filter(deny_inet=True, deny_setsid=True, deny_unix=True,
                                deny_bind=True)
    compiled = _compiled(prog)
    named = set(seccomp.named_numbers(
        seccomp.build_filter(deny_inet=True, deny_setsid=True, deny_unix=True, deny_bind=True,
                             fast=False)[6 * 8:]))
    steps = []
    for nr in (n for n in range(0, 460) if n not in named):
        trimmed = compiled[:]  # count the instructions run before the answer
        count = 0
        pc, a = 0, nr
        while True:
            code, jt, jf, k = trimmed[pc]
            pc += 1
            count += 1
            if code == 0x20:
                a = X86_64 if k == 4 else nr
            elif code == 0x15:
                pc += jt if a == k else jf
            elif code == 0x35:
                pc += jt if a >= k else jf
            elif code == 0x05:
                pc += k
            elif code == 0x06:
                assert k == ALLOW, nr
                break
            else:
                raise AssertionError(f"an unnamed number reached opcode {code:#x}")
        steps.append(count)
    assert max(steps) <= 16  # the linear list took ≈ 110 for most of them


def test_a_range_test_of_the_number_is_refused() -> None:
    # JGE on the number (after the prologue) would make "the numbers the rules name" wrong
    rules = struct.pack("=HBBI", 0x35, 0, 1, 100) + struct.pack("=HBBI", 0x06, 0, 0, 1)
    with pytest.raises(ValueError, match="range"):
        seccomp.named_numbers(rules)


def test_a_named_number_goes_straight_to_its_rule() -> None:
    flags = {"deny_inet": True, "deny_setsid": False, "deny_unix": True, "deny_bind": True}
    fast = _compiled(seccomp.build_filter(**flags))
    linear = _compiled(seccomp.build_filter(**flags, fast=False))

    # count the instructions ``run`` reads (one per step)
    class Counting(list[tuple[int, int, int, int]]):
        seen = 0

        def __getitem__(self, i: int) -> tuple[int, int, int, int]:  # type: ignore[override]
            Counting.seen += 1
            return super().__getitem__(i)

    for nr in (257, 56, 0):  # openat, clone, read
        Counting.seen = 0
        assert run(Counting(fast), nr, X86_64, (3, 0, 0, 0o644)) == ALLOW
        fast_steps = Counting.seen
        Counting.seen = 0
        assert run(Counting(linear), nr, X86_64, (3, 0, 0, 0o644)) == ALLOW
        assert fast_steps * 2 < Counting.seen, (nr, fast_steps, Counting.seen)
