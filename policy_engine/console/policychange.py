"""A candidate policy beside the loaded one: its diff and the replay of recent calls under it."""

from __future__ import annotations

import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from policy_engine.compiler import compile_files
from policy_engine.dsl.parser import parse_source
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
    parsed, _ = parse_source(source, "candidate.sbpolicy")
    if parsed.imports:
        # an import would read another file of this server: a candidate stands alone
        report.problems.append(f"line {parsed.imports[0].span.line}: a candidate is one "
                               "self-contained file, imports are not followed here (compare a "
                               "bundle with `policy-engine diff` in CI)")
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


CANDIDATE_TIMEOUT_S = 30.0
"""How long one comparison may run (its own process, killed past it)."""


def candidate_report_bounded(current_files: Sequence[str], source: str,
                             recent: Sequence[RecordedCall], state_dir: Path,
                             timeout_s: float = CANDIDATE_TIMEOUT_S) -> CandidateReport:
    """:func:`candidate_report` in a child process that is killed after ``timeout_s``: a
    candidate large or knotty enough to take longer costs one core for that long, never a
    server thread for good (the loaded policy is compiled again there from its files)."""
    import multiprocessing

    ctx = multiprocessing.get_context("spawn")
    parent, child = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_compare_in_child,
                       args=(list(current_files), source, list(recent), state_dir, child),
                       daemon=True)
    proc.start()
    child.close()
    try:
        if parent.poll(timeout_s):
            try:
                result = parent.recv()
            except EOFError:  # the child died without an answer
                result = None
        else:
            result = None
            report = CandidateReport()
            report.problems.append(f"the comparison took longer than {timeout_s:g} s and was "
                                   "stopped: compare this candidate with `policy-engine diff`")
            return report
    finally:
        if proc.is_alive():
            proc.kill()
        proc.join(5)
        parent.close()
    if not isinstance(result, CandidateReport):
        report = CandidateReport()
        report.problems.append("the comparison failed (the server log says why)")
        return report
    return result


def _compare_in_child(current_files: list[str], source: str, recent: list[RecordedCall],
                      state_dir: Path, out: Any) -> None:
    try:
        current = compile_files([Path(f) for f in current_files])
        out.send(candidate_report(current, source, recent, state_dir))
    except Exception:  # noqa: BLE001 - reported by the parent as a failed comparison
        import logging

        logging.getLogger(__name__).exception("console: candidate comparison failed")
    finally:
        out.close()
