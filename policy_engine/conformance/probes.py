"""Probe ops: what the kit runs per capability kind, the permission that allows each, and the
fixtures they need (files under a work directory, a loopback HTTP server).

An executor may add or replace probes by defining ``conformance_probes(env) -> Iterable[Probe]``
(see docs/conformance.md, "For executor plugin authors").
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pydantic import TypeAdapter

from policy_engine.conformance.server import ProbeServer
from policy_engine.model import (
    ArgAlternative,
    ArgSlot,
    BrowserCapability,
    Capability,
    ExecOp,
    FsCapability,
    GpuCapability,
    NetHttpCapability,
    OpKind,
    ProcCapability,
    TmpCapability,
)
from policy_engine.model.ops import (
    BrowserNavOp,
    FsListOp,
    FsReadOp,
    FsWriteOp,
    NetHttpOp,
    ProcExecOp,
    TmpAllocOp,
)

Role = Literal["run", "slow", "refuse"]
_OPS: TypeAdapter[Any] = TypeAdapter(ExecOp)
_CAPS: TypeAdapter[Any] = TypeAdapter(Capability)


@dataclass(frozen=True, slots=True)
class Probe:
    """One op the kit runs through the orchestrator.

    :param op: the operation (an ``ExecOp`` model or its JSON form).
    :param capabilities: what the grant and manifest give and the generated policy permits
        (models or JSON forms); they must allow ``op``.
    :param role: ``run`` must succeed; ``slow`` must outlast any short timeout (used for the
        timeout and cancellation checks); ``refuse`` must fail with ``expect_code``.
    :param expect_code: the registry code a ``refuse`` probe must end with.
    :param secrets: strings the fixture planted (file content, response body, header values):
        none may appear in any evidence record.
    :param title: shown in reports.
    :param limits: resource limits the probing tool's manifest sets (a ``Limits`` or its
        fields), for probes that check an executor enforces them.
    """

    op: Any
    capabilities: Sequence[Any]
    role: Role = "run"
    expect_code: str | None = None
    secrets: tuple[str, ...] = ()
    title: str = ""
    limits: Any = None

    def exec_op(self) -> ExecOp:
        """The op as a model (validated, so a malformed probe fails with a clear message)."""
        op: ExecOp = _OPS.validate_python(self.op)
        return op

    def caps(self) -> tuple[Capability, ...]:
        return tuple(_CAPS.validate_python(c) for c in self.capabilities)

    @property
    def kind(self) -> OpKind:
        return OpKind(self.exec_op().kind)

    def label(self) -> str:
        return self.title or f"{self.kind.value} {self.role}"


@dataclass(slots=True)
class ProbeEnv:
    """Fixtures shared by every probe of one suite run.

    :param workdir: a fresh directory the kit deletes afterwards.
    :param root: the profile's ``root_fs`` (``workdir/root``); file probes live under it.
    :param tmp_dir: the profile's ``tmp_dir``.
    :param server: a loopback HTTP server (``server.url("/hello")``); routes in
        ``policy_engine.conformance.server``.
    :param secret: a random value planted in fixtures and in the call context.
    """

    workdir: Path
    root: Path
    tmp_dir: Path
    server: ProbeServer
    secret: str
    extra: dict[str, Any] = field(default_factory=dict)


def _data_dir(env: ProbeEnv) -> Path:
    data = env.root / "data"
    data.mkdir(parents=True, exist_ok=True)
    return data


def _fs_probes(env: ProbeEnv, kind: OpKind) -> list[Probe]:
    data = _data_dir(env)
    hello = data / "hello.txt"
    hello.write_text(f"conformance fixture; secret={env.secret}\n", encoding="utf-8")
    glob = f"{data}/**"
    if kind == OpKind.FS_READ:
        return [Probe(FsReadOp(path=str(hello)), [FsCapability(kind="fs.read", paths=(glob,))],
                      secrets=(env.secret,), title="read a file holding a secret")]
    if kind == OpKind.FS_LIST:
        return [Probe(FsListOp(path=str(data)), [FsCapability(kind="fs.list", paths=(glob,))],
                      title="list a directory")]
    payload = base64.b64encode(f"written secret={env.secret}".encode()).decode()
    return [Probe(FsWriteOp(path=str(data / "written.txt"), bytes_b64=payload, overwrite=True),
                  [FsCapability(kind="fs.write", paths=(glob,))], secrets=(env.secret,),
                  title="write a file holding a secret")]


def _http_cap(env: ProbeEnv) -> NetHttpCapability:
    return NetHttpCapability(hosts=("127.0.0.1",), schemes=("http",), ports=(env.server.port,),
                             methods=("GET",))


def _proc_cap(tool: str, *literals: str) -> ProcCapability:
    slots = tuple(ArgSlot(alternatives=(ArgAlternative(literal=a),)) for a in literals)
    return ProcCapability(tool=tool, args=slots)


def default_probes(kind: OpKind, env: ProbeEnv) -> list[Probe]:
    """The kit's own probes for ``kind``: a successful op, plus a slow one where one exists."""
    if kind in (OpKind.FS_READ, OpKind.FS_LIST, OpKind.FS_WRITE):
        return _fs_probes(env, kind)
    if kind == OpKind.TMP_ALLOC:
        return [Probe(TmpAllocOp(size_bytes=4096), [TmpCapability(max_bytes=1024 * 1024)],
                      title="allocate a 4 KiB temp space")]
    if kind == OpKind.NET_HTTP:
        auth = {"Authorization": f"Bearer {env.secret}"}
        return [
            Probe(NetHttpOp(url=env.server.url("/hello"), headers=auth), [_http_cap(env)],
                  secrets=(env.secret,), title="GET a loopback page with a bearer token"),
            Probe(NetHttpOp(url=env.server.url("/slow")), [_http_cap(env)], role="slow",
                  title="GET a loopback page that never finishes"),
        ]
    if kind == OpKind.PROC_EXEC:
        return [
            # argv is recorded in evidence by design (seed 002 §6), so no secret goes there;
            # the call context still carries one
            Probe(ProcExecOp(tool="/bin/echo", args=("conformance",)),
                  [_proc_cap("/bin/echo", "conformance")], title="run /bin/echo"),
            Probe(ProcExecOp(tool="/bin/sleep", args=("30",)), [_proc_cap("/bin/sleep", "30")],
                  role="slow", title="run /bin/sleep 30"),
        ]
    if kind == OpKind.BROWSER_NAV:
        return [Probe(BrowserNavOp(url=env.server.url("/hello")),
                      [BrowserCapability(hosts=("127.0.0.1",), schemes=("http",),
                                         ports=(env.server.port,))],
                      secrets=(env.secret,), title="open a loopback page")]
    return []


def plugin_probes(executor: object, env: ProbeEnv) -> list[Probe] | None:
    """Probes the executor provides itself; ``None`` when it defines no ``conformance_probes``.

    :raises TypeError: the hook returned something other than ``Probe`` objects.
    """
    hook = getattr(executor, "conformance_probes", None)
    if hook is None:
        return None
    probes = list(hook(env))
    bad = [p for p in probes if not isinstance(p, Probe)]
    if bad:
        raise TypeError(f"conformance_probes returned {type(bad[0]).__name__}, not Probe")
    return probes


# -- the policy the probes run under --------------------------------------------------------


def _q(text: str) -> str:
    return json.dumps(text)  # a DSL string literal: double quotes, backslash escapes


def _qs(items: Iterable[object]) -> str:
    return "[" + ", ".join(_q(str(i)) for i in items) + "]"


def _arg(slot: ArgSlot) -> str:
    alts = []
    for alt in slot.alternatives:
        if alt.literal is not None:
            alts.append(_q(alt.literal))
        else:
            alts.append("/" + (alt.regex or "").replace("/", "\\/") + "/")
    return " | ".join(alts) + (" ..." if slot.repeat else "")


def permit_line(cap: Capability) -> str:
    """The ``permit`` statement of the generated policy that allows exactly ``cap``."""
    if isinstance(cap, FsCapability):
        return f"permit {cap.kind} paths {_qs(cap.paths)}"
    if isinstance(cap, TmpCapability):
        return "permit tmp.use" + (f" max_bytes {cap.max_bytes}B" if cap.max_bytes is not None
                                   else "")
    if isinstance(cap, NetHttpCapability):
        line = f"permit net.http hosts {_qs(cap.hosts)}"
        for name in ("schemes", "methods", "mime"):
            values = getattr(cap, name)
            if values:
                line += f" {name} {_qs(values)}"
        if cap.ports:
            line += " ports [" + ", ".join(str(p) for p in cap.ports) + "]"
        return line
    if isinstance(cap, BrowserCapability):
        line = (f"permit browser.use hosts {_qs(cap.hosts)} scopes ["
                + ", ".join(s.value for s in cap.scopes) + "]")
        if cap.schemes:
            line += f" schemes {_qs(cap.schemes)}"
        if cap.ports:
            line += " ports [" + ", ".join(str(p) for p in cap.ports) + "]"
        return line
    if isinstance(cap, ProcCapability):
        line = f"permit proc.exec tool {_q(cap.tool)}"
        if cap.args is not None:
            line += " args [" + ", ".join(_arg(a) for a in cap.args) + "]"
        return line
    if isinstance(cap, GpuCapability):
        return f"permit sys.gpu class {_q(cap.gpu_class)}"
    raise TypeError(f"no policy form for {type(cap).__name__}")


def policy_text(probes: Iterable[Probe]) -> str:
    """One policy permitting every probe's capabilities (deduplicated, in first-seen order)."""
    lines = ['policy "conformance/kit" version "1.0.0"', ""]
    seen: set[str] = set()
    for probe in probes:
        for cap in probe.caps():
            line = permit_line(cap)
            if line not in seen:
                seen.add(line)
                lines.append(line)
    return "\n".join(lines) + "\n"
