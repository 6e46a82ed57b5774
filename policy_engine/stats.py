"""Evidence-log summary (seed 004 S4): by backend, timeout/degrade rates, denials, latency."""

from __future__ import annotations

import json
import math
import os
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

from policy_engine.inputs.inputfile import MAX_EVIDENCE_LINE_BYTES, open_regular


@dataclass(slots=True)
class LogRead:
    """Records read from evidence logs, and how many lines could not be parsed (a torn tail
    after a crash, or foreign lines) — counted, never fatal.
    """

    records: list[dict[str, Any]] = field(default_factory=list)
    unreadable: int = 0


MAX_LINE_BYTES = MAX_EVIDENCE_LINE_BYTES
"""A longer line is counted unreadable and skipped without being held in memory (a log may be
large, a line may not)."""


def read_logs(paths: Sequence[Path]) -> LogRead:
    """Read JSONL evidence logs line by line, keeping only the fields the summary reads.

    :raises OSError: a file cannot be opened, or is not a regular file
        (:class:`~policy_engine.inputs.inputfile.NotRegularFile`: a device or pipe never ends).
    """
    out = LogRead()
    for path in paths:
        with os.fdopen(open_regular(path), "rb") as fh:
            for raw in _lines(fh):
                if raw is None:
                    out.unreadable += 1
                    continue
                if not raw.strip():
                    continue
                try:
                    rec = json.loads(raw)
                except (ValueError, RecursionError):  # RecursionError: nested too deeply
                    out.unreadable += 1
                    continue
                if well_formed(rec):
                    out.records.append({k: rec[k] for k in _KEPT if k in rec})
                else:
                    out.unreadable += 1
    return out


def _lines(fh: BinaryIO) -> Iterator[bytes | None]:
    """Each line of ``fh``; ``None`` for one longer than :data:`MAX_LINE_BYTES` (its rest is
    read and dropped in bounded pieces)."""
    while True:
        raw = fh.readline(MAX_LINE_BYTES + 1)
        if not raw:
            return
        if len(raw) > MAX_LINE_BYTES and not raw.endswith(b"\n"):
            while (rest := fh.readline(64 * 1024)) and not rest.endswith(b"\n"):
                pass
            yield None
            continue
        yield raw


_TEXT_FIELDS = ("type", "status", "error_code", "sandbox_backend", "sandbox_degrade_reason")
_FLAG_FIELDS = ("sandbox_timed_out", "sandbox_degraded")
_KEPT = (*_TEXT_FIELDS, *_FLAG_FIELDS, "sandbox_latency_ms")


def well_formed(rec: Any) -> bool:
    """Whether ``rec`` is an object whose fields the summary reads have their evidence types
    (text or null, flags, a latency number): a line that does not is counted as unreadable, not
    summarized (a list as a backend name would otherwise break the counting)."""
    if not isinstance(rec, dict):
        return False
    if any(not isinstance(rec.get(k), str | None) for k in _TEXT_FIELDS):
        return False
    if any(not isinstance(rec.get(k), bool | None) for k in _FLAG_FIELDS):
        return False
    latency = rec.get("sandbox_latency_ms")
    if latency is None:
        return True
    if not isinstance(latency, int | float) or isinstance(latency, bool):
        return False
    try:  # an integer too large for a float (10**400) is not a latency either
        return math.isfinite(float(latency))
    except OverflowError:
        return False


def percentile(sorted_values: Sequence[float], q: float) -> float | None:
    """Nearest-rank percentile (no interpolation: every reported value was really observed)."""
    if not sorted_values:
        return None
    rank = max(1, math.ceil(q / 100 * len(sorted_values)))
    return sorted_values[rank - 1]


def _rate(part: int, whole: int) -> float:
    return round(part / whole, 4) if whole else 0.0


def summarize(records: Iterable[dict[str, Any]]) -> dict[str, Any]:
    """Summarize the ``end`` records (one per call; begins only count as calls started)."""
    begins = 0
    ends: list[dict[str, Any]] = []
    for rec in records:
        if rec.get("type") == "begin":
            begins += 1
        elif rec.get("type") == "end":
            ends.append(rec)
    total = len(ends)
    by_backend: dict[str, dict[str, Any]] = {}
    for rec in ends:
        name = rec.get("sandbox_backend") or "(none)"
        entry = by_backend.setdefault(name, {"count": 0, "ok": 0, "timed_out": 0, "degraded": 0})
        entry["count"] += 1
        entry["ok"] += rec.get("status") == "ok"
        entry["timed_out"] += bool(rec.get("sandbox_timed_out"))
        entry["degraded"] += bool(rec.get("sandbox_degraded"))
    for entry in by_backend.values():
        entry["success_rate"] = _rate(entry["ok"], entry["count"])
    statuses = Counter(str(rec.get("status")) for rec in ends)
    denials = Counter(str(rec.get("error_code")) for rec in ends if rec.get("status") == "denied")
    errors = Counter(str(rec.get("error_code")) for rec in ends if rec.get("status") == "error")
    degrade_reasons = Counter(str(rec.get("sandbox_degrade_reason")) for rec in ends
                              if rec.get("sandbox_degraded"))
    latencies = sorted(float(rec["sandbox_latency_ms"]) for rec in ends
                       if isinstance(rec.get("sandbox_latency_ms"), int | float))
    return {
        "calls": total,
        "begins_without_end": max(0, begins - total),
        "statuses": dict(sorted(statuses.items())),
        "by_backend": dict(sorted(by_backend.items())),
        "timeout_rate": _rate(sum(bool(r.get("sandbox_timed_out")) for r in ends), total),
        "degrade_rate": _rate(sum(bool(r.get("sandbox_degraded")) for r in ends), total),
        "denial_codes": dict(denials.most_common()),
        "error_codes": dict(errors.most_common()),
        "degrade_reasons": dict(degrade_reasons.most_common()),
        "latency_ms": {
            "p50": percentile(latencies, 50), "p90": percentile(latencies, 90),
            "p99": percentile(latencies, 99),
            "avg": round(sum(latencies) / len(latencies), 3) if latencies else None,
        },
    }


def render_text(summary: dict[str, Any], *, unreadable: int = 0) -> str:
    """The summary as aligned text."""
    lines = [f"calls: {summary['calls']}  "
             + "  ".join(f"{k}: {v}" for k, v in summary["statuses"].items())]
    if summary["begins_without_end"]:
        lines.append(f"begins without end: {summary['begins_without_end']}")
    if unreadable:
        lines.append(f"unreadable lines: {unreadable}")
    lines.append(f"timeout rate: {summary['timeout_rate']:.2%}  "
                 f"degrade rate: {summary['degrade_rate']:.2%}")
    lat = summary["latency_ms"]
    if lat["p50"] is not None:
        lines.append(f"latency ms: p50 {lat['p50']:.2f}  p90 {lat['p90']:.2f}  "
                     f"p99 {lat['p99']:.2f}  avg {lat['avg']:.2f}")
    lines.append("by backend:")
    for name, entry in summary["by_backend"].items():
        lines.append(f"  {name:<16} {entry['count']:>6} calls  "
                     f"{entry['success_rate']:.2%} ok  {entry['timed_out']} timed out  "
                     f"{entry['degraded']} degraded")
    for title, key in (("denials", "denial_codes"), ("errors", "error_codes"),
                       ("degrade reasons", "degrade_reasons")):
        if summary[key]:
            lines.append(f"{title}:")
            lines.extend(f"  {code:<32} {n:>6}" for code, n in summary[key].items())
    return "\n".join(lines)
