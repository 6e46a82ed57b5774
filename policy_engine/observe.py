"""Prometheus metrics of the seed 000 §10 set, on a dedicated registry (never the global one)."""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest

from policy_engine.model import OpKind, Profile

# Latency buckets in milliseconds: sub-millisecond decisions up to minute-long processes.
_MS_BUCKETS = (0.1, 0.25, 0.5, 1, 2.5, 5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000,
               30000, 60000)

_DOMAINS: dict[str, str] = {
    OpKind.FS_READ: "fs", OpKind.FS_WRITE: "fs", OpKind.FS_LIST: "fs",
    OpKind.NET_HTTP: "net", OpKind.BROWSER_NAV: "browser", OpKind.BROWSER_SCREENSHOT: "browser",
    OpKind.PROC_EXEC: "proc", OpKind.TMP_ALLOC: "tmp",
}


def domain_of(op_kind: str) -> str:
    """The ``domain`` label (fs|net|browser|proc|tmp) of an op kind."""
    return _DOMAINS.get(op_kind, "other")


class Metrics:
    """All engine metrics on one registry owned by this object.

    A dedicated registry lets several engines (and tests) live in one process without
    "duplicated timeseries" errors, and exposes only what this engine measured.
    """

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry(auto_describe=True)
        r = self.registry
        self.exec_total = Counter(
            "sandbox_exec", "calls that reached an executor",
            ["domain", "tool", "safety", "side_effect", "tenant"], registry=r)
        self.denied_total = Counter(
            "sandbox_denied", "calls refused before execution", ["code"], registry=r)
        self.errors_total = Counter(
            "sandbox_errors", "calls that failed during execution", ["code"], registry=r)
        self.budget_used_bytes = Counter(
            "sandbox_budget_used_bytes", "bytes consumed by calls", ["direction"], registry=r)
        self.cpu_ms = Counter("sandbox_cpu_ms", "CPU milliseconds consumed", registry=r)
        self.gpu_ms = Counter("sandbox_gpu_ms", "GPU milliseconds consumed", registry=r)
        self.latency_ms = Histogram(
            "sandbox_latency_ms", "end-to-end call latency", ["domain"], buckets=_MS_BUCKETS,
            registry=r)
        self.profile_build_ms = Histogram(
            "sandbox_profile_build_ms", "profile build time", buckets=_MS_BUCKETS, registry=r)
        self.guard_validate_ms = Histogram(
            "sandbox_guard_validate_ms", "guard decision time", buckets=_MS_BUCKETS, registry=r)
        self._exec_children: dict[tuple[Any, ...], Any] = {}
        self._bytes_children: dict[str, Any] = {}
        self._latency_children: dict[str, Any] = {}
        self.sink_failures_total = Counter(
            "sandbox_evidence_sink_failures", "evidence records a sink failed to take",
            ["sink"], registry=r)

    def observe_exec(self, op_kind: str, profile: Profile) -> None:
        key = (op_kind, profile.tool_name, profile.safety, tuple(profile.side_effects),
               profile.tenant)
        child = self._exec_children.get(key)
        if child is None:  # prometheus' labels() validates and locks per call: kept per key
            child = self.exec_total.labels(
                domain=domain_of(op_kind), tool=profile.tool_name, safety=profile.safety.value,
                side_effect=",".join(sorted(s.value for s in profile.side_effects)),
                tenant=profile.tenant)
            if len(self._exec_children) >= 4096:
                self._exec_children.clear()  # a cache, not a limit
            self._exec_children[key] = child
        child.inc()

    def bytes_used(self, direction: str) -> Any:
        """The ``budget_used_bytes`` series of ``direction`` (``in``/``out``), kept."""
        child = self._bytes_children.get(direction)
        if child is None:
            child = self._bytes_children[direction] = self.budget_used_bytes.labels(
                direction=direction)
        return child

    def latency(self, domain: str) -> Any:
        """The ``latency_ms`` series of ``domain``, kept (a handful of domains)."""
        child = self._latency_children.get(domain)
        if child is None:
            child = self._latency_children[domain] = self.latency_ms.labels(domain=domain)
        return child

    def sample(self, name: str, labels: dict[str, str] | None = None) -> float:
        """Current value of one sample (``0.0`` when never observed); for tests and `stats`."""
        value = self.registry.get_sample_value(name, labels or {})
        return 0.0 if value is None else value

    def exposition(self) -> bytes:
        """The Prometheus text exposition of this registry."""
        return generate_latest(self.registry)
