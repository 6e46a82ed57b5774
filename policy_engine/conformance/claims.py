"""Claim probes: the kit attacks a proc.exec executor the way the adversarial pass did and
checks what it *declares* (network off, bind mounts, a read-only root) against what happened.

Each probe is a small Python program run inside the executor under test through the real
orchestrator; it reports what it managed to do in a file under the writable directory, and the
kit then looks at the host: a loopback canary listener, files outside the writable paths,
set-id bits and device nodes planted in the writable bind, processes left running, IPC objects
visible to the next call. A claim the executor does not make is not tested (``n/a``); in compat
mode the runs must then record the degradation instead.
"""

from __future__ import annotations

import base64
import contextlib
import ctypes
import json
import os
import socket
import stat
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from policy_engine.conformance.checks import result
from policy_engine.conformance.harness import Run
from policy_engine.conformance.probes import Probe, ProbeEnv, _proc_cap
from policy_engine.conformance.report import CheckResult
from policy_engine.errors import ErrorCode
from policy_engine.executor import ExecutorCapabilities
from policy_engine.model import (
    ArgAlternative,
    ArgSlot,
    FsCapability,
    NetworkMode,
    ProcCapability,
    ProcExecOp,
)

PYTHON = "/usr/bin/python3"
"""The interpreter the probe programs run with (Debian's python3, present in every sandbox that
binds /usr read-only; an executor that cannot run it fails ``capabilities.runs``)."""


class Canary:
    """A loopback TCP listener that records every connection a sandbox manages to open."""

    def __init__(self) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.sock.settimeout(0.2)
        self.port: int = self.sock.getsockname()[1]
        self.hits: list[bytes] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="pe-conformance-canary",
                                        daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _addr = self.sock.accept()
            except OSError:
                continue
            with conn:
                conn.settimeout(0.5)
                try:
                    self.hits.append(conn.recv(256))
                except OSError:
                    self.hits.append(b"")

    def close(self) -> None:
        self._stop.set()
        self._thread.join(2.0)
        self.sock.close()


@dataclass(slots=True)
class ClaimEnv:
    """Paths and markers of one claims run (under the suite's work directory)."""

    env: ProbeEnv
    marker: str
    canary: Canary
    work: Path = field(init=False)
    outside: Path = field(init=False)

    def __post_init__(self) -> None:
        self.work = self.env.root / "work"
        self.work.mkdir(parents=True, exist_ok=True)
        os.chmod(self.work, 0o777)  # an executor that drops to an unprivileged uid can write
        self.outside = self.env.workdir / "outside"
        self.outside.mkdir(exist_ok=True)


def _program(body: str) -> str:
    """A one-argument ``python3 -c`` program that never raises: each attempt is recorded.

    The argv carries the program hex-encoded (issue 32 attack H1): an executor cannot pass the
    kit by refusing programs that *look* like attacks (a word filter on ``socket``, ``.env``,
    ``chmod``); it must run them, and a refused probe fails ``claims.probes-run`` anyway.
    """
    text = ("import json, os, socket, subprocess, sys, time, ctypes, shutil, stat\n"
            "R = {}\n"
            "def attempt(name, fn):\n"
            "    try:\n"
            "        R[name] = fn()\n"
            "    except BaseException as exc:\n"
            "        R[name] = 'refused: ' + type(exc).__name__\n"
            + body)
    return f"exec(bytes.fromhex('{text.encode().hex()}').decode())"


REPORT_PREFIX = "pe-conformance-report "
_REPORT = f"print({REPORT_PREFIX!r} + json.dumps(R))\n"


def _caps(c: ClaimEnv, program: str) -> list[object]:
    root = str(c.env.root)
    return [_proc_cap(PYTHON, "-c", program),
            FsCapability(kind="fs.read", paths=(f"{root}/**",)),
            FsCapability(kind="fs.write", paths=(f"{c.work}/**",))]


def escape_probe(c: ClaimEnv) -> Probe:
    """Network canary, writes outside the writable paths, set-id and device plants, identity."""
    m = c.marker
    body = (
        f"def net():\n"
        f"    s = socket.create_connection(('127.0.0.1', {c.canary.port}), timeout=2)\n"
        f"    s.sendall(b'{m}'); s.close(); return 'connected'\n"
        "attempt('network', net)\n"
        f"attempt('write_root', lambda: open({str(c.env.root / ('escape-' + m))!r}, 'w')"
        ".write('x'))\n"
        f"attempt('write_host', lambda: open({str(c.outside / ('escape-' + m))!r}, 'w')"
        ".write('x'))\n"
        f"plant = {str(c.work / ('setid-' + m))!r}\n"
        "if not os.path.isdir(os.path.dirname(plant)):  # a backend with its own layout\n"
        f"    plant = os.path.join(os.getcwd(), 'setid-{m}')\n"
        "def setid():\n"
        "    shutil.copyfile(os.path.realpath(sys.executable), plant)\n"
        "    os.chmod(plant, 0o6755); return oct(os.stat(plant).st_mode)\n"
        "attempt('setid', setid)\n"
        f"attempt('mknod', lambda: os.mknod({str(c.work / ('dev-' + m))!r}, "
        "stat.S_IFCHR | 0o666, os.makedev(1, 3)))\n"
        "attempt('euid', os.geteuid)\n"
        "attempt('uid_map', lambda: open('/proc/self/uid_map').read())\n"
        + _REPORT)
    program = _program(body)
    return Probe(ProcExecOp(tool=PYTHON, args=("-c", program)), _caps(c, program),
                 title="claims: escape attempts (network, writes, set-id, devices, identity)")


def orphan_probe(c: ClaimEnv) -> Probe:
    """Leaves a detached child behind, then outlives the kit's timeout."""
    child = f"import time; time.sleep(120)  # orphan-{c.marker}"
    body = (_mark_first(c, "orphans")
            + f"subprocess.Popen([sys.executable, '-c', {child!r}], start_new_session=True,"
            " stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)\n"
            "time.sleep(30)\n")
    program = _program(body)
    return Probe(ProcExecOp(tool=PYTHON, args=("-c", program)), _caps(c, program), role="slow",
                 title="claims: a detached child, then past the timeout")


def ipc_plant_probe(c: ClaimEnv) -> Probe:
    body = (
        f"attempt('shm', lambda: open('/dev/shm/pe-{c.marker}', 'w').write('{c.marker}'))\n"
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        f"attempt('sysv', lambda: libc.shmget({_sysv_key(c.marker)}, 4096, 0o1000 | 0o666))\n"
        + _REPORT)
    program = _program(body)
    return Probe(ProcExecOp(tool=PYTHON, args=("-c", program)), _caps(c, program),
                 title="claims: plant IPC objects")


def ipc_look_probe(c: ClaimEnv) -> Probe:
    body = (
        f"attempt('shm', lambda: os.path.exists('/dev/shm/pe-{c.marker}'))\n"
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        f"attempt('sysv', lambda: libc.shmget({_sysv_key(c.marker)}, 0, 0) >= 0)\n"
        + _REPORT)
    program = _program(body)
    return Probe(ProcExecOp(tool=PYTHON, args=("-c", program)), _caps(c, program),
                 title="claims: look for the previous call's IPC objects")


def marker_probe(c: ClaimEnv) -> Probe:
    """argv, stdin and stdout markers: none may reach the evidence."""
    argv_m, stdin_m, stdout_m = (f"{k}-{c.marker}" for k in ("argv", "stdin", "stdout"))
    # built at run time: the program text is a template literal (public), its output is not
    program = f"import sys; sys.stdin.read(); print('stdout' + '-' + {c.marker!r})"
    # the marker argument matches a regex slot, not a literal: a literal the policy author
    # spelled is public and evidence may name it; an argument only a pattern admits is not
    slots = (*(_proc_cap(PYTHON, "-c", program).args or ()),
             ArgSlot(alternatives=(ArgAlternative(regex="argv-[0-9a-f]+"),)))
    return Probe(ProcExecOp(tool=PYTHON, args=("-c", program, argv_m),
                            stdin_b64=base64.b64encode(stdin_m.encode()).decode()),
                 [ProcCapability(tool=PYTHON, args=slots)],
                 secrets=(argv_m, stdin_m, stdout_m),
                 title="claims: argv, stdin and stdout markers")


def _sysv_key(marker: str) -> int:
    return int.from_bytes(marker.encode()[:4].ljust(4, b"\0"), "big") & 0x7FFFFFFF


# -- reading the host ----------------------------------------------------------------------------


def read_report(run: Run) -> dict[str, object] | None:
    """What the probe program printed about its attempts (None when it did not run)."""
    out = run.outcome.result.out if run.outcome.result.ok else {}
    stdout = out.get("stdout") if isinstance(out, dict) else None
    for line in str(stdout or "").splitlines():
        if line.startswith(REPORT_PREFIX):
            try:
                data = json.loads(line[len(REPORT_PREFIX):])
            except ValueError:
                return None
            return data if isinstance(data, dict) else None
    return None


def orphans(marker: str) -> list[int]:
    """Host processes whose command line carries the orphan marker (then killed)."""
    found: list[int] = []
    needle = f"orphan-{marker}".encode()
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as fh:
                if needle in fh.read():
                    found.append(int(entry))
        except OSError:
            continue
    for pid in found:
        with contextlib.suppress(OSError):
            os.kill(pid, 9)
    return found


def escape_problems(c: ClaimEnv, run: Run) -> dict[str, list[str]]:
    """Per claim, what the escape probe managed (seen from the host and as it reported)."""
    report = read_report(run) or {}
    out: dict[str, list[str]] = {"network": [], "writes": [], "setid": [], "root": []}
    if any(c.marker.encode() in hit for hit in c.canary.hits) or c.canary.hits:
        out["network"].append(
            f"declares network mode `off` but the probe connected to the kit's loopback "
            f"canary 127.0.0.1:{c.canary.port} from inside a network-off profile; unshare the "
            "network namespace (bwrap --unshare-net) or stop declaring `off`")
    for where in (c.env.root / f"escape-{c.marker}", c.outside / f"escape-{c.marker}"):
        if where.exists():
            out["writes"].append(
                f"declares bind_mounts/readonly_rootfs but the probe created `{where}` outside "
                "the profile's writable paths; bind only the writable paths read-write")
    plant = c.work / f"setid-{c.marker}"
    try:
        st = plant.lstat()
    except OSError:
        st = None
    if st is not None and st.st_mode & (stat.S_ISUID | stat.S_ISGID) and st.st_uid == 0:
        out["setid"].append(
            f"a file the sandbox wrote (`{plant}`) is owned by host root with mode "
            f"{oct(st.st_mode & 0o7777)}: any host user can run it as root; run the sandbox "
            "under an unprivileged uid (user namespace) and mount writable binds nosuid")
    dev = c.work / f"dev-{c.marker}"
    try:
        dst = dev.lstat()
    except OSError:
        dst = None
    if dst is not None and (stat.S_ISCHR(dst.st_mode) or stat.S_ISBLK(dst.st_mode)):
        out["setid"].append(f"the sandbox created the device node `{dev}` in a writable bind; "
                            "refuse mknod (seccomp) and mount writable binds nodev")
    host_uid = _host_uid(report.get("euid"), str(report.get("uid_map", "")))
    if host_uid == 0 and str(report.get("setid", "")).startswith("0o") and not out["setid"]:
        out["setid"].append("the sandbox, running as host root, set set-id bits on a file it "
                            f"wrote ({report.get('setid')}); on the host that file runs as root")
    if host_uid == 0:
        out["root"].append("the sandboxed process runs as host uid 0 (its uid_map maps its "
                           f"euid {report.get('euid')} to 0); run it as an unprivileged uid, "
                           "e.g. mapped to one in a user namespace")
    if run.outcome.result.ok and not report:
        out["writes"].append("the escape probe ran but printed no report: its output did not "
                             "come back in result.out['stdout']")
    for p in (plant, dev, c.env.root / f"escape-{c.marker}", c.outside / f"escape-{c.marker}"):
        with contextlib.suppress(OSError):
            p.unlink()
    return out


def _host_uid(euid: object, uid_map: str) -> int | None:
    """The host uid the sandbox's euid maps to (None when unknown, e.g. no report)."""
    if not isinstance(euid, int):
        return None
    for line in uid_map.splitlines():
        parts = line.split()
        if len(parts) == 3 and all(p.isdigit() for p in parts):
            inside, outside, count = map(int, parts)
            if inside <= euid < inside + count:
                return outside + (euid - inside)
    return euid if not uid_map else None


def ipc_problems(c: ClaimEnv, look: Run) -> list[str]:
    seen = read_report(look) or {}
    problems = []
    if seen.get("shm") is True:
        problems.append("a file the previous call wrote to /dev/shm is visible to the next "
                        "call; give each call a private /dev/shm (and IPC namespace)")
    if seen.get("sysv") is True:
        problems.append("a SysV shared-memory segment of the previous call is visible to the "
                        "next call; give each call a fresh IPC namespace")
    host_shm = Path(f"/dev/shm/pe-{c.marker}")
    if host_shm.exists():
        problems.append("a file the sandbox wrote to /dev/shm appeared in the host's /dev/shm")
        host_shm.unlink()
    _remove_sysv(_sysv_key(c.marker))
    return problems


def _remove_sysv(key: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    shmid = libc.shmget(key, 0, 0)
    if shmid >= 0:
        libc.shmctl(shmid, 0, None)  # IPC_RMID


_EXPECTED_ENDS = {"orphans": frozenset({ErrorCode.TIMEOUT.value}),
                  "memory": frozenset({ErrorCode.BUDGET_EXCEEDED.value,
                                       ErrorCode.EXECUTION_FAILED.value})}
"""Ends a probe is built to meet on an honest sandbox (the orphan probe sleeps past its
timeout, the memory probe outgrows its limit and may be killed before it reports), accepted
only once the probe's first act, a file written in the writable bind, shows it ran."""
_NO_REPORT = frozenset({"orphans", "markers"})
"""Probes that print no report (what they leave behind is looked at on the host)."""


def started_mark(c: ClaimEnv, key: str) -> Path:
    """The file the ``key`` probe writes before anything else (seen from the host)."""
    return c.work / f"ran-{key}-{c.marker}"


STARTED_PREFIX = "pe-conformance-started "


def _mark_first(c: ClaimEnv, key: str) -> str:
    """The probe's first act: a file in the writable bind (for a backend that binds it at the
    same path) and a flushed stdout line (for one that returns a killed tool's output)."""
    return (f"attempt('started', lambda: open({str(started_mark(c, key))!r}, 'w').write('r'))\n"
            f"print({STARTED_PREFIX + key + ' ' + c.marker!r}, flush=True)\n")


def _started(c: ClaimEnv, key: str, run: Run) -> bool:
    """Whether the ``key`` probe's first act is seen: it ran, whatever ended it."""
    out = run.outcome.result.out
    stdout = out.get("stdout") if isinstance(out, dict) else None
    # a tool killed at its deadline may leave neither behind on a backend with its own
    # layout: having held the call until then is the sign it ran
    held = run.timeout_ms is not None and run.elapsed_s >= run.timeout_ms / 1000
    return held or started_mark(c, key).exists() \
        or f"{STARTED_PREFIX}{key} {c.marker}" in str(stdout or "")


def probe_ran(key: str, run: Run, c: ClaimEnv) -> str | None:
    """Why the ``key`` probe proves nothing about a claim (it never reached the executor, the
    executor refused or failed it, or its report did not come back), or ``None``: it ran."""
    got = run.outcome.result
    if not run.calls:
        return (f"the {key} probe never reached the executor ({got.code}: {got.message}); "
                "a declared claim must be testable")
    if key in _EXPECTED_ENDS and (got.ok or got.code in _EXPECTED_ENDS[key]) \
            and _started(c, key, run):
        return None  # it ran; what it managed is judged by the claim's own check
    if not got.ok:
        return (f"the executor did not run the {key} probe: it ended with {got.code} "
                f"({str(got.message)[:200]}). A claim holds only when its probe runs inside "
                "the sandbox and reports what it could do; refusing a program that looks like "
                "an attack is not isolation. Run every program the profile allows and let the "
                "sandbox (namespaces, masks, seccomp, limits) stop what it attempts")
    if got.ok and key not in _NO_REPORT and read_report(run) is None:
        return (f"the {key} probe ran but its report did not come back in "
                "result.out['stdout']")
    return None


def probes_run_result(c: ClaimEnv, caps: ExecutorCapabilities,
                      runs: dict[str, Run]) -> CheckResult:
    """``claims.probes-run``: the positive control. Every probe must run: a claim whose probe
    was refused would otherwise pass on what the probe never got to try."""
    if not caps.mandatory_denies:
        return result("claims.probes-run", (), na="proc.exec is refused on this executor (no "
                      "mandatory_denies): see claims.mandatory-denies")
    return result("claims.probes-run",
                  [why for key, run in runs.items() if (why := probe_ran(key, run, c))])


def claims_of(caps: ExecutorCapabilities) -> dict[str, bool]:
    """Which claims the kit tests: only what the executor declares."""
    isolating = caps.bind_mounts or caps.readonly_rootfs
    return {"network": NetworkMode.OFF in caps.network_modes, "writes": isolating,
            "setid": isolating, "root": isolating,
            "orphans": isolating or caps.resource_limits, "ipc": isolating}


def wait_for_orphans(marker: str, settle_s: float = 1.5) -> list[int]:
    """Give a torn-down sandbox a moment to reap, then list (and kill) what is left."""
    time.sleep(settle_s)
    return orphans(marker)


def claim_probes(c: ClaimEnv) -> dict[str, Probe]:
    """The attacks, in the order they run (the IPC look must follow the plant)."""
    return {"escape": escape_probe(c), "ipc-plant": ipc_plant_probe(c),
            "ipc-look": ipc_look_probe(c), "orphans": orphan_probe(c),
            "markers": marker_probe(c)}


_NOT_CLAIMED = {
    "network": "the executor does not declare network mode `off`",
    "writes": "the executor declares neither bind_mounts nor readonly_rootfs",
    "setid": "the executor declares neither bind_mounts nor readonly_rootfs",
    "root": "the executor declares neither bind_mounts nor readonly_rootfs",
    "ipc": "the executor declares neither bind_mounts nor readonly_rootfs",
    "orphans": "the executor declares no isolation and no resource limits",
}
_IDS = {"network": "claims.network-off", "writes": "claims.writes-confined",
        "setid": "claims.no-setid-plant", "root": "claims.not-host-root",
        "orphans": "claims.no-orphans", "ipc": "claims.ipc-isolated"}


def claim_results(c: ClaimEnv, caps: ExecutorCapabilities,
                  runs: dict[str, Run]) -> list[CheckResult]:
    """Turn what the attacks achieved into one result per claim."""
    claimed = claims_of(caps)
    escape = runs["escape"]
    found = escape_problems(c, escape)
    found["ipc"] = ipc_problems(c, runs["ipc-look"])
    left = wait_for_orphans(c.marker)
    found["orphans"] = ([f"{len(left)} process(es) of a timed-out call were still running on "
                         f"the host afterwards (pids {left}); kill the whole process tree "
                         "(a pid namespace or cgroup) when a call ends or times out"]
                        if left else [])
    out = [probes_run_result(c, caps, runs)]
    for key, cid in _IDS.items():
        if not claimed[key]:
            out.append(result(cid, (), na=_NOT_CLAIMED[key]))
            continue
        probes = {"ipc": ("ipc-plant", "ipc-look"), "orphans": ("orphans",)}.get(key,
                                                                                ("escape",))
        unproven = [why for p in probes if (why := probe_ran(p, runs[p], c))]
        # a refused probe found nothing: that is no evidence the claim holds
        out.append(result(cid, unproven or found[key]))
    return out
