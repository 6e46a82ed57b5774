"""The data model: capabilities, grants, manifests, profiles, operations, results and evidence."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from policy_engine.lazy import lazy_exports

if TYPE_CHECKING:
    from policy_engine.model.capability import (
        ArgAlternative,
        ArgSlot,
        BrowserCapability,
        Capability,
        FsCapability,
        GpuCapability,
        NetHttpCapability,
        ProcCapability,
        TmpCapability,
    )
    from policy_engine.model.decision import Decision, TraceStep
    from policy_engine.model.enums import (
        OP_CAPABILITY,
        BrowserScope,
        CapabilityKind,
        Isolation,
        NetworkMode,
        OpKind,
        SafetyClass,
        SideEffect,
    )
    from policy_engine.model.evidence import (
        Digest,
        EvidenceBegin,
        EvidenceEnd,
        ExecResult,
        SideEffectRec,
    )
    from policy_engine.model.grant import Consent, Grant, Manifest, Overrides, Settings
    from policy_engine.model.limits import (
        BUDGET_KINDS,
        LIMIT_FIELDS,
        LIMIT_LAYERS,
        SYSTEM_DEFAULT_LIMITS,
        AllowLists,
        Budget,
        DenyLists,
        Limits,
        Mappings,
        Usage,
    )
    from policy_engine.model.ops import (
        BrowserNavOp,
        BrowserScreenshotOp,
        ExecOp,
        FsListOp,
        FsReadOp,
        FsWriteOp,
        NetHttpOp,
        ProcExecOp,
        TmpAllocOp,
    )
    from policy_engine.model.profile import Profile, ProfileCapability, ProfileDeny, RuleRef

# Imported on first use (PEP 562): a caller loads (and pydantic builds) only the model modules
# whose names it uses; `explain` never needs the evidence records.
_MODULES: dict[str, tuple[str, ...]] = {
    "capability": ("ArgAlternative", "ArgSlot", "BrowserCapability", "Capability", "FsCapability",
                   "GpuCapability", "NetHttpCapability", "ProcCapability", "TmpCapability"),
    "decision": ("Decision", "TraceStep"),
    "enums": ("OP_CAPABILITY", "BrowserScope", "CapabilityKind", "Isolation", "NetworkMode",
              "OpKind", "SafetyClass", "SideEffect"),
    "evidence": ("Digest", "EvidenceBegin", "EvidenceEnd", "ExecResult", "SideEffectRec"),
    "grant": ("Consent", "Grant", "Manifest", "Overrides", "Settings"),
    "limits": ("BUDGET_KINDS", "LIMIT_FIELDS", "LIMIT_LAYERS", "SYSTEM_DEFAULT_LIMITS",
               "AllowLists", "Budget", "DenyLists", "Limits", "Mappings", "Usage"),
    "ops": ("BrowserNavOp", "BrowserScreenshotOp", "ExecOp", "FsListOp", "FsReadOp", "FsWriteOp",
            "NetHttpOp", "ProcExecOp", "TmpAllocOp"),
    "profile": ("Profile", "ProfileCapability", "ProfileDeny", "RuleRef"),
}
_WHERE: dict[str, str] = {name: mod for mod, names in _MODULES.items() for name in names}

__all__ = [
    "BUDGET_KINDS", "LIMIT_FIELDS", "LIMIT_LAYERS", "OP_CAPABILITY", "SYSTEM_DEFAULT_LIMITS",
    "AllowLists", "ArgAlternative", "ArgSlot", "BrowserCapability", "BrowserNavOp",
    "BrowserScope", "BrowserScreenshotOp", "Budget", "Capability", "CapabilityKind", "Consent",
    "Decision", "DenyLists", "Digest", "EvidenceBegin", "EvidenceEnd", "ExecOp", "ExecResult",
    "FsCapability", "FsListOp", "FsReadOp", "FsWriteOp", "GpuCapability", "Grant", "Isolation",
    "Limits", "Manifest", "Mappings", "NetHttpCapability", "NetHttpOp", "NetworkMode", "OpKind",
    "Overrides", "ProcCapability", "ProcExecOp", "Profile", "ProfileCapability", "ProfileDeny",
    "RuleRef", "SafetyClass", "Settings", "SideEffect", "SideEffectRec", "TmpAllocOp",
    "TmpCapability", "TraceStep", "Usage",
]


_get, _listing = lazy_exports(__name__, _WHERE, __all__)


def __getattr__(name: str) -> Any:
    return _get(name)


def __dir__() -> list[str]:
    return _listing()
