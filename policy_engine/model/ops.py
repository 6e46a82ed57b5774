"""Concrete operations a tool call asks to perform; a tagged union on ``kind``."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, model_validator

from policy_engine.model.text import reject_lone_surrogates


class _Op(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    @model_validator(mode="before")
    @classmethod
    def _unicode_only(cls, data: Any, info: ValidationInfo) -> Any:
        return reject_lone_surrogates(data, info)


class FsReadOp(_Op):
    kind: Literal["fs.read"] = "fs.read"
    path: str
    offset: int | None = Field(default=None, ge=0)
    len: int | None = Field(default=None, ge=0)


class FsWriteOp(_Op):
    kind: Literal["fs.write"] = "fs.write"
    path: str
    bytes_b64: str = ""
    overwrite: bool = False


class FsListOp(_Op):
    kind: Literal["fs.list"] = "fs.list"
    path: str
    depth: int = Field(default=1, ge=0)


class NetHttpOp(_Op):
    kind: Literal["net.http"] = "net.http"
    method: str = "GET"
    url: str
    headers: dict[str, str] = Field(default_factory=dict)
    body_b64: str | None = None


class BrowserNavOp(_Op):
    kind: Literal["browser.nav"] = "browser.nav"
    url: str
    extract: Literal["text", "links", "none"] = "text"


class BrowserScreenshotOp(_Op):
    kind: Literal["browser.screenshot"] = "browser.screenshot"
    url: str | None = None
    selector: str | None = None
    full_page: bool = False
    width: int = Field(default=1280, ge=1)
    height: int = Field(default=720, ge=1)


class ProcExecOp(_Op):
    kind: Literal["proc.exec"] = "proc.exec"
    tool: str
    args: tuple[str, ...] = ()
    timeout_ms: int | None = Field(default=None, ge=1)
    cwd: str | None = None
    env: dict[str, str] = Field(default_factory=dict)
    stdin_b64: str | None = None


class TmpAllocOp(_Op):
    kind: Literal["tmp.alloc"] = "tmp.alloc"
    size_bytes: int = Field(ge=0)


ExecOp = Annotated[
    FsReadOp | FsWriteOp | FsListOp | NetHttpOp | BrowserNavOp | BrowserScreenshotOp | ProcExecOp
    | TmpAllocOp,
    Field(discriminator="kind"),
]
