"""A candidate policy beside the loaded one: its diff and the replay of recent calls under it."""

from __future__ import annotations

import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from policy_engine.compiler import compile_files
from policy_engine.errors import Diagnostic, DiagnosticsError
from policy_engine.graph.policyset import PolicySet
from policy_engine.inputs.inputfile import MAX_KEY_BYTES, read_bounded
from policy_engine.recording.record import SEAL_KEY_FILE
from policy_engine.replay.engine import RecordedCall, Replayed, replay

MAX_CANDIDATE_BYTES = 1 << 20


@dataclass
class CandidateReport:
    """What the policy page shows for one candidate."""

    version: str = ""
    version_hash: str = ""
    problems: list[str] = field(default_factory=list)
    changes: list[dict[str, str]] = field(default_factory=list)
    undecided: list[str] = field(default_factory=list)
    replayed: list[Replayed] = field(default_factory=list)


def candidate_report(current: PolicySet, source: str, recent: Sequence[RecordedCall],
                     state_dir: Path) -> CandidateReport:
    """Compile ``source`` as one ``.sbpolicy`` file and compare it with ``current``: the exact
    difference (``policy-engine diff``: every request class decided differently, with a
    witness checked under both) and the recent calls replayed under the candidate."""
    from policy_engine.analysis.difference import diff
    from policy_engine.analysis.render import change_line, verdict_text

    report = CandidateReport()
    if len(source.encode("utf-8", "surrogatepass")) > MAX_CANDIDATE_BYTES:
        report.problems.append(f"the candidate is larger than {MAX_CANDIDATE_BYTES} bytes")
        return report
    with tempfile.TemporaryDirectory(prefix="pe-console-") as tmp:
        path = Path(tmp) / "candidate.sbpolicy"
        path.write_text(source, encoding="utf-8", errors="surrogateescape")
        try:
            candidate = compile_files([path])
        except DiagnosticsError as exc:
            report.problems = [_located(d) for d in exc.diagnostics][:50]
            return report
        except (OSError, ValueError) as exc:
            report.problems = [f"the candidate does not compile: {exc}"]
            return report
    report.version, report.version_hash = candidate.version, candidate.version_hash
    exact = diff(current, candidate)
    report.changes = [{"request": change_line(c), "category": c.category,
                       "now": verdict_text(c.old), "candidate": verdict_text(c.new),
                       "limits": "; ".join(f"{lc.field}: {lc.old} → {lc.new}"
                                           for lc in c.limits)}
                      for c in exact.changes]
    report.undecided = [f"{u.kind} {u.dimension} ({', '.join(u.rules)}): {u.reason}"
                        for u in exact.undecided]
    report.replayed = replay(candidate, recent, _seal_key(state_dir))
    return report


def _located(diagnostic: Diagnostic) -> str:
    span = diagnostic.span
    where = f"line {span.line}, column {span.column}: " if span is not None else ""
    return f"{where}{diagnostic.id} {diagnostic.message}"


def _seal_key(state_dir: Path) -> bytes | None:
    try:
        data = read_bounded(state_dir / SEAL_KEY_FILE, MAX_KEY_BYTES)
    except OSError:
        return None  # sealed payloads then replay as unreplayable, with that reason
    return data[:32] if len(data) >= 32 else None
