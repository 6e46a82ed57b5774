"""In-sandbox launcher: drop capabilities, apply Landlock and seccomp, then exec the tool.

Run as ``python3 -I -S -B launcher.py SPEC_JSON STATUS_FD -- argv...`` (inside bwrap, or directly
for the Landlock-only backend). Two may be chained (restricted network: one before the bridge,
one before the tool); the first keeps the status pipe open (``keep_status``) for the second.
``report_end``: the launcher forks the tool and reports how it ended on the status pipe.
Standard library only; its siblings are loaded by path because ``-I`` keeps the plugin package
off ``sys.path``. Exit 126: the isolation could not be applied; 127: the tool was not found.
"""

from __future__ import annotations

import contextlib
import ctypes
import importlib
import json
import os
import sys
from typing import Any

_PR_CAPBSET_DROP = 24
_PR_CAP_AMBIENT = 47
_PR_CAP_AMBIENT_CLEAR_ALL = 4
_CAP_LAST = 63  # beyond the kernel's last cap, PR_CAPBSET_DROP fails harmlessly with EINVAL


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32),
                ("inheritable", ctypes.c_uint32)]


def drop_capabilities() -> None:
    """Empty the bounding, ambient and current sets: root regains nothing across exec."""
    libc = ctypes.CDLL(None, use_errno=True)
    for cap in range(_CAP_LAST + 1):
        libc.prctl(_PR_CAPBSET_DROP, cap, 0, 0, 0)
    libc.prctl(_PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)
    header = _CapHeader(0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3
    data = (_CapData * 2)()
    if libc.capset(ctypes.byref(header), data) != 0:
        raise OSError(ctypes.get_errno(), "capset failed")


def _load_siblings() -> tuple[Any, Any]:
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path.insert(0, here)
    try:
        return importlib.import_module("landlock"), importlib.import_module("seccomp")
    finally:
        sys.path.remove(here)


def apply(spec: dict[str, Any]) -> dict[str, Any]:
    """Apply what ``spec`` asks for; return a status for the evidence (never raises in compat)."""
    landlock, seccomp = _load_siblings()
    status: dict[str, Any] = {"landlock": "off", "seccomp": "off", "caps": "kept"}
    if spec.get("drop_caps"):
        drop_capabilities()
        status["caps"] = "dropped"
    ll = spec.get("landlock")
    if ll is not None:
        try:
            abi = landlock.restrict([tuple(r) for r in ll["rules"]], deny_tcp=ll["deny_tcp"],
                                    scope=ll["scope"], connect_ports=ll.get("connect", ()),
                                    bind_ports=ll.get("bind", ()), fs=ll.get("fs", True))
            status["landlock"] = f"enforced (abi {abi})"
        except OSError as err:
            status["landlock"] = f"unavailable: {err}"
            if ll.get("required"):
                raise
    sc = spec.get("seccomp")
    if sc is not None:
        try:
            n = seccomp.install(deny_inet=sc["deny_inet"], deny_setsid=sc["deny_setsid"],
                                deny_unix=sc.get("deny_unix", False),
                                deny_bind=sc.get("deny_bind", False))
            status["seccomp"] = f"enforced ({n} instructions)"
        except OSError as err:
            status["seccomp"] = f"unavailable: {err}"
            if sc.get("required"):
                raise
    return status


def main(argv: list[str]) -> int:
    spec = json.loads(argv[1])
    status_fd = int(argv[2])
    tool_argv = argv[4:]
    try:
        status = apply(spec)
    except OSError as err:
        os.write(status_fd, json.dumps({"error": str(err)}).encode())
        return 126
    os.write(status_fd, json.dumps(status).encode())
    keep, report = bool(spec.get("keep_status")), bool(spec.get("report_end"))
    if not keep and not report:  # else the next launcher in the chain appends its status
        os.close(status_fd)  # (keep) or this one appends the tool's end (report)
    # pid 1 of a pid namespace (sb_launch.c -i), or the tool's reporting parent (-w)
    if spec.get("init") or report:
        tool = os.fork()
        if tool != 0:
            return _init(tool, status_fd if report else None)
        if report and not keep:
            os.close(status_fd)  # the tool never holds the pipe its end is reported on
    try:
        os.execvp(tool_argv[0], tool_argv)
    except OSError as err:
        sys.stderr.write(f"policy-engine launcher: cannot execute `{tool_argv[0]}`: {err}\n")
        return 127


def _init(tool: int, report_fd: int | None = None) -> int:
    """Reap every orphan until ``tool`` ends; exit with its status, 128 + N for signal N (a
    namespace's pid 1 ignores signals it has no handler for, so the tool must not be it). With
    ``report_fd``, first append ``{"tool_end": {"signal": N}}`` or ``{"tool_end": {"exit": N}}``:
    the 128 + N the engine sees cannot tell a signal from a tool's own exit with that code."""
    with contextlib.suppress(OSError):  # there may be none
        os.close(0)  # the tool's stdin alone: a tool closing it gives the engine's writes EPIPE
    while True:
        pid, status = os.wait()
        if pid == tool:
            code = os.waitstatus_to_exitcode(status)
            if report_fd is not None:
                end = {"signal": -code} if code < 0 else {"exit": code}
                os.write(report_fd, json.dumps({"tool_end": end}).encode())
            os._exit(128 - code if code < 0 else code)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
