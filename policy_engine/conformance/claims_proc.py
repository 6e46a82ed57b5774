"""Claim probes of what a proc.exec executor promises about the process it starts: secrets
behind the mandatory denies stay unreadable, the environment is filtered, resource limits bind;
and, for an honest executor that does not promise the mandatory denies, what the engine runs.

Like ``claims.py``, each probe is a ``python3 -c`` program run through the real orchestrator
that reports what it managed; the kit compares that with what it planted on the host: files
under mandatory-deny paths (``**/.env``, ``**/credentials.json``) inside the profile's readable
root, the SHA-256 of the host's own ``~/.ssh`` files (read, never copied or printed), and a
variable set in the kit's environment for the length of one call.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from policy_engine.conformance.checks import result
from policy_engine.conformance.claims import (
    _REPORT,
    PYTHON,
    ClaimEnv,
    _caps,
    _mark_first,
    _program,
    probe_ran,
    read_report,
)
from policy_engine.conformance.harness import Run
from policy_engine.conformance.probes import Probe
from policy_engine.conformance.report import CheckResult
from policy_engine.executor import ExecutorCapabilities
from policy_engine.model import Limits, NetworkMode, OpKind, ProcExecOp

MIB = 1024 * 1024
MEMORY_LIMIT = 96 * MIB
"""The memory limit of the memory probe's profile; the probe then touches 4x that."""
PIDS_LIMIT = 16
"""The pids limit of the pids probe's profile; the probe then starts up to 4x that."""
MAX_HOME_FILES = 8
"""``~/.ssh`` files whose digests the kit compares (the first, sorted by name)."""
_PLANTED = (".env", "work/.env", "secrets/credentials.json")
"""Files planted under the profile's root: each matches a built-in mandatory deny."""


@dataclass(slots=True)
class Plants:
    """What the kit planted or found for one run, and how to recognise it coming back."""

    digests: dict[str, str] = field(default_factory=dict)  # path -> SHA-256 of its content
    planted: list[Path] = field(default_factory=list)
    env_name: str = ""
    env_value: str = ""


def plant(c: ClaimEnv) -> Plants:
    """Plant secret files under the root and note the host's ``~/.ssh`` files."""
    out = Plants(env_name=f"PE_CONFORMANCE_ENV_{c.marker.upper()}",
                 env_value=f"pe-conformance-env-{c.marker}")
    for rel in _PLANTED:
        path = c.env.root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        content = f"API_TOKEN=pe-conformance-denied-{c.marker}-{len(out.planted)}\n".encode()
        path.write_bytes(content)
        out.planted.append(path)
        out.digests[str(path)] = hashlib.sha256(content).hexdigest()
    ssh = Path(os.path.expanduser("~")) / ".ssh"
    with contextlib.suppress(OSError):
        for entry in sorted(ssh.iterdir())[:MAX_HOME_FILES]:
            with contextlib.suppress(OSError):
                if entry.is_file() and not entry.is_symlink() and entry.stat().st_size <= MIB:
                    out.digests[str(entry)] = hashlib.sha256(entry.read_bytes()).hexdigest()
    return out


def secrets_probe(c: ClaimEnv, plants: Plants) -> Probe:
    """Read every planted/host secret file; report digests (never contents) and the variable."""
    body = ("import hashlib\n"
            "def digest(p):\n"
            "    with open(p, 'rb') as fh:\n"
            f"        return hashlib.sha256(fh.read({MIB})).hexdigest()\n"
            f"for i, p in enumerate({sorted(plants.digests)!r}):\n"
            "    attempt('file:' + p, lambda p=p: digest(p))\n"
            f"attempt('env', lambda: os.environ.get({plants.env_name!r}))\n"
            + _REPORT)
    program = _program(body)
    return Probe(ProcExecOp(tool=PYTHON, args=("-c", program)), _caps(c, program),
                 title="claims: read planted secrets and a planted variable")


def pids_probe(c: ClaimEnv) -> Probe:
    body = ("def spawn():\n"
            "    procs = []\n"
            f"    for _ in range({4 * PIDS_LIMIT}):\n"
            "        try:\n"
            "            procs.append(subprocess.Popen(['/bin/sleep', '5']))\n"
            "        except OSError:\n"
            "            break\n"
            "    for p in procs:\n"
            "        p.kill(); p.wait()\n"
            "    return len(procs)\n"
            "attempt('pids', spawn)\n" + _REPORT)
    program = _program(body)
    return Probe(ProcExecOp(tool=PYTHON, args=("-c", program)), _caps(c, program),
                 limits=Limits(pids=PIDS_LIMIT), title=f"claims: start {4 * PIDS_LIMIT} "
                 f"processes under a {PIDS_LIMIT}-pid limit")


def memory_probe(c: ClaimEnv) -> Probe:
    # b"\x01" * n writes every page: a lazily mapped buffer would pass a limit it never touched
    body = (_mark_first(c, "memory")
            + f"attempt('memory', lambda: len(b'\\x01' * {4 * MEMORY_LIMIT}))\n" + _REPORT)
    program = _program(body)
    return Probe(ProcExecOp(tool=PYTHON, args=("-c", program)), _caps(c, program),
                 limits=Limits(memory_bytes=MEMORY_LIMIT),
                 title=f"claims: touch {4 * MEMORY_LIMIT // MIB} MiB under a "
                       f"{MEMORY_LIMIT // MIB} MiB limit")


def proc_claim_probes(c: ClaimEnv, plants: Plants) -> dict[str, Probe]:
    return {"secrets": secrets_probe(c, plants), "pids": pids_probe(c),
            "memory": memory_probe(c)}


@contextlib.contextmanager
def planted_variable(plants: Plants) -> Iterator[None]:
    """The kit's environment holds the planted variable while the secrets probe runs (an
    executor without env filtering hands it to the tool)."""
    os.environ[plants.env_name] = plants.env_value
    try:
        yield
    finally:
        os.environ.pop(plants.env_name, None)


def _secret_problems(plants: Plants, run: Run) -> tuple[list[str], list[str]]:
    report = read_report(run) or {}
    files = [f"the tool read `{path}` (its SHA-256 came back through run): a mandatory-deny "
             "path must be unreachable inside the sandbox; mask it (bind /dev/null over a file, "
             "an empty tmpfs over a directory) for every built-in deny (~/.ssh, **/.env, "
             "**/credentials.json, /run/**, ...)"
             for path, digest in plants.digests.items() if report.get(f"file:{path}") == digest]
    env = ([f"the planted variable `{plants.env_name}` reached the tool; start it with an "
            "allow-listed environment (PATH, HOME, LANG and what the op names), never the "
            "engine's own"] if report.get("env") == plants.env_value else [])
    if run.outcome.result.ok and not report:
        files.append("the secrets probe ran but printed no report: its output did not come "
                     "back in result.out['stdout']")
    return files, env


def _limit_problems(runs: dict[str, Run], timed: Run | None, grace_s: float) -> list[str]:
    problems = []
    pids = (read_report(runs["pids"]) or {}).get("pids")
    if isinstance(pids, int) and pids >= 4 * PIDS_LIMIT:
        problems.append(f"the tool started {pids} processes under a {PIDS_LIMIT}-pid limit; "
                        "bound them (a pids cgroup; RLIMIT_NPROC does not bind root)")
    memory = (read_report(runs["memory"]) or {}).get("memory")
    if isinstance(memory, int) and memory >= 4 * MEMORY_LIMIT:
        problems.append(f"the tool wrote {memory // MIB} MiB under a {MEMORY_LIMIT // MIB} MiB "
                        "memory limit; bound it (a memory cgroup, or RLIMIT_AS)")
    # the orphan attack sleeps 30 s under a short timeout (a backend may stop it sooner by
    # refusing its detached child: then it did not outlive anything)
    if timed is not None and timed.calls and timed.timeout_ms \
            and timed.elapsed_s > timed.timeout_ms / 1000 + grace_s + 1.0:
        problems.append(f"a tool sleeping past its {timed.timeout_ms} ms timeout ran "
                        f"{timed.elapsed_s:.1f} s (ended with {timed.outcome.result.code or 'ok'})"
                        "; kill its process tree at the deadline")
    # a probe that ran without reporting is claims.probes-run's (and _reached's) finding
    return problems


def advice(caps: ExecutorCapabilities) -> str:
    """What an executor that does not declare mandatory_denies may run, in each mode."""
    others = sorted(k.value for k in caps.op_kinds if k != OpKind.PROC_EXEC)
    weak = [flag for flag in ("bind_mounts", "readonly_rootfs", "resource_limits",
                              "env_filtering") if not getattr(caps, flag)]
    if NetworkMode.OFF not in caps.network_modes:
        weak.append("network mode `off`")
    served = (f"its other kinds ({', '.join(others)}) run as usual" if others
              else "it declares no other kind, so nothing runs on it")
    degraded = (f"compat mode (`--mode compat`, engine `mode: compat`) runs proc.exec without "
                f"{', '.join(weak)} degraded and records why, " if weak else "")
    return ("the executor serves proc.exec but does not declare mandatory_denies, so the "
            "engine refuses every proc.exec routed to it, in strict and in compat mode "
            "(secrets such as ~/.ssh and **/.env and host control sockets under /run must be "
            f"unreachable; that never degrades). {degraded}but only once mandatory_denies "
            f"holds; until then {served}. To run processes: mask every built-in mandatory "
            "deny inside the sandbox and declare mandatory_denies=True (this check then "
            "attacks it); or stop declaring proc.exec")


def refused_results(caps: ExecutorCapabilities,
                    results: Sequence[CheckResult]) -> list[CheckResult]:
    """For an executor without mandatory_denies: the checks that failed only because every
    proc.exec was refused become n/a pointing at ``claims.mandatory-denies``."""
    see = ("every proc.exec is refused on this executor (no mandatory_denies): see "
           "claims.mandatory-denies")
    refused = ("capabilities.runs[proc.exec]", "timeout.honoured", "cancel.honoured")
    # only a failure that *is* that refusal (its message names it); any other stays a failure
    return [result(r.id, (), title_key=_title_key(r.id), na=see)
            if r.status == "fail" and r.id in refused
            and "cannot enforce the mandatory denies" in r.message else r for r in results]


def _title_key(check_id: str) -> str:
    return "capabilities.runs[<kind>]" if check_id.startswith("capabilities.runs[") else check_id


def proc_claim_results(c: ClaimEnv, caps: ExecutorCapabilities, plants: Plants,
                       runs: dict[str, Run], timed: Run | None,
                       grace_s: float) -> list[CheckResult]:
    """One result per claim: mandatory denies, environment filtering, resource limits."""
    try:
        if not caps.mandatory_denies:
            return [result("claims.mandatory-denies", [advice(caps)]),
                    result("claims.env-filtering", (), na="proc.exec is refused on this "
                           "executor (no mandatory_denies): see claims.mandatory-denies"),
                    result("claims.resource-limits", (), na="proc.exec is refused on this "
                           "executor (no mandatory_denies): see claims.mandatory-denies")]
        files, env = _secret_problems(plants, runs["secrets"])
        out = [_reached(c, "claims.mandatory-denies", runs, ("secrets",), files)]
        out.append(_reached(c, "claims.env-filtering", runs, ("secrets",), env)
                   if caps.env_filtering else result(
                       "claims.env-filtering", (), na="the executor does not declare "
                       "env_filtering (compat mode runs its calls degraded, recorded)"))
        out.append(_reached(c, "claims.resource-limits", runs, ("pids", "memory"),
                            _limit_problems(runs, timed, grace_s))
                   if caps.resource_limits else result(
                       "claims.resource-limits", (), na="the executor does not declare "
                       "resource_limits (compat mode runs its calls degraded, recorded)"))
        return out
    finally:
        for path in plants.planted:
            with contextlib.suppress(OSError):
                path.unlink()


def _reached(c: ClaimEnv, check_id: str, runs: dict[str, Run], keys: tuple[str, ...],
             problems: list[str]) -> CheckResult:
    # a refused (or report-less) probe found nothing: no evidence the claim holds
    unproven = [why for key in keys if (why := probe_ran(key, runs[key], c))]
    return result(check_id, unproven or problems)
