"""Capability variants: what a grant gives, a manifest declares, a policy permits or forbids.

Each variant is a pydantic model tagged on ``kind``. A capability names a domain and the resources
it covers; an empty resource list on a field means "no constraint from this source" only where the
field's docstring says so (ports, methods, MIME types); path and host lists are never implicitly
unbounded.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

from policy_engine.model.enums import BrowserScope


def _is_none(value: object) -> bool:
    return value is None


class _Cap(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class FsCapability(_Cap):
    """File-system access under path globs (``/workspace/**``, ``~/.ssh/**``, ``**/.env``)."""

    kind: Literal["fs.read", "fs.write", "fs.list"]
    paths: tuple[str, ...] = Field(min_length=1)


class NetHttpCapability(_Cap):
    """Outbound HTTP. Hosts are exact names, ``*.suffix``, IP literals or CIDR blocks.

    ``ports``, ``schemes``, ``methods`` and ``mime`` left empty mean: ports default to the scheme's
    default port, schemes to ``https``, methods to ``GET``/``HEAD``, MIME types unconstrained.
    """

    kind: Literal["net.http"] = "net.http"
    hosts: tuple[str, ...] = Field(min_length=1)
    ports: tuple[int, ...] = ()
    schemes: tuple[str, ...] = ()
    methods: tuple[str, ...] = ()
    mime: tuple[str, ...] = ()


class BrowserCapability(_Cap):
    """Read-only headless browsing of the given hosts (same host syntax as ``net.http``)."""

    kind: Literal["browser.use"] = "browser.use"
    scopes: tuple[BrowserScope, ...] = (BrowserScope.OPEN, BrowserScope.EXTRACT)
    hosts: tuple[str, ...] = Field(min_length=1)
    schemes: tuple[str, ...] = ()
    ports: tuple[int, ...] = ()


class ArgAlternative(_Cap):
    """One allowed form of an argument: an exact literal or an anchored regular expression."""

    literal: str | None = None
    regex: str | None = None


class ArgSlot(_Cap):
    """One argv position: any of ``alternatives``; ``repeat`` lets it match zero or more args."""

    alternatives: tuple[ArgAlternative, ...] = Field(min_length=1)
    repeat: bool = False


class ProcCapability(_Cap):
    """A whitelisted executable (never a shell string), its argument template and the
    environment variables a call may set.

    ``args`` is ``None`` when no template constrains the arguments of this source; the meet with a
    source that has a template keeps the template. An empty tuple means "no arguments at all".
    ``env`` is the allow-list of variable names (a literal is an exact name, a regex is searched
    in the name); ``None`` when this source does not constrain the environment. A policy rule
    without ``env`` lets a call set no variable at all (``policy_engine.guard.env``).
    """

    kind: Literal["proc.exec"] = "proc.exec"
    tool: str = Field(min_length=1)
    args: tuple[ArgSlot, ...] | None = None
    # an unconstrained env is left out, so the JSON (and every hash taken of it) of a capability
    # written before env existed is unchanged; a field-level rule, not a wrap serializer: that
    # ran Python for every capability of every grant serialised (≈ 0.6 µs each)
    env: tuple[ArgAlternative, ...] | None = Field(default=None, exclude_if=_is_none)


class TmpCapability(_Cap):
    """Isolated temporary space, optionally bounded in size."""

    kind: Literal["tmp.use"] = "tmp.use"
    max_bytes: int | None = Field(default=None, ge=0)


class GpuCapability(_Cap):
    """Access to a GPU class (e.g. ``"any"``, ``"a100"``)."""

    kind: Literal["sys.gpu"] = "sys.gpu"
    gpu_class: str = Field(default="any", alias="class")

    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)


Capability = Annotated[
    FsCapability | NetHttpCapability | BrowserCapability | ProcCapability | TmpCapability
    | GpuCapability,
    Field(discriminator="kind"),
]
