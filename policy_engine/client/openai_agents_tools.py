"""OpenAI Agents SDK function tools over one session of the service (extra `openai-agents`):
run_code, read_file and write_file, each a guarded call through ``policy_engine.client``."""

from __future__ import annotations

from typing import Literal

from agents import FunctionTool, function_tool

from policy_engine.client.agent_tools import (
    READ_FILE,
    RUN_CODE,
    WRITE_FILE,
    OnRefusal,
    SessionCalls,
)
from policy_engine.client.http import Client


def openai_agents_tools(client: Client, session_id: str, *, timeout_s: float = 30.0,
                        stateful: bool = True, on_refusal: OnRefusal = "raise"
                        ) -> list[FunctionTool]:
    """``run_code``, ``read_file`` and ``write_file`` in ``session_id`` (the SDK runs these
    synchronous calls on a worker thread).

    A refusal raises :class:`~policy_engine.refusal.PolicyRefusal` out of the tool (the SDK's
    default error-to-text handler is off: the run sees the one refusal shape), or with
    ``on_refusal="tell_model"`` comes back as the tool's text.
    """
    calls = SessionCalls(client, session_id, timeout_s=timeout_s, stateful=stateful,
                         on_refusal=on_refusal)

    def run_code(code: str, language: Literal["python", "shell"] = "python") -> str:
        """Run code in the session.

        Args:
            code: the code to run
            language: python or shell
        """
        return calls.run_code(code, language)

    def read_file(path: str) -> str:
        """Read a file of the session.

        Args:
            path: relative to the session workspace
        """
        return calls.read_file(path)

    def write_file(path: str, content: str) -> str:
        """Write a text file in the session.

        Args:
            path: relative to the session workspace
            content: the file's text
        """
        return calls.write_file(path, content)

    return [function_tool(fn, description_override=text, failure_error_function=None)
            for fn, text in ((run_code, RUN_CODE), (read_file, READ_FILE),
                             (write_file, WRITE_FILE))]
