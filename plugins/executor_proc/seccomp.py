"""A seccomp-BPF deny filter built with ctypes (x86_64): no mount, ptrace, bpf, namespaces…

Standard library only: this module also runs inside the sandbox, loaded by ``launcher.py``.
"""

from __future__ import annotations

import ctypes
import errno
import platform
import struct

_PR_SET_NO_NEW_PRIVS = 38
_PR_SET_SECCOMP = 22
_SECCOMP_MODE_FILTER = 2
_AUDIT_ARCH_X86_64 = 0xC000003E
_X32_BIT = 0x40000000

# BPF opcodes (linux/filter.h)
_LD_W_ABS = 0x20
_JEQ_K = 0x15
_JSET_K = 0x45
_JGE_K = 0x35
_RET_K = 0x06
_RET_ALLOW = 0x7FFF0000
_RET_ERRNO = 0x00050000
_RET_KILL_PROCESS = 0x80000000
_ALU_AND_K = 0x54
_OFF_NR, _OFF_ARCH, _OFF_ARG0 = 0, 4, 16  # struct seccomp_data, little-endian low word of args[0]

# syscalls no agent tool needs and every container escape wants (x86_64 numbers)
DENIED_X86_64: dict[str, int] = {
    "ptrace": 101, "syslog": 103, "uselib": 134, "acct": 163, "settimeofday": 164, "mount": 165,
    "umount2": 166, "swapon": 167, "swapoff": 168, "reboot": 169, "iopl": 172, "ioperm": 173,
    "init_module": 175, "delete_module": 176, "quotactl": 179, "pivot_root": 155, "chroot": 161,
    "lookup_dcookie": 212, "clock_settime": 227, "kexec_load": 246, "add_key": 248,
    "request_key": 249, "keyctl": 250, "unshare": 272, "perf_event_open": 298,
    "name_to_handle_at": 303, "open_by_handle_at": 304, "setns": 308,
    "process_vm_readv": 310, "process_vm_writev": 311, "finit_module": 313,
    "kexec_file_load": 320, "bpf": 321, "userfaultfd": 323, "io_uring_setup": 425,
    "io_uring_enter": 426, "io_uring_register": 427, "open_tree": 428, "move_mount": 429,
    "fsopen": 430, "fsconfig": 431, "fsmount": 432, "fspick": 433, "mount_setattr": 442,
    "open_tree_attr": 467,  # Linux 6.15: open_tree with mount attributes (outsider round 40)
}
_NR_CLONE, _NR_CLONE3, _NR_SOCKET, _NR_PERSONALITY, _NR_SETSID = 56, 435, 41, 135, 112
_CLONE_NS_FLAGS = (0x00020000 | 0x02000000 | 0x04000000 | 0x08000000 | 0x10000000 | 0x20000000
                   | 0x40000000 | 0x00000080)  # NEWNS UTS IPC USER PID NET CGROUP TIME
_PERSONALITY_OK = (0x0, 0x8, 0x20000, 0x20008, 0xFFFFFFFF)  # Docker's list; no ADDR_NO_RANDOMIZE
_AF_UNIX = 1
_NR_SOCKETPAIR, _SOCK_TYPE_MASK, _SOCK_DGRAM = 53, 0xF, 2
_NR_BIND = 49
_NR_OPENAT2 = 437
# fallocate(fd, mode, ...): RLIMIT_FSIZE bounds a file's size, not its allocation, and
# FALLOC_FL_KEEP_SIZE allocates any amount without growing the size (second pass, N1: 3 GiB
# in one call). Mode 0 (counted by RLIMIT_FSIZE: EFBIG past the cap) and punching a hole
# (KEEP_SIZE|PUNCH_HOLE, frees space) pass; any other mode answers EOPNOTSUPP, the answer of a
# file system without the mode, on which glibc's posix_fallocate and tools fall back to writes
_NR_FALLOCATE = 285
FALLOCATE_MODES_OK = (0x0, 0x3)
# setxattr, lsetxattr, fsetxattr, setxattrat: an ext4 `user.*` value of a few KiB takes a disk
# block of its own per file, written back as metadata that no task's `write_bytes` counts, so a
# call landed 240 MiB under an 8 MiB write quota (outsider attack 36). EOPNOTSUPP is what a
# file system without attributes answers; cp, tar and rsync go on without them. Reading and
# removing attributes stay.
SETXATTR_NRS = (188, 189, 190, 463)
_S_ISUID_GID = 0o6000
_S_IFCHR_BIT = 0o020000  # set in S_IFCHR and S_IFBLK only
_O_CREAT_TMPFILE = 0o100 | 0o20000000
# (syscall, [(argument index, bits that must all be tested set)]) -> EPERM: nothing a sandbox
# writes may carry setuid/setgid bits (the host could run it) or be a device node
_MODE_RULES: tuple[tuple[int, tuple[tuple[int, int], ...]], ...] = (
    (90, ((1, _S_ISUID_GID),)),                          # chmod(path, mode)
    (91, ((1, _S_ISUID_GID),)),                          # fchmod(fd, mode)
    (268, ((2, _S_ISUID_GID),)),                         # fchmodat(dfd, path, mode)
    (452, ((2, _S_ISUID_GID),)),                         # fchmodat2(dfd, path, mode, flags)
    (85, ((1, _S_ISUID_GID),)),                          # creat(path, mode)
    (2, ((1, _O_CREAT_TMPFILE), (2, _S_ISUID_GID))),     # open(path, flags, mode)
    (257, ((2, _O_CREAT_TMPFILE), (3, _S_ISUID_GID))),   # openat(dfd, path, flags, mode)
    (133, ((1, _S_IFCHR_BIT),)), (133, ((1, _S_ISUID_GID),)),    # mknod(path, mode, dev)
    (259, ((2, _S_IFCHR_BIT),)), (259, ((2, _S_ISUID_GID),)),    # mknodat(dfd, path, mode, dev)
)


def supported() -> bool:
    return platform.machine() == "x86_64"


def _ins(code: int, k: int, jt: int = 0, jf: int = 0) -> bytes:
    return struct.pack("=HBBI", code, jt, jf, k)


def _ret(value: int) -> bytes:
    return _ins(_RET_K, value)


def _arg_rule(nr: int, conds: tuple[tuple[int, int], ...], eperm: bytes) -> list[bytes]:
    """EPERM when syscall ``nr`` has every ``(arg, bits)`` with some of ``bits`` set."""
    k = len(conds)
    out = [_ins(_JEQ_K, nr, 0, 2 * k + 2)]
    for i, (arg, bits) in enumerate(conds):
        out += [_ins(_LD_W_ABS, _OFF_ARG0 + 8 * arg),
                _ins(_JSET_K, bits, 0, 2 * (k - 1 - i) + 1)]
    return [*out, eperm, _ins(_LD_W_ABS, _OFF_NR)]


def build_filter(*, deny_inet: bool, deny_setsid: bool, deny_unix: bool = False,
                 deny_bind: bool = False, fast: bool = True) -> bytes:
    """The BPF program: EPERM for denied calls, ENOSYS for clone3 and openat2 (so libc falls
    back to clone and openat, whose arguments we can inspect), namespace flags on clone refused,
    setuid/setgid modes and device nodes refused, preallocating ``fallocate`` modes and
    setting extended attributes refused (EOPNOTSUPP), optional socket filters.

    ``deny_unix``: no ``AF_UNIX`` socket and no datagram socketpair (a datagram socket can be
    pointed at any path). Landlock (ABI 7) scopes abstract sockets but does not govern
    ``connect`` to a socket file, and a bind mount, read-only or not, leaves a host listener's
    socket file connectable, so this is what keeps a sandbox with network off away from every
    host process listening on a path it can see (second pass, N2). A stream ``socketpair``
    stays: its two ends are connected to each other and to nothing else.

    ``deny_bind`` (network off): no ``bind`` at all. Binding an end of the stream socketpair
    to an abstract name takes that name in the network namespace, which for proc-landlock and
    the local runner is the host's: a host service binding the same name got EADDRINUSE while
    the call ran (attack32 L6). Landlock's abstract-socket scope (ABI 6) refuses only
    ``connect``/``sendto`` across the domain, not ``bind``, and seccomp cannot read the
    address, so the whole call goes; with network off nothing needs it (the socketpair needs
    no name), and under the local runner, which keeps the host's network, it is also what stops
    a network-off call from listening on a host port.
    """
    eperm = _ret(_RET_ERRNO | errno.EPERM)
    prog = [_ins(_LD_W_ABS, _OFF_ARCH), _ins(_JEQ_K, _AUDIT_ARCH_X86_64, 1, 0),
            _ret(_RET_KILL_PROCESS), _ins(_LD_W_ABS, _OFF_NR),
            _ins(_JGE_K, _X32_BIT, 0, 1), eperm]  # x32 ABI numbers would dodge the table
    assert len(prog) == _PROLOGUE
    denied = sorted(DENIED_X86_64.values()) + ([_NR_SETSID] if deny_setsid else [])
    for nr in denied:
        prog += [_ins(_JEQ_K, nr, 0, 1), eperm]
    prog += [_ins(_JEQ_K, _NR_CLONE3, 0, 1), _ret(_RET_ERRNO | errno.ENOSYS)]
    prog += [_ins(_JEQ_K, _NR_OPENAT2, 0, 1), _ret(_RET_ERRNO | errno.ENOSYS)]
    for nr, conds in _MODE_RULES:
        prog += _arg_rule(nr, conds, eperm)
    # INVARIANT: every argument check ends by reloading nr, so later checks still see it
    prog += [_ins(_JEQ_K, _NR_CLONE, 0, 4), _ins(_LD_W_ABS, _OFF_ARG0),
             _ins(_JSET_K, _CLONE_NS_FLAGS, 0, 1), eperm, _ins(_LD_W_ABS, _OFF_NR)]
    prog += [_ins(_JEQ_K, _NR_FALLOCATE, 0, 5), _ins(_LD_W_ABS, _OFF_ARG0 + 8),
             _ins(_JEQ_K, FALLOCATE_MODES_OK[0], 2, 0), _ins(_JEQ_K, FALLOCATE_MODES_OK[1], 1, 0),
             _ret(_RET_ERRNO | errno.EOPNOTSUPP), _ins(_LD_W_ABS, _OFF_NR)]
    for nr in SETXATTR_NRS:
        prog += [_ins(_JEQ_K, nr, 0, 1), _ret(_RET_ERRNO | errno.EOPNOTSUPP)]
    n = len(_PERSONALITY_OK)
    prog += [_ins(_JEQ_K, _NR_PERSONALITY, 0, n + 3), _ins(_LD_W_ABS, _OFF_ARG0)]
    prog += [_ins(_JEQ_K, v, n - i, 0) for i, v in enumerate(_PERSONALITY_OK)]
    prog += [eperm, _ins(_LD_W_ABS, _OFF_NR)]
    if deny_inet:
        prog += [_ins(_JEQ_K, _NR_SOCKET, 0, 4), _ins(_LD_W_ABS, _OFF_ARG0),
                 _ins(_JEQ_K, _AF_UNIX, 1, 0), _ret(_RET_ERRNO | errno.EAFNOSUPPORT),
                 _ins(_LD_W_ABS, _OFF_NR)]
    if deny_unix:
        prog += _unix_rules(eperm)
    if deny_bind:
        prog += [_ins(_JEQ_K, _NR_BIND, 0, 1), eperm]
    prog.append(_ret(_RET_ALLOW))
    head, rules = b"".join(prog[:_PROLOGUE]), b"".join(prog[_PROLOGUE:])
    return head + _allow_unnamed(rules) + rules if fast else head + rules


_PROLOGUE = 6  # the architecture and x32 checks: ``build_filter``'s first instructions
_JA = 0x05
_JGE_NR_LEAF = 4  # at most this many numbers compared one by one at a leaf of the search


def named_numbers(rules: bytes) -> list[int]:
    """The syscall numbers ``rules`` compares the number with (``JEQ`` while the accumulator
    holds it: after the prologue, and after each ``LD`` of the number). Every rule tests the
    number with ``JEQ`` only; a range test would make this set wrong, so it is refused."""
    return sorted(_first_named(rules))


def _first_named(rules: bytes) -> dict[int, int]:
    """Each number ``rules`` names → the index of its first ``JEQ`` (``named_numbers``)."""
    first: dict[int, int] = {}
    holds_nr = True
    for i in range(len(rules) // 8):
        code, _, _, k = struct.unpack_from("=HBBI", rules, 8 * i)
        if code == _LD_W_ABS:
            holds_nr = k == _OFF_NR
        elif holds_nr and code == _JEQ_K:
            first.setdefault(k, i)
        elif holds_nr and code in (_JGE_K, _JSET_K, 0x25):  # JGT
            raise ValueError("a rule tests the syscall number with a range")
    return first


def _allow_unnamed(rules: bytes) -> bytes:
    """A binary search over the numbers ``rules`` names, put before them: any other number is
    allowed after ≈ 8 comparisons instead of the ≈ 110 of the whole list, and a named one
    goes straight to its first rule. Every rule before that one begins with a comparison of
    the number with another, which only skips it (the accumulator still holds the number), so
    each number gets the answer the whole list gave (``tests/unit/test_seccomp_search.py``
    runs both on every number and each rule's argument values).

    Why: the kernel runs a new filter over every syscall number when it is installed (its
    action cache: the numbers a filter allows whatever the arguments skip it afterwards), a
    call's launcher installs one per call, and the calls it cannot cache (``openat``,
    ``clone``…) ran the list up to their rule on every use (issue 27 item 4)."""
    first = _first_named(rules)

    def search(vals: list[int]) -> list[bytes | int | None]:
        """Instructions, or a jump to fill in: a number (to its first rule), None (allow)."""
        if len(vals) <= _JGE_NR_LEAF:
            out: list[bytes | int | None] = []
            for v in vals:
                out += [_ins(_JEQ_K, v, 0, 1), v]
            return [*out, None]
        mid = len(vals) // 2
        left, right = search(vals[:mid]), search(vals[mid:])
        if len(left) > 255:
            raise ValueError("the syscall number search outgrew a conditional jump")
        return [_ins(_JGE_K, vals[mid], len(left), 0), *left, *right]

    tree = search(sorted(first))
    allow_at, rules_at = len(tree), len(tree) + 1
    # a jump's 32-bit forward offset is counted from the next instruction
    return b"".join(x if isinstance(x, bytes) else _ins(_JA, (
        allow_at if x is None else rules_at + first[x]) - i - 1) for i, x in enumerate(tree)) \
        + _ret(_RET_ALLOW)


def unix_filter() -> bytes:
    """A filter with the ``deny_unix`` rules only (and the architecture check), for a process
    already under a broader filter: the docker pool's commands with network off."""
    eperm = _ret(_RET_ERRNO | errno.EPERM)
    prog = [_ins(_LD_W_ABS, _OFF_ARCH), _ins(_JEQ_K, _AUDIT_ARCH_X86_64, 1, 0),
            _ret(_RET_KILL_PROCESS), _ins(_LD_W_ABS, _OFF_NR),
            _ins(_JGE_K, _X32_BIT, 0, 1), eperm]
    prog += _unix_rules(eperm)
    prog.append(_ret(_RET_ALLOW))
    return b"".join(prog)


def _unix_rules(eperm: bytes) -> list[bytes]:
    return [_ins(_JEQ_K, _NR_SOCKET, 0, 3), _ins(_LD_W_ABS, _OFF_ARG0),
            _ins(_JEQ_K, _AF_UNIX, 0, 1), eperm, _ins(_LD_W_ABS, _OFF_NR),
            _ins(_JEQ_K, _NR_SOCKETPAIR, 0, 4), _ins(_LD_W_ABS, _OFF_ARG0 + 8),
            _ins(_ALU_AND_K, _SOCK_TYPE_MASK), _ins(_JEQ_K, _SOCK_DGRAM, 0, 1), eperm,
            _ins(_LD_W_ABS, _OFF_NR)]


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


def install(*, deny_inet: bool, deny_setsid: bool = False, deny_unix: bool = False,
            deny_bind: bool = False) -> int:
    """Install the filter on this thread (inherited across fork and exec); returns its length.

    :raises OSError: when seccomp is unsupported here or prctl fails.
    """
    if not supported():
        raise OSError(errno.ENOSYS, f"seccomp filter has no table for {platform.machine()}")
    code = build_filter(deny_inet=deny_inet, deny_setsid=deny_setsid, deny_unix=deny_unix,
                        deny_bind=deny_bind)
    buf = ctypes.create_string_buffer(code, len(code))
    prog = _SockFprog(len(code) // 8, ctypes.cast(buf, ctypes.c_void_p).value)
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "PR_SET_NO_NEW_PRIVS failed")
    if libc.prctl(_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER, ctypes.byref(prog), 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "PR_SET_SECCOMP failed")
    return len(code) // 8
