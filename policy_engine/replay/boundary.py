"""Boundary requests for `policy-engine diff`: a witness inside and just outside each rule's edge.

For every rule of either version: each path glob (a concrete path it matches, a sibling of its
literal directory, a name one character longer), each host (itself, the bare parent of a
wildcard, a look-alike), each port (it and the next), each argv template (its literals, the last
one altered, one extra argument), each size limit (the limit and one more). Each witness gets a
grant and manifest naming exactly its resource, so only the policy decides it.
"""

from __future__ import annotations

import ipaddress
import json
import re
from collections.abc import Iterator
from functools import partial

from policy_engine.explain import explain
from policy_engine.explain.request import ExplainRequest
from policy_engine.graph.policyset import CompiledRule, PolicySet
from policy_engine.model import (
    BrowserCapability,
    BrowserNavOp,
    Capability,
    Consent,
    Decision,
    ExecOp,
    FsCapability,
    FsListOp,
    FsReadOp,
    FsWriteOp,
    Grant,
    Manifest,
    NetHttpCapability,
    NetHttpOp,
    ProcCapability,
    ProcExecOp,
    TmpAllocOp,
    TmpCapability,
)
from policy_engine.replay.diff import Decider, Probe

NOW = 1_800_000_000_000
_FAR = 4_000_000_000_000
_WILD = re.compile(r"[*?\[{]")


def concrete_path(glob: str, home: str) -> str:
    """A path the glob matches: ``**`` → ``a/b``, ``*``/``?``/classes → ``x``, braces → first."""
    g = home + glob[1:] if glob.startswith("~") else glob
    g = re.sub(r"\{([^,}]*)[^}]*\}", r"\1", g)
    g = re.sub(r"\[[^\]]*\]", "x", g)
    g = g.replace("**", "a/b").replace("*", "x").replace("?", "x")
    g = g if g.startswith("/") else "/" + g
    return re.sub(r"/+", "/", g)


def path_witnesses(glob: str, home: str) -> list[str]:
    inside = concrete_path(glob, home)
    out = [inside, inside + "x"]
    wild = _WILD.search(glob)
    prefix = (home + glob[1:] if glob.startswith("~") else glob)[:wild.start()] if wild else glob
    directory = prefix.rstrip("/")
    if directory:
        out.append(directory + "-outside/x")
    return out


def host_witnesses(host: str) -> list[str]:
    try:  # an address or CIDR block: its first address and the one just past its end
        net = ipaddress.ip_network(host.strip("[]"), strict=False)
    except ValueError:
        net = None
    if net is not None:
        past = net.broadcast_address + 1 if int(net.broadcast_address) < (
            2 ** net.max_prefixlen - 1) else net.network_address - 1
        return [_url_host(net.network_address), _url_host(past)]
    inside = host.replace("*.", "a.").replace("*", "a")
    out = [inside, "x" + inside]
    if host.startswith("*."):
        out.append(host[2:])  # the bare parent: outside `*.example.com`
    return out


def _url_host(addr: ipaddress.IPv4Address | ipaddress.IPv6Address) -> str:
    return f"[{addr}]" if addr.version == 6 else str(addr)


def _fs_ops(kind: str, cap: FsCapability, rule: CompiledRule, home: str) -> Iterator[ExecOp]:
    for glob in cap.paths:
        for path in path_witnesses(glob, home):
            if kind == "fs.read":
                yield FsReadOp(path=path)
                limit = rule.limits.max_bytes_in if rule.limits else None
                if limit is not None:
                    yield FsReadOp(path=path, len=limit)
                    yield FsReadOp(path=path, len=limit + 1)
            elif kind == "fs.write":
                yield FsWriteOp(path=path, bytes_b64="")
            else:
                yield FsListOp(path=path)


def _net_ops(cap: NetHttpCapability) -> Iterator[ExecOp]:
    scheme = cap.schemes[0] if cap.schemes else "https"
    ports: list[int | None] = [p2 for p in cap.ports for p2 in (p, p + 1)] or [None]
    methods = list(cap.methods[:1]) or ["GET"]
    if cap.methods and "DELETE" not in cap.methods:
        methods.append("DELETE")
    for host in cap.hosts:
        for h in host_witnesses(host):
            for port in ports:
                netloc = f"{h}:{port}" if port is not None else h
                for method in methods:
                    yield NetHttpOp(method=method, url=f"{scheme}://{netloc}/")


def _proc_ops(cap: ProcCapability) -> Iterator[ProcExecOp]:
    if cap.args is None:
        yield ProcExecOp(tool=cap.tool)
        yield ProcExecOp(tool=cap.tool, args=("--boundary",))
        return
    fixed = [s for s in cap.args if not s.repeat]
    base = [s.alternatives[0].literal if s.alternatives[0].literal is not None else "x"
            for s in fixed]
    variants = [tuple(base)]
    for i, slot in enumerate(fixed):  # every literal of every slot, the others at their first
        variants += [(*base[:i], alt.literal, *base[i + 1:]) for alt in slot.alternatives[1:]
                     if alt.literal is not None]
    for args in variants:
        yield ProcExecOp(tool=cap.tool, args=args)
    yield ProcExecOp(tool=cap.tool, args=(*base, "--boundary"))
    if base:
        yield ProcExecOp(tool=cap.tool, args=(*base[:-1], base[-1] + "-x"))


def rule_ops(rule: CompiledRule, home: str) -> Iterator[ExecOp]:
    for kind, cap in rule.capabilities.items():
        if isinstance(cap, FsCapability):
            yield from _fs_ops(str(kind), cap, rule, home)
        elif isinstance(cap, NetHttpCapability):
            yield from _net_ops(cap)
        elif isinstance(cap, BrowserCapability):
            for host in cap.hosts:
                for h in host_witnesses(host):
                    yield BrowserNavOp(url=f"https://{h}/", extract="none")
        elif isinstance(cap, ProcCapability):
            yield from _proc_ops(cap)
            timeout = rule.limits.timeout_ms if rule.limits else None
            if timeout is not None:  # the rule's timeout and one millisecond more
                args = next(iter(_proc_ops(cap))).args  # arguments the template admits
                yield ProcExecOp(tool=cap.tool, args=args, timeout_ms=timeout)
                yield ProcExecOp(tool=cap.tool, args=args, timeout_ms=timeout + 1)
        elif isinstance(cap, TmpCapability):
            yield TmpAllocOp(size_bytes=1)
            if cap.max_bytes is not None:
                yield TmpAllocOp(size_bytes=cap.max_bytes)
                yield TmpAllocOp(size_bytes=cap.max_bytes + 1)


def exact_capability(op: ExecOp) -> Capability:
    """A grant/manifest capability naming exactly this op's resource."""
    if isinstance(op, FsReadOp | FsWriteOp | FsListOp):
        return FsCapability(kind=op.kind, paths=(op.path,))
    if isinstance(op, NetHttpOp | BrowserNavOp):
        from urllib.parse import urlsplit

        u = urlsplit(op.url)
        host = u.hostname or ""
        if isinstance(op, BrowserNavOp):
            return BrowserCapability(hosts=(host,))
        return NetHttpCapability(hosts=(host,), ports=(u.port,) if u.port else ())
    if isinstance(op, ProcExecOp):
        return ProcCapability(tool=op.tool)
    return TmpCapability()


def _decide(ps: PolicySet, *, manifest: Manifest, grant: Grant,
            request: ExplainRequest) -> Decision:
    return explain(ps, manifest, grant, request).decision


def _decider(op: ExecOp) -> Decider:
    cap = exact_capability(op)
    grant = Grant(tenant="boundary", subject_id="boundary", tool_name="boundary",
                  call_id="boundary", capabilities=(cap,), expires_at=_FAR,
                  consent=Consent(granted_by="boundary", granted_at=0, expires_at=_FAR))
    manifest = Manifest(name="boundary", version="1", permissions=(cap,))
    request = ExplainRequest(op=op, now_ms=NOW)
    return partial(_decide, manifest=manifest, grant=grant, request=request)


def boundary_probes(old: PolicySet, new: PolicySet) -> list[Probe]:
    """One probe per distinct witness op over the rules of both versions."""
    seen: set[str] = set()
    probes: list[Probe] = []
    for ps in (old, new):
        for rule in ps.rules:
            for op in rule_ops(rule, ps.home):
                key = json.dumps(op.model_dump(mode="json"), sort_keys=True)
                if key in seen:
                    continue
                seen.add(key)
                from policy_engine.evidence import capability_string

                label = f"boundary of `{rule.id}`: {capability_string(op)}"
                if isinstance(op, ProcExecOp):
                    label += " " + " ".join(op.args)
                    if op.timeout_ms is not None:
                        label += f" (timeout {op.timeout_ms} ms)"
                elif isinstance(op, FsReadOp) and op.len is not None:
                    label += f" (len {op.len})"
                try:
                    decider = _decider(op)
                except ValueError:  # a witness no grant can name (e.g. an odd host): skip it
                    continue
                probes.append(Probe(label, capability_string(op), decider))
    return probes
