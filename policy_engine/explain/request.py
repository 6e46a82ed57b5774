"""The request document `explain` and `run` read: one operation plus its call context."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from policy_engine.model import ExecOp, Overrides, Settings


class Expectation(BaseModel):
    """What an example request expects; `examples/` tests compare it with the real decision."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    decision: Literal["allow", "deny"]
    code: str | None = None
    rule: str | None = Field(default=None, description="id of the deciding rule, if any")


class ExplainRequest(BaseModel):
    """A request file: the op, optional overrides/settings, CEL context and fixture paths.

    ``manifest`` and ``grant`` are paths relative to the request file, used when the command
    line does not name them.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    description: str = ""
    op: ExecOp
    now_ms: int | None = Field(default=None, description="decision time, ms since epoch")
    overrides: Overrides | None = None
    settings: Settings | None = None
    context: dict[str, Any] = Field(
        default_factory=dict, description="extra CEL variables: tenant, subject"
    )
    manifest: str | None = None
    grant: str | None = None
    expect: Expectation | None = None
