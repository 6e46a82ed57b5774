"""LangChain tools over one session of the service (extra `langchain`): run_code, read_file and
write_file, each a guarded call through ``policy_engine.client`` (docs/sessions.md)."""

from __future__ import annotations

from typing import Literal

from langchain_core.tools import BaseTool, StructuredTool
from pydantic import BaseModel, Field

from policy_engine.client.agent_tools import (
    READ_FILE,
    RUN_CODE,
    WRITE_FILE,
    OnRefusal,
    SessionCalls,
)
from policy_engine.client.http import Client


class RunCodeInput(BaseModel):
    code: str = Field(description="the code to run")
    language: Literal["python", "shell"] = Field(default="python")


class ReadFileInput(BaseModel):
    path: str = Field(description="relative to the session workspace")


class WriteFileInput(BaseModel):
    path: str = Field(description="relative to the session workspace")
    content: str = Field(description="the file's text")


def langchain_tools(client: Client, session_id: str, *, timeout_s: float = 30.0,
                    stateful: bool = True, on_refusal: OnRefusal = "raise") -> list[BaseTool]:
    """``run_code``, ``read_file`` and ``write_file`` in ``session_id``.

    A refusal raises :class:`~policy_engine.refusal.PolicyRefusal` out of ``invoke`` (not a
    ``ToolException``: the agent loop sees the one refusal shape), or with
    ``on_refusal="tell_model"`` comes back as the tool's text.
    """
    calls = SessionCalls(client, session_id, timeout_s=timeout_s, stateful=stateful,
                         on_refusal=on_refusal)
    return [
        StructuredTool.from_function(calls.run_code, name="run_code", description=RUN_CODE,
                                     args_schema=RunCodeInput),
        StructuredTool.from_function(calls.read_file, name="read_file",
                                     description=READ_FILE, args_schema=ReadFileInput),
        StructuredTool.from_function(calls.write_file, name="write_file",
                                     description=WRITE_FILE, args_schema=WriteFileInput),
    ]
