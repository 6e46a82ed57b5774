"""Limits, budgets, allow/deny lists and mappings; the meet takes the strictest of each."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, field_validator

MIN_CPU_CORES = 0.01
"""The smallest ``cpu_cores`` a limit may say: one millisecond of CPU per 100 ms period, the
finest quota both cgroups and Docker enforce."""


class Limits(BaseModel):
    """Per-call limits. ``None`` means "this source does not constrain it"; the meet takes the
    minimum of the values that are set, and the profile fills the rest from system defaults.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    @field_validator("*", mode="before")
    @classmethod
    def _no_booleans(cls, value: object) -> object:
        # pydantic's lax mode reads JSON `false` as 0 and `true` as 1: a client writing
        # `"max_stdout_bytes": false` ("no limit"?) got the strictest limit, and the schema
        # says integer (schemathesis ST201, fuzz round 2)
        if isinstance(value, bool):
            raise ValueError("a limit is a number, not true/false")
        return value

    max_bytes_in: int | None = Field(default=None, ge=0)
    max_bytes_out: int | None = Field(default=None, ge=0)
    max_files: int | None = Field(default=None, ge=0)
    max_depth: int | None = Field(default=None, ge=0)
    max_concurrency: int | None = Field(default=None, ge=1)
    timeout_ms: int | None = Field(default=None, ge=1)
    # finite: JSON has no infinity (it would be written as null, an unset limit) and a NaN
    # would make the meet's minimum depend on the order of its layers. At least 0.01: the
    # smallest quota cgroups (1 ms per 100 ms period) and Docker enforce; Docker read a
    # smaller value, truncated to `NanoCpus: 0`, as no limit at all
    cpu_cores: float | None = Field(default=None, ge=MIN_CPU_CORES, allow_inf_nan=False)
    memory_bytes: int | None = Field(default=None, ge=1)
    pids: int | None = Field(default=None, ge=1)
    max_stdout_bytes: int | None = Field(default=None, ge=0)
    max_stderr_bytes: int | None = Field(default=None, ge=0)
    # bytes a process call may write to disk in total, every file and process of the call
    # together (issue 32 item 2); the executors' write watchdog enforces it
    disk_write_bytes: int | None = Field(default=None, ge=0)
    max_screenshot_width: int | None = Field(default=None, ge=1)
    max_screenshot_height: int | None = Field(default=None, ge=1)


LIMIT_FIELDS: tuple[str, ...] = tuple(Limits.model_fields)

SYSTEM_DEFAULT_LIMITS = Limits(
    max_bytes_in=10 * 1024 * 1024,
    max_bytes_out=1024 * 1024,
    max_files=100,
    max_depth=3,
    max_concurrency=4,
    timeout_ms=60_000,
    cpu_cores=1.0,
    memory_bytes=1024 * 1024 * 1024,
    pids=256,
    max_stdout_bytes=1024 * 1024,
    max_stderr_bytes=1024 * 1024,
    disk_write_bytes=2 * 1024 * 1024 * 1024,
    max_screenshot_width=1920,
    max_screenshot_height=1080,
)
"""Seed 002 §5.2 built-in defaults: the value of a field no policy sets. They are defaults, not
ceilings: a policy's ``defaults`` or a permit rule may set any field above them (docs/language.md
"Limits"); the manifest, grant, settings, named profiles and overrides may only narrow."""

LIMIT_LAYERS: tuple[str, ...] = (
    "built-in", "policy default", "settings", "manifest", "grant", "named profile", "override",
    "rule", "request")
"""The layers that can set an effective limit, in the order they apply (``Decision.limit_layers``).
``request`` is a value the operation itself declares (``timeout_ms``)."""


class Budget(BaseModel):
    """Consumable amounts for one grant (seed 000 §2.2). ``None`` = not limited by this source."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    calls: int | None = Field(default=None, ge=0)
    bytes_out: int | None = Field(default=None, ge=0)
    bytes_in: int | None = Field(default=None, ge=0)
    cpu_ms: int | None = Field(default=None, ge=0)
    gpu_ms: int | None = Field(default=None, ge=0)
    file_count: int | None = Field(default=None, ge=0)


BUDGET_KINDS: tuple[str, ...] = tuple(Budget.model_fields)


class Usage(BaseModel):
    """What one call consumed; always concrete numbers."""

    model_config = ConfigDict(extra="forbid")

    calls: int = 0
    bytes_out: int = 0
    bytes_in: int = 0
    cpu_ms: int = 0
    gpu_ms: int = 0
    file_count: int = 0


class AllowLists(BaseModel):
    """Derived allow-lists (seed 000 Whitelists): a summary view of the profile's capabilities."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    domains: tuple[str, ...] = ()
    paths: tuple[str, ...] = ()
    tools: tuple[str, ...] = ()
    mime_allow: tuple[str, ...] = ()
    methods: tuple[str, ...] = ()


class DenyLists(BaseModel):
    """Deny-lists; the meet takes the union. Mandatory entries can never be lifted."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    paths: tuple[str, ...] = ()
    domains: tuple[str, ...] = ()
    tools: tuple[str, ...] = ()


def check_root_path(value: str | None) -> str | None:
    """``value`` unchanged when it can name a root (``root_fs``, ``tmp_dir``): absolute, with no
    NUL and no ``.``/``..`` segment. A relative root was decided against nothing (explain
    allowed, the fs executor refused), and a ``..`` in it is read one way by the guard and
    another by the kernel through a link (outsider round 12, F4/F5); raises ``ValueError``."""
    if value is None:
        return value
    if not value.startswith("/") or "\x00" in value or any(
            seg in (".", "..") for seg in value.split("/")):
        raise ValueError(f"must be an absolute path without `.` or `..` segments, not {value!r}")
    return value


class Mappings(BaseModel):
    """Where the call's file system is rooted (chroot-like) and its isolated tmp directory."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    root_fs: str = "/workspace"
    tmp_dir: str = "/tmp/policy-engine"
    home: str = "/root"

    @field_validator("root_fs", "tmp_dir")
    @classmethod
    def _root(cls, value: str) -> str:
        return check_root_path(value) or value
