"""Closed vocabularies of the model: safety classes, side effects, network modes, decisions."""

from __future__ import annotations

from enum import StrEnum


class SafetyClass(StrEnum):
    """Risk class of a tool; the meet takes the highest (``RANK`` orders them)."""

    LOW = "Low"
    MEDIUM = "Medium"
    HIGH = "High"

    @property
    def rank(self) -> int:
        return _SAFETY_RANK[self]


_SAFETY_RANK = {SafetyClass.LOW: 0, SafetyClass.MEDIUM: 1, SafetyClass.HIGH: 2}


class SideEffect(StrEnum):
    """What a tool may change; the meet takes the union (still bound by the capabilities)."""

    NONE = "None"
    READ = "Read"
    WRITE = "Write"
    NETWORK = "Network"
    FILESYSTEM = "Filesystem"
    BROWSER = "Browser"
    PROCESS = "Process"


class NetworkMode(StrEnum):
    """Network reachable from an executor (seed 004): off < restricted < on."""

    OFF = "off"
    RESTRICTED = "restricted"
    ON = "on"

    @property
    def rank(self) -> int:
        return _NET_RANK[self]


_NET_RANK = {NetworkMode.OFF: 0, NetworkMode.RESTRICTED: 1, NetworkMode.ON: 2}


class Isolation(StrEnum):
    """A stronger isolation a named profile may require of the backend running its processes
    (`isolation gvisor`): never degraded, in strict or compat mode."""

    GVISOR = "gvisor"
    """A user-space kernel (gVisor, the OCI runtime ``runsc``) between the process and the
    host kernel: the process's system calls are served by gVisor's Sentry."""


class CapabilityKind(StrEnum):
    """The capability domains (seed 000 §2.1)."""

    FS_READ = "fs.read"
    FS_WRITE = "fs.write"
    FS_LIST = "fs.list"
    NET_HTTP = "net.http"
    BROWSER_USE = "browser.use"
    PROC_EXEC = "proc.exec"
    TMP_USE = "tmp.use"
    SYS_GPU = "sys.gpu"


class OpKind(StrEnum):
    """Concrete operation kinds; each maps to exactly one capability kind (``OP_CAPABILITY``)."""

    FS_READ = "fs.read"
    FS_WRITE = "fs.write"
    FS_LIST = "fs.list"
    NET_HTTP = "net.http"
    BROWSER_NAV = "browser.nav"
    BROWSER_SCREENSHOT = "browser.screenshot"
    PROC_EXEC = "proc.exec"
    TMP_ALLOC = "tmp.alloc"


OP_CAPABILITY: dict[OpKind, CapabilityKind] = {
    OpKind.FS_READ: CapabilityKind.FS_READ,
    OpKind.FS_WRITE: CapabilityKind.FS_WRITE,
    OpKind.FS_LIST: CapabilityKind.FS_LIST,
    OpKind.NET_HTTP: CapabilityKind.NET_HTTP,
    OpKind.BROWSER_NAV: CapabilityKind.BROWSER_USE,
    OpKind.BROWSER_SCREENSHOT: CapabilityKind.BROWSER_USE,
    OpKind.PROC_EXEC: CapabilityKind.PROC_EXEC,
    OpKind.TMP_ALLOC: CapabilityKind.TMP_USE,
}


class BrowserScope(StrEnum):
    """Read-only browser actions (seed 000: open|screenshot|extract)."""

    OPEN = "open"
    SCREENSHOT = "screenshot"
    EXTRACT = "extract"
