"""A checked skill manifest and how it compiles to a tool manifest, so the policy meet applies."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from policy_engine.model import Limits, Manifest, NetworkMode, SafetyClass, SideEffect

WORKSPACE_PREFIXES = ("inputs/", "work/", "artifacts/")
CONTAINER_ROOT = "/workspace"  # the docker executor's view of a project (seed 002 §4)
# the op fields a non-process runtime may take from an input (runtime.op), by runtime kind
OP_FIELDS: dict[str, tuple[str, ...]] = {
    "http": ("url", "method"), "browser": ("url", "extract"), "fs": ("path",)}
_ANY_ARG = "(?s).*"  # a placeholder argument: any string, newlines included


@dataclass(frozen=True, slots=True)
class Skill:
    """One skill (``skills/<id>/manifest.json``) after `policy-engine skills check` passed."""

    doc: dict[str, Any]
    path: Path

    @property
    def id(self) -> str:
        return str(self.doc["id"])

    @property
    def tool_name(self) -> str:
        """The MCP tool name (seed 002 §7: ``skill.<id>``)."""
        return f"skill.{self.id}"

    @property
    def kind(self) -> str:
        return str(self.doc["runtime"]["kind"])

    @property
    def inputs_schema(self) -> dict[str, Any]:
        return dict(self.doc["interface"]["inputs"])

    @property
    def outputs_schema(self) -> dict[str, Any]:
        return dict(self.doc["interface"]["outputs"])

    @property
    def fs_read(self) -> tuple[str, ...]:
        return tuple(self.doc["permissions"]["fs"].get("read", ()))

    @property
    def fs_write(self) -> tuple[str, ...]:
        return tuple(self.doc["permissions"]["fs"].get("write", ()))

    @property
    def net(self) -> dict[str, Any]:
        return dict(self.doc["permissions"]["net"])

    @property
    def limits(self) -> Limits:
        return Limits.model_validate(self.doc.get("limits", {}))

    def side_effects(self) -> tuple[SideEffect, ...]:
        """Derived, never declared: what the runtime and the permissions let the skill do."""
        found: list[SideEffect] = []
        if self.kind == "docker":
            found.append(SideEffect.PROCESS)
        if self.kind == "browser":
            found.append(SideEffect.BROWSER)
        if self.net["mode"] != "none":
            found.append(SideEffect.NETWORK)
        if self.fs_read or self.kind in ("http", "browser"):
            found.append(SideEffect.READ)
        if self.fs_write:
            found.append(SideEffect.WRITE)
        return tuple(found) or (SideEffect.NONE,)

    def annotations(self) -> dict[str, bool]:
        return hints(self.side_effects())

    def root(self, fs_root: str) -> str:
        """Where the skill's ``inputs/``, ``work/`` and ``artifacts/`` are: the container's
        ``/workspace`` for a process, the operator's ``root_fs`` for a file read."""
        return CONTAINER_ROOT if self.kind == "docker" else fs_root.rstrip("/") or "/"

    def capabilities(self, fs_root: str, root: str | None = None) -> list[dict[str, Any]]:
        """The capabilities the skill declares, with its workspace paths made absolute
        (beneath ``root`` when given: a session's directory, whose ``work/`` is the session's
        workspace, gateway/session_skills.py)."""
        root = root or self.root(fs_root)
        caps: list[dict[str, Any]] = []
        if self.kind == "docker":
            runtime = self.doc["runtime"]
            entry = list(runtime["entrypoint"])
            slots = [{"alternatives": [{"literal": a}]} for a in entry[1:]]
            for arg in runtime.get("args", []):
                alt = {"regex": _ANY_ARG} if placeholder(arg) else {"literal": arg}
                slots.append({"alternatives": [alt]})
            caps.append({"kind": "proc.exec", "tool": entry[0], "args": slots})
        net = self.net
        if self.kind in ("http", "browser"):
            cap: dict[str, Any] = {"hosts": list(net["hosts"])}
            if net.get("schemes"):
                cap["schemes"] = list(net["schemes"])
            if net.get("ports"):
                cap["ports"] = list(net["ports"])
            if self.kind == "http":
                caps.append({"kind": "net.http", "methods": ["GET", "HEAD"], **cap})
            else:
                caps.append({"kind": "browser.use", "scopes": ["open", "extract"], **cap})
        if self.fs_read:
            paths = [f"{root}/{p}" for p in self.fs_read]
            caps += [{"kind": "fs.read", "paths": paths}, {"kind": "fs.list", "paths": paths}]
        if self.fs_write:
            caps.append({"kind": "fs.write", "paths": [f"{root}/{p}" for p in self.fs_write]})
        return caps

    def tool_manifest(self, fs_root: str, root: str | None = None) -> Manifest:
        """The tool manifest this skill compiles to: the profile builder meets it with the
        grant and the policy exactly as it meets any other tool's (``root``: as for
        :meth:`capabilities`)."""
        effects = self.side_effects()
        safety = SafetyClass.MEDIUM if ({SideEffect.PROCESS, SideEffect.WRITE}
                                        & set(effects)) else SafetyClass.LOW
        network = NetworkMode.OFF if self.net["mode"] == "none" else NetworkMode.RESTRICTED
        return Manifest.model_validate({
            "name": self.id, "version": self.doc["version"],
            "description": self.doc["description"],
            "permissions": self.capabilities(fs_root, root), "side_effects": list(effects),
            "safety_class": safety, "input_schema": self.inputs_schema,
            "output_schema": self.outputs_schema, "limits": self.limits, "network": network})


def placeholder(arg: str) -> str | None:
    """The input named by a ``{name}`` argument, else None."""
    if len(arg) > 2 and arg[0] == "{" and arg[-1] == "}" and arg[1:-1].isidentifier():
        return arg[1:-1]
    return None


def hints(side_effects: tuple[SideEffect, ...]) -> dict[str, bool]:
    """MCP tool hints from side effects: read-only when nothing can be written or started;
    destructive when files can be (over)written or a process can do anything its permissions
    allow; open-world when the network (or a browser) is reachable."""
    effects = set(side_effects)
    writes = bool(effects & {SideEffect.WRITE, SideEffect.FILESYSTEM, SideEffect.PROCESS})
    return {"readOnlyHint": not writes, "destructiveHint": writes, "idempotentHint": not writes,
            "openWorldHint": bool(effects & {SideEffect.NETWORK, SideEffect.BROWSER})}
