"""The guarded built-in ops as MCP tools: one tool `op.<manifest>` per operator tool manifest,
taking an op of a kind that manifest declares, run through the gateway as `POST /v1/ops` is."""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass
from typing import Any

from pydantic import TypeAdapter, ValidationError

from policy_engine.executor import CancelToken
from policy_engine.gateway.call import Call, Gateway
from policy_engine.model import OP_CAPABILITY, ExecOp, Grant, Manifest, OpKind, Settings
from policy_engine.skills.invoke import (
    InputError,
    InvokeResult,
    refuse_input,
    validate_against,
)
from policy_engine.skills.jsonpos import escape
from policy_engine.skills.model import hints

_GRANT_TTL_MS = 15 * 60 * 1000
_OPS: TypeAdapter[Any] = TypeAdapter(ExecOp)
_OP_MODELS = {  # the $defs names pydantic gives the op variants
    OpKind.FS_READ: "FsReadOp", OpKind.FS_WRITE: "FsWriteOp", OpKind.FS_LIST: "FsListOp",
    OpKind.NET_HTTP: "NetHttpOp", OpKind.BROWSER_NAV: "BrowserNavOp",
    OpKind.BROWSER_SCREENSHOT: "BrowserScreenshotOp", OpKind.PROC_EXEC: "ProcExecOp",
    OpKind.TMP_ALLOC: "TmpAllocOp"}


@dataclass(frozen=True, slots=True)
class OpTool:
    """One operator manifest offered as a tool; the grant is the manifest's permissions."""

    manifest: Manifest

    @property
    def name(self) -> str:
        return f"op.{self.manifest.name}"

    def kinds(self) -> list[OpKind]:
        declared = {str(cap.kind) for cap in self.manifest.permissions}
        return [k for k in OpKind if str(OP_CAPABILITY[k]) in declared]

    def input_schema(self) -> dict[str, Any]:
        """``{"op": <one of the op kinds the manifest declares>}`` (JSON Schema 2020-12)."""
        full = _OPS.json_schema()
        defs: dict[str, Any] = {}
        for kind in self.kinds():
            model = dict(full["$defs"][_OP_MODELS[kind]])
            model["required"] = ["kind", *model.get("required", [])]  # the tag picks the op
            defs[_OP_MODELS[kind]] = model
        return {"type": "object", "additionalProperties": False, "required": ["op"],
                "properties": {"op": {"oneOf": [{"$ref": f"#/$defs/{n}"} for n in defs]}},
                "$defs": defs}

    def schema_for(self, arguments: Any) -> dict[str, Any]:
        """The input schema narrowed to the op ``arguments`` name by its ``kind``, so a
        problem is reported inside that op (``/op/path``), not as "matches no op"."""
        schema = self.input_schema()
        op = arguments.get("op") if isinstance(arguments, dict) else None
        kind = op.get("kind") if isinstance(op, dict) else None
        name = _OP_MODELS[OpKind(kind)] if isinstance(kind, str) and kind in {
            str(k) for k in OpKind} else None
        if name is not None and name in schema["$defs"]:
            schema["properties"]["op"] = {"$ref": f"#/$defs/{name}"}
        elif isinstance(op, dict):
            schema["properties"]["op"] = {"type": "object", "required": ["kind"], "properties": {
                "kind": {"enum": [str(k) for k in self.kinds()]}}}
        return schema

    def annotations(self) -> dict[str, bool]:
        return hints(tuple(self.manifest.side_effects))


def run_op(tool: OpTool, arguments: dict[str, Any], *, gateway: Gateway, fs_root: str,
           tenant: str, subject: str, cancel: CancelToken | None = None) -> InvokeResult:
    """Check the arguments, then run the op through the gateway (consent, evidence).

    :raises InputError: the arguments are not an op this tool takes (nothing ran).
    """
    try:
        validate_against(tool.schema_for(arguments), arguments)
        try:
            op = _OPS.validate_python(arguments["op"])
        except ValidationError as exc:  # what the schema cannot say
            first = exc.errors()[0]
            pointer = "/op" + "".join(f"/{escape(str(p))}" for p in first["loc"][1:])
            raise InputError(pointer, str(first["msg"])[:200]) from None
    except InputError as exc:
        exc.envelope_id = refuse_input(gateway.orch, exc, tenant=tenant, subject=subject,
                                       tool_name=tool.manifest.name, arguments=arguments)
        raise
    now = int(time.time() * 1000)
    grant = Grant(tenant=tenant, subject_id=subject, tool_name=tool.manifest.name,
                  call_id=f"{tool.name}-{uuid.uuid4().hex}", expires_at=now + _GRANT_TTL_MS,
                  capabilities=tool.manifest.permissions)
    called = gateway.run(Call(grant, tool.manifest, op, settings=Settings(root_fs=fs_root),
                              identity=(tenant, subject), cancel=cancel))
    res, refusal = called.outcome.result, called.refusal
    if refusal is None:
        return InvokeResult(tool.name, True, dict(res.out), None, 200, None,
                            called.envelope_id)
    return InvokeResult(tool.name, False, {}, refusal.code, refusal.http_status,
                        refusal.message, called.envelope_id, refusal.to_json())
