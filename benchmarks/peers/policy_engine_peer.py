"""Our engine on the benchmark policy: compiled once, profiles pre-built, ``Guard.decide`` timed."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

from pydantic import TypeAdapter

from benchmarks.peers.common import FIXTURES, Case, home
from policy_engine.compiler import compile_files
from policy_engine.graph import PolicySet
from policy_engine.guard import Guard
from policy_engine.model import (
    BrowserCapability,
    Consent,
    ExecOp,
    FsCapability,
    Grant,
    Manifest,
    NetHttpCapability,
    NetworkMode,
    ProcCapability,
    Profile,
    SafetyClass,
    SideEffect,
    TmpCapability,
)
from policy_engine.profile import ProfileBuilder

NAME = "policy-engine"
FAR_FUTURE_MS = 4_102_444_800_000  # 2100-01-01
_OPS: TypeAdapter[Any] = TypeAdapter(ExecOp)

WIDE = (
    FsCapability(kind="fs.read", paths=("/**",)),
    FsCapability(kind="fs.write", paths=("/**",)),
    NetHttpCapability(hosts=("*",), schemes=("https", "http"), ports=(443, 80, 8080, 8443),
                      methods=("GET", "HEAD", "POST")),
    BrowserCapability(hosts=("*",), schemes=("https", "http")),
    ProcCapability(tool="git"),
    ProcCapability(tool="curl"),
    TmpCapability(),
)
"""Grant and manifest are wider than the policy, so the policy alone decides every case."""


def version() -> str:
    from importlib.metadata import version as v

    return v("policy-engine")


def policy_file(variant: str) -> str:
    return str(FIXTURES / ("bench.sbpolicy" if variant == "plain" else "bench_cel.sbpolicy"))


def compile_policy(variant: str) -> PolicySet:
    return compile_files([policy_file(variant)], home=home())


def grant_for(subject: str) -> Grant:
    """A grant for every domain, with the consent the built-in consent rule asks of writers."""
    return Grant(
        tenant="acme", subject_id=subject, tool_name="bench-tool", call_id="call-1",
        capabilities=WIDE, expires_at=FAR_FUTURE_MS,
        consent=Consent(granted_by="human:ops", granted_at=0, expires_at=FAR_FUTURE_MS),
    )


def manifest() -> Manifest:
    return Manifest(
        name="bench-tool", version="1.0.0", permissions=WIDE,
        side_effects=(SideEffect.READ, SideEffect.WRITE, SideEffect.NETWORK,
                      SideEffect.PROCESS, SideEffect.BROWSER),
        safety_class=SafetyClass.MEDIUM, network=NetworkMode.ON,
    )


class Engine:
    """One compiled policy set, one profile per subject built up front, the default ``Guard``.

    :param resolve_symlinks: passed to :class:`Guard`; the default (``True``) also walks the path
        with ``lstat`` beneath the root, as production does.
    """

    name = NAME

    def __init__(self, variant: str, cases: Sequence[Case], *,
                 resolve_symlinks: bool = True) -> None:
        del cases
        self.policyset = compile_policy(variant)
        self.builder = ProfileBuilder(self.policyset)
        self.guard = Guard(self.policyset, resolve_symlinks=resolve_symlinks, fs_facts=False)
        self.manifest = manifest()
        self._profiles: dict[str, Profile] = {}

    def profile(self, subject: str) -> Profile:
        if subject not in self._profiles:
            self._profiles[subject] = self.builder.build(grant_for(subject), self.manifest)
        return self._profiles[subject]

    def prepare(self, case: Case) -> tuple[Profile, Any, int]:
        """The profile (built here, untimed), the raw op as a model, and ``now``."""
        op = _OPS.validate_python(dict(case.op))
        return self.profile(case.ctx.subject), op, case.ctx.now_ms

    def decide(self, prepared: tuple[Profile, Any, int]) -> bool:
        profile, op, now_ms = prepared
        return self.guard.decide(profile, op, now_ms=now_ms).allowed

    def timed_call(self, prepared: tuple[Profile, Any, int]) -> Callable[[], object]:
        profile, op, now_ms = prepared
        return partial(self.guard.decide, profile, op, now_ms=now_ms)
