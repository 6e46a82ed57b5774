"""The data model: capabilities, grants, manifests, profiles, operations, results and evidence."""

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
