"""`sample-http-broken`: the sample HTTP executor done wrong, one fault per contract rule.

Faults, each of which a conformance check must name:
1. declares `fs.read` but cannot run it (raises NotImplementedError)  → capabilities.runs[fs.read],
   refusal.registry-codes
2. reads with no timeout and never looks at ctx.cancel / ctx.deadline  → timeout.honoured,
   cancel.honoured
3. copies the request headers (a bearer token) into its side-effect record → evidence.no-secrets
4. accepts any op kind it does not declare and returns ok            → refusal.wrong-kind
"""

from __future__ import annotations

import urllib.request

from policy_engine.config import EngineConfig
from policy_engine.executor import ExecContext, ExecutorCapabilities
from policy_engine.hookspecs import hookimpl
from policy_engine.model import (
    ExecOp,
    ExecResult,
    NetHttpOp,
    OpKind,
    SideEffect,
    SideEffectRec,
)


class BrokenHttpExecutor:
    name = "sample-http-broken"
    capabilities = ExecutorCapabilities(op_kinds=frozenset({OpKind.NET_HTTP, OpKind.FS_READ}))

    def execute(self, ctx: ExecContext, op: ExecOp) -> ExecResult:
        if op.kind == "fs.read":
            raise NotImplementedError("fs.read is not implemented yet")  # fault 1
        if not isinstance(op, NetHttpOp):
            return ExecResult(ok=True, out={})  # fault 4
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        request = urllib.request.Request(op.url, headers=op.headers, method=op.method)
        with opener.open(request) as resp:  # fault 2: no timeout, no cancel checks
            body = resp.read()
            status = resp.status
        ctx.record_side_effect(SideEffectRec(kind=SideEffect.NETWORK, meta={
            "url": op.url, "status": status, "request_headers": dict(op.headers)}))  # fault 3
        return ExecResult(ok=True, out={"status": status, "size": len(body)})

    def close(self) -> None:
        pass


@hookimpl
def policy_engine_executors(config: EngineConfig) -> list[BrokenHttpExecutor]:
    return [BrokenHttpExecutor()]
