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


def _masked(index: int, bit: int) -> dict[str, object]:
    return {"index": index, "value": bit, "valueTwo": bit, "op": "SCMP_CMP_MASKED_EQ"}


@functools.lru_cache(maxsize=2)
def profile_json(gvisor: bool = False) -> str:
    """The profile as the JSON string Docker's API takes in ``SecurityOpt`` (``gvisor``: for
    a container on runsc, see the module docstring)."""
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
    profile = {"defaultAction": "SCMP_ACT_ALLOW",
               "architectures": ["SCMP_ARCH_X86_64", "SCMP_ARCH_X86", "SCMP_ARCH_X32"],
               "syscalls": rules}
    return json.dumps(profile, separators=(",", ":"))
