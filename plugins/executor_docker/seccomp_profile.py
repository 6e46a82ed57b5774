"""The containers' seccomp profile: Docker's defaults leave io_uring open; the proc sandbox's list.

It replaces Docker's default profile (``--security-opt seccomp=…`` cannot extend it), so it is
written as the proc executor's deny list (``plugins.executor_proc.seccomp``: mount, ptrace, bpf,
keyctl, namespaces, io_uring…) over an allow-by-default base, plus what Docker's default denies
without a capability check and the proc list does not name. Every capability is dropped and
``no-new-privileges`` is set as well, which is what makes Docker's capability-gated entries moot.
Nothing the container writes may carry setuid/setgid bits (its uid 1000 can be a real host
account, and ``work/`` is a host directory) or be a device node: set-id modes are refused in the
chmod family, in file creation (``creat``, ``open``/``openat`` with ``O_CREAT`` or ``O_TMPFILE``,
``mknod``/``mknodat``), device nodes in ``mknod``/``mknodat``; ``openat2`` answers ``ENOSYS``
(its mode sits in a struct seccomp cannot read; libc falls back to ``openat``), as in the proc
sandbox's filter.

Under gVisor (``runsc --oci-seccomp``) the two ENOSYS rules are left out: runsc's loader of
this runsc version answers every errno rule with EPERM, and glibc falls back from ``clone3`` only
on ENOSYS, so no thread could start; gVisor implements neither call and answers ENOSYS itself
(checked by tests/integration/test_docker_gvisor.py).
"""

from __future__ import annotations

import errno
import functools
import json
import stat

from plugins.executor_proc.seccomp import DENIED_X86_64

# not in the proc list: Docker's default refuses these to an unprivileged container
EXTRA_DENIED = ("kcmp", "pidfd_getfd", "process_madvise", "fanotify_init", "vm86", "vm86old",
                "nfsservctl", "get_kernel_syms", "query_module", "create_module", "vhangup",
                "clock_adjtime", "adjtimex", "mbind", "move_pages", "set_mempolicy")
_NS_FLAGS = (0x00020000, 0x02000000, 0x04000000, 0x08000000, 0x10000000, 0x20000000,
             0x40000000, 0x00000080)  # CLONE_NEW{NS,CGROUP,UTS,IPC,USER,PID,NET,TIME}
_MODE_ARG = {"chmod": 1, "fchmod": 1, "fchmodat": 2, "fchmodat2": 2, "creat": 1, "mknod": 1,
             "mknodat": 2}
_CREATE_ARGS = {"open": (1, 2), "openat": (2, 3)}  # (flags index, mode index)
_O_CREATES = (0o100, 0o20000000)  # O_CREAT, __O_TMPFILE
_S_IFCHR_BIT = 0o020000  # set in S_IFCHR and S_IFBLK only
AF_UNIX, SOCK_DGRAM = 1, 2


def _masked(index: int, bit: int) -> dict[str, object]:
    return {"index": index, "value": bit, "valueTwo": bit, "op": "SCMP_CMP_MASKED_EQ"}


def _fallocate_rules() -> list[dict[str, object]]:
    """``fallocate`` modes other than 0 (bounded by ``--ulimit fsize``) and KEEP_SIZE|PUNCH_HOLE
    answer EOPNOTSUPP (second pass, N1: KEEP_SIZE allocated 3 GiB past the file cap); the
    proc filter's ``FALLOCATE_MODES_OK`` as libseccomp rules, which cannot say "not in": one
    rule per higher mode bit, and the two lone low bits."""
    nope = {"action": "SCMP_ACT_ERRNO", "errnoRet": errno.EOPNOTSUPP}
    low = [{"names": ["fallocate"], "args": [{"index": 1, "value": 0x3, "valueTwo": v,
                                              "op": "SCMP_CMP_MASKED_EQ"}], **nope}
           for v in (0x1, 0x2)]
    return low + [{"names": ["fallocate"], "args": [_masked(1, 1 << bit)], **nope}
                  for bit in range(2, 32)]


def _unix_rules(eperm: dict[str, object]) -> list[dict[str, object]]:
    """No AF_UNIX socket and no datagram socketpair (network off: a host listener's socket
    file in a bind, e.g. a ``system_binds`` tree, stays unreachable; second pass, N2)."""
    return [{"names": ["socket"], "args": [{"index": 0, "value": AF_UNIX,
                                             "op": "SCMP_CMP_EQ"}], **eperm},
            {"names": ["socketpair"], "args": [
                {"index": 0, "value": AF_UNIX, "op": "SCMP_CMP_EQ"},
                {"index": 1, "value": 0xF, "valueTwo": SOCK_DGRAM, "op": "SCMP_CMP_MASKED_EQ"}],
             **eperm}]


@functools.lru_cache(maxsize=4)
def profile_json(gvisor: bool = False, deny_unix: bool = False) -> str:
    """The profile as the JSON string Docker's API takes in ``SecurityOpt`` (``gvisor``: for
    a container on runsc, see the module docstring; ``deny_unix``: see ``_unix_rules``)."""
    eperm = {"action": "SCMP_ACT_ERRNO", "errnoRet": errno.EPERM}
    rules: list[dict[str, object]] = [
        {"names": sorted({*DENIED_X86_64, *EXTRA_DENIED}), **eperm},
    ]
    if not gvisor:
        rules += [
            # libc falls back to clone, whose flags the rules below can see
            {"names": ["clone3"], "action": "SCMP_ACT_ERRNO", "errnoRet": errno.ENOSYS},
            {"names": ["openat2"], "action": "SCMP_ACT_ERRNO", "errnoRet": errno.ENOSYS},
        ]
    rules += [{"names": ["clone"], "args": [_masked(0, f)], **eperm} for f in _NS_FLAGS]
    rules += [{"names": [name], "args": [_masked(arg, bit)], **eperm}
              for name, arg in _MODE_ARG.items() for bit in (stat.S_ISUID, stat.S_ISGID)]
    # the conditions of one rule must all hold: creating (either flag) with either set-id bit
    rules += [{"names": [name], "args": [_masked(flags, create), _masked(mode, bit)], **eperm}
              for name, (flags, mode) in _CREATE_ARGS.items() for create in _O_CREATES
              for bit in (stat.S_ISUID, stat.S_ISGID)]
    rules += [{"names": [name], "args": [_masked(arg, _S_IFCHR_BIT)], **eperm}
              for name, arg in (("mknod", 1), ("mknodat", 2))]
    rules += _fallocate_rules()
    # extended attributes take disk blocks no write quota sees (the proc filter's SETXATTR_NRS;
    # `setxattrat` is left out: a libseccomp that does not know the name refuses the profile)
    rules += [{"names": ["setxattr", "lsetxattr", "fsetxattr"], "action": "SCMP_ACT_ERRNO",
               "errnoRet": errno.EOPNOTSUPP}]
    rules += _unix_rules(eperm) if deny_unix else []
    profile = {"defaultAction": "SCMP_ACT_ALLOW",
               "architectures": ["SCMP_ARCH_X86_64", "SCMP_ARCH_X86", "SCMP_ARCH_X32"],
               "syscalls": rules}
    return json.dumps(profile, separators=(",", ":"))
