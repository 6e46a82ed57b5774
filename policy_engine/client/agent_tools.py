"""The calls an agent framework's tools make in one session, framework-free: the LangChain and
OpenAI Agents adapters (client/langchain_tools.py, client/openai_agents_tools.py) wrap these."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from policy_engine.client.http import Client
from policy_engine.refusal import PolicyRefusal, Refusal

# `raise`: a refusal raises PolicyRefusal (the one refusal shape) out of the tool call;
# `tell_model`: the tool answers the refusal's code and message as its text instead
OnRefusal = Literal["raise", "tell_model"]

RUN_CODE = ("Run python (default) or shell code in the sandboxed session workspace and get its "
            "stdout, stderr and exit code. Python variables are kept between calls. Every call "
            "is decided by policy and recorded.")
READ_FILE = ("Read a file of the session workspace (path relative to it): its text, or a "
             "note with its size when it is not UTF-8.")
WRITE_FILE = "Write a UTF-8 text file in the session workspace (path relative to it)."


@dataclass(frozen=True, slots=True)
class SessionCalls:
    """One session's run_code and files for a model, each call one guarded op of the service.

    :param max_chars: the most text one answer gives the model (the rest is cut, said so).
    """

    client: Client
    session_id: str
    timeout_s: float = 30.0
    stateful: bool = True
    on_refusal: OnRefusal = "raise"
    max_chars: int = 100_000

    def run_code(self, code: str, language: str = "python") -> str:
        """:raises PolicyRefusal: the call was refused or never ran to its end (policy, risk,
        timeout, cancel); a program that ran and failed answers its output and exit code."""
        try:
            res = self.client.run_code(self.session_id, code, language,
                                       timeout_s=self.timeout_s,
                                       stateful=self.stateful and language == "python")
        except PolicyRefusal as refused:
            return self._refused(refused.refusal)
        if res.exit_code is None and res.refusal is not None:
            return self._refused(res.refusal)
        parts = [res.stdout]
        if res.stderr:
            parts.append(f"[stderr]\n{res.stderr}")
        parts.append(f"[exit code {res.exit_code}]")
        return self._cut("\n".join(p for p in parts if p))

    def read_file(self, path: str) -> str:
        """:raises PolicyRefusal: a missing file (404), a bad path (422), a policy deny."""
        try:
            data = self.client.download(self.session_id, path)
        except PolicyRefusal as refused:
            return self._refused(refused.refusal)
        try:
            return self._cut(data.decode("utf-8"))
        except UnicodeDecodeError:
            return f"[{path}: {len(data)} bytes, not UTF-8 text]"

    def write_file(self, path: str, content: str) -> str:
        try:
            done = self.client.upload(self.session_id, path, content.encode("utf-8"))
        except PolicyRefusal as refused:
            return self._refused(refused.refusal)
        return f"wrote {done.size} bytes to {done.path}"

    def _refused(self, refusal: Refusal) -> str:
        if self.on_refusal == "raise":
            raise PolicyRefusal(refusal)
        return f"refused: {refusal.code}: {refusal.message}"

    def _cut(self, text: str) -> str:
        if len(text) <= self.max_chars:
            return text
        return text[:self.max_chars] + f"\n[… cut: {len(text)} characters in all]"
