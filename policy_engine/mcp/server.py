"""The MCP server (official `mcp` SDK, low-level API): list_tools ← skills, call_tool ← invoke."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from functools import partial
from typing import Any

import anyio
import anyio.to_thread
import mcp_types as types
from mcp.server import Server
from mcp.server.context import ServerRequestContext

from policy_engine import __version__, tracing
from policy_engine.errors import ErrorCode, PolicyEngineError
from policy_engine.executor import CancelToken
from policy_engine.gateway.call import Gateway
from policy_engine.gateway.skills import invoke_skill
from policy_engine.mcp.ops import OpTool, run_op
from policy_engine.mcp.session_tools import SessionTools, text_of, with_text
from policy_engine.mcp.session_tools import refusal_from_json as _from_json
from policy_engine.refusal import (
    PolicyRefusal,
    Refusal,
    code_refusal,
    engine_refusal,
)
from policy_engine.skills.invoke import InputError, InvokeResult, SkillInvoker
from policy_engine.skills.model import Skill

log = logging.getLogger(__name__)

# (tenant, subject) of the caller of one request; raises PolicyEngineError when there is none
PrincipalOf = Callable[[ServerRequestContext[Any, Any]], tuple[str, str]]


class Unauthenticated(PolicyEngineError):
    """No valid token on an HTTP request (the transport also refuses it with 401)."""

    def __init__(self) -> None:
        super().__init__(ErrorCode.PERMISSION_DENY, "authentication required")


def tool_of(skill: Skill) -> types.Tool:
    hints = skill.annotations()
    return types.Tool(
        name=skill.tool_name, title=str(skill.doc["name"]),
        description=str(skill.doc["description"]), input_schema=skill.inputs_schema,
        output_schema=skill.outputs_schema,
        annotations=types.ToolAnnotations(
            title=str(skill.doc["name"]), read_only_hint=hints["readOnlyHint"],
            destructive_hint=hints["destructiveHint"],
            idempotent_hint=hints["idempotentHint"], open_world_hint=hints["openWorldHint"]),
        meta={"policy-engine/skill": skill.id,
              "policy-engine/side_effects": [str(e) for e in skill.side_effects()]})


def tool_error(refusal: Refusal, *, pointer: str | None = None) -> types.CallToolResult:
    """A refusal as an MCP tool error: ``isError``, the stable code and public message as text
    for any host, and the refusal document (policy_engine/refusal.py) for programs, as
    ``structuredContent.refusal`` and ``_meta["policy-engine/refusal"]``."""
    doc = refusal.to_json()
    error: dict[str, Any] = {"code": refusal.code, "http_status": refusal.http_status,
                             "retryable": refusal.retryable, "message": refusal.message}
    if pointer is not None:
        error["pointer"] = pointer
    if refusal.envelope_id is not None:
        error["envelope_id"] = refusal.envelope_id
    return types.CallToolResult(
        content=[types.TextContent(text=f"{refusal.code}: {refusal.message}")], is_error=True,
        structured_content={"refusal": doc},
        meta={"policy-engine/error": error, "policy-engine/refusal": doc})


def _answer(result: InvokeResult) -> types.CallToolResult:
    if not result.ok:
        refusal = result.refusal or code_refusal(
            result.code or ErrorCode.UNKNOWN_INTERNAL.value, result.http_status,
            result.message or "", "backend", envelope_id=result.envelope_id).to_json()
        return tool_error(_from_json(refusal))
    output = with_text(result.output)
    shown = output["text"] if isinstance(output.get("text"), str) else json.dumps(
        output, ensure_ascii=False)
    return types.CallToolResult(
        content=[types.TextContent(text=shown)],
        structured_content=output, meta={"policy-engine/envelope_id": result.envelope_id})


def op_tool_of(tool: OpTool) -> types.Tool:
    hints = tool.annotations()
    return types.Tool(
        name=tool.name, title=tool.manifest.name,
        description=(tool.manifest.description or f"the ops of tool `{tool.manifest.name}`")
        + " (one guarded op: " + ", ".join(str(k) for k in tool.kinds()) + ")",
        input_schema=tool.input_schema(),
        annotations=types.ToolAnnotations(
            title=tool.manifest.name, read_only_hint=hints["readOnlyHint"],
            destructive_hint=hints["destructiveHint"],
            idempotent_hint=hints["idempotentHint"], open_world_hint=hints["openWorldHint"]),
        meta={"policy-engine/manifest": tool.manifest.name,
              "policy-engine/side_effects": [str(e) for e in tool.manifest.side_effects]})


def _refused(exc: InputError | PolicyEngineError) -> types.CallToolResult:
    """A call refused before or by the gateway, as a tool error."""
    if isinstance(exc, InputError):
        return tool_error(Refusal(ErrorCode.SCHEMA_VALIDATION_FAILED.value, 422, False,
                                  exc.public_message(), "service",
                                  envelope_id=exc.envelope_id, location=exc.pointer or "/"),
                          pointer=exc.pointer)
    if isinstance(exc, PolicyRefusal):
        return tool_error(exc.refusal)
    return tool_error(engine_refusal(exc, "manifest"))  # refused before an op (its image)


async def _session_call(ctx: ServerRequestContext[Any, Any],
                        params: types.CallToolRequestParams, sessions: SessionTools,
                        tenant: str, subject: str) -> types.CallToolResult:
    """A ``session.*`` tool: stdout/stderr as progress notifications when the caller sent a
    progressToken; a ``notifications/cancelled`` cancels the running exec (session_tools)."""

    async def report(progress: float, message: str) -> None:
        await ctx.session.report_progress(progress, None, message)

    try:
        with tracing.remote_parent(_trace_carrier(ctx, params)), tracing.span(
                "mcp tools/call", {"mcp.tool": params.name, "policy_engine.tenant": tenant}):
            output = await sessions.call(params.name, params.arguments or {}, tenant=tenant,
                                         subject=subject, report=report)
    except (InputError, PolicyEngineError) as exc:
        return _refused(exc)
    return types.CallToolResult(content=[types.TextContent(text=text_of(params.name, output))],
                                structured_content=output)


def _trace_carrier(ctx: Any, params: types.CallToolRequestParams) -> dict[str, Any]:
    meta = dict(params.meta or {})
    if "traceparent" in meta:
        return meta
    scope = getattr(getattr(ctx, "request", None), "scope", None)  # None on stdio
    headers = scope.get("headers", ()) if isinstance(scope, dict) else ()
    return {k.decode("latin-1"): v.decode("latin-1") for k, v in headers
            if k in (b"traceparent", b"tracestate")}


def build_server(invoker: SkillInvoker, principal_of: PrincipalOf,
                 op_tools: tuple[OpTool, ...] = (), gateway: Gateway | None = None,
                 sessions: SessionTools | None = None) -> Server[Any]:
    """An MCP server offering ``invoker``'s skills as tools named ``skill.<id>``, each
    operator manifest of ``op_tools`` as ``op.<name>`` and, given ``sessions``, the session
    tools ``session.*``; every call run through ``gateway`` (default: one over ``invoker``'s
    orchestrator asking nobody, ``--confirm deny``)."""
    gate = gateway or Gateway(invoker.orch)
    by_tool = {s.tool_name: s for s in invoker.skills.values()}
    by_op = {t.name: t for t in op_tools}
    listed = [tool_of(s) for s in by_tool.values()] + [op_tool_of(t) for t in op_tools]
    if sessions is not None:
        listed += sessions.tools()

    async def list_tools(ctx: ServerRequestContext[Any, Any],
                         params: types.PaginatedRequestParams | None) -> types.ListToolsResult:
        principal_of(ctx)  # listing needs the same identity as calling
        return types.ListToolsResult(tools=listed)

    async def call_tool(ctx: ServerRequestContext[Any, Any],
                        params: types.CallToolRequestParams) -> types.CallToolResult:
        try:
            tenant, subject = principal_of(ctx)
        except Unauthenticated:  # the token was revoked after the transport let it in
            return tool_error(code_refusal("AUTH.UNAUTHENTICATED", 401, "authentication "
                                           "required: the token is not valid", "service"))
        skill, op_tool = by_tool.get(params.name), by_op.get(params.name)
        if sessions is not None and sessions.handles(params.name):
            return await _session_call(ctx, params, sessions, tenant, subject)
        cancel = CancelToken()
        run: Callable[[], InvokeResult]
        if skill is not None:
            run = partial(invoke_skill, gate, invoker, skill, params.arguments or {},
                          tenant=tenant, subject=subject, cancel=cancel)
        elif op_tool is not None:
            run = partial(run_op, op_tool, params.arguments or {}, gateway=gate,
                          fs_root=invoker.fs_root, tenant=tenant, subject=subject,
                          cancel=cancel)
        else:
            return tool_error(code_refusal("SERVICE.NOT_FOUND", 404,
                                           f"not found: no tool `{params.name}`", "service"))
        try:
            # a worker thread: the sandbox blocks; on cancellation the thread is abandoned
            # and the token stops the executor, whose end evidence records the cancel
            # the caller's W3C traceparent: in `_meta`, or the HTTP request's header
            with tracing.remote_parent(_trace_carrier(ctx, params)), tracing.span(
                    "mcp tools/call", {"mcp.tool": params.name,
                                       "policy_engine.tenant": tenant}):
                result = await anyio.to_thread.run_sync(run, abandon_on_cancel=True)
        except anyio.get_cancelled_exc_class():
            cancel.cancel("cancelled by the MCP client")
            raise
        except (InputError, PolicyEngineError) as exc:
            return _refused(exc)
        return _answer(result)

    return Server("policy-engine", version=__version__, title="policy-engine skills",
                  instructions="Guarded tools: every call is decided by policy and leaves "
                  "evidence; a refusal is a tool error carrying a stable code.",
                  on_list_tools=list_tools, on_call_tool=call_tool)
