"""The request document `explain` and `run` read: one operation plus its call context."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from policy_engine.compiler.loaders import load_document, refuse_session, validate_document
from policy_engine.errors import Diagnostic, DiagnosticsError, Span
from policy_engine.inputs.inputfile import DOCUMENT_SUFFIXES, named_like
from policy_engine.model import ExecOp, Overrides, Settings, Usage


class Expectation(BaseModel):
    """What an example request expects; `examples/` tests compare it with the real decision."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    decision: Literal["allow", "deny"]
    code: str | None = None
    rule: str | None = Field(default=None, description="id of the deciding rule, if any")


class CallRequest(BaseModel):
    """What one dry-run decision needs besides the policy: the op and its call context.

    Shared by request files (:class:`ExplainRequest`) and policy-test cases, so both accept the
    same fields with the same meaning.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    op: ExecOp
    now_ms: int | None = Field(default=None, description="decision time, ms since epoch")
    overrides: Overrides | None = None
    settings: Settings | None = None
    context: dict[str, Any] = Field(
        default_factory=dict, description="extra CEL variables: tenant, subject"
    )
    budget_used: Usage | None = Field(
        default=None, description="what the grant already consumed; a dry run consumes nothing",
    )
    manifest: str | None = None
    grant: str | None = None
    facts: dict[str, Any] | None = Field(
        default=None, description="declared file facts (path: kind or {kind, size, target}): "
        "what a dry run without `--config` and `policy-engine test` decide on; a run, and "
        "`explain --config`, decide on the executor's view and say where they differ",
    )

    @field_validator("facts")
    @classmethod
    def _well_formed_facts(cls, value: dict[str, Any] | None) -> dict[str, Any] | None:
        if value is not None:
            from policy_engine.guard.facts import parse_declared

            parse_declared(value)  # ValueError: located by the loader
        return value

    @field_validator("manifest", "grant")
    @classmethod
    def _a_usable_path(cls, value: str | None) -> str | None:
        # the OS cannot open it; said here, the diagnostic points at the field
        if value is not None and "\x00" in value:
            raise ValueError("the path contains a NUL byte")
        return value


class ExplainRequest(CallRequest):
    """A request file: the op, optional overrides/settings, CEL context and fixture paths.

    ``manifest`` and ``grant`` are paths relative to the request file, used when the command
    line does not name them.
    """

    description: str = ""
    expect: Expectation | None = None


def load_request(path: str | os.PathLike[str]) -> ExplainRequest:
    """Load a request file (JSON or YAML); malformed ones raise DiagnosticsError (SBP105)."""
    data, lookup = load_document(path)
    refuse_session(data, lookup, "settings", "session")  # the engine's own, never a file's
    return validate_document(ExplainRequest, data, lookup, "request")


def resolve_fixture(request_path: Path, relative: str | None, what: str) -> Path:
    """The manifest or grant a request names, relative to the request file.

    :raises DiagnosticsError: when neither the command line nor the request names one.
    """
    if relative is None:
        raise DiagnosticsError([Diagnostic.make(
            "SBP105", f"no {what} given: pass `--{what} FILE` or set `{what}` in the request",
            Span(os.fspath(request_path), 1, 1),
            help=f"`{what}` in a request file is a path relative to that file",
        )])
    path = request_path.parent / relative
    kinds = DOCUMENT_SUFFIXES + ((".sbpolicy",) if what == "manifest" else ())
    if not named_like(path, kinds):  # checked before it is opened: never quoted in an error
        raise DiagnosticsError([Diagnostic.make(
            "SBP105", f"the request's `{what}` names `{relative}`, which is not a "
            f"{'/'.join(kinds)} file (by its name or its link target's); it was not read",
            Span(os.fspath(request_path), 1, 1),
            help=f"name a JSON/YAML {what} file, or pass one with `--{what} FILE`",
        )])
    return path
