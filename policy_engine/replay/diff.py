"""Semantic policy diff: which requests two policy versions decide differently, and by which rule.

Requests come from request files, policy-test files and evidence logs (through the replay
block of each recorded call); each is decided under both versions by the dry run (nothing is
executed) and the pairs whose decision or code differ are reported with both deciding rules.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from policy_engine.compiler.loaders import load_grant, load_manifest
from policy_engine.explain import explain
from policy_engine.explain.request import ExplainRequest, load_request, resolve_fixture
from policy_engine.graph.policyset import PolicySet
from policy_engine.model import Decision, Grant, Manifest
from policy_engine.policytest.loader import load_test_file
from policy_engine.replay.engine import RecordedCall, Replayed, Unreplayable, Verdict, decide

Decider = Callable[[PolicySet], Decision]


@dataclass(frozen=True, slots=True)
class Probe:
    """One request to decide under both versions: where it came from and how to decide it."""

    label: str  # e.g. `requests/git-push.json`, `org.sbtest.yaml: case name`, an envelope id
    capability: str
    decide: Decider


def _verdict(d: Decision) -> Verdict:
    rule = f"{d.rule.id}@{Path(d.rule.file).name}:{d.rule.line}:{d.rule.column}" \
        if d.rule else None
    return Verdict(d.decision, None if d.allowed else d.code, rule)


def _capability(op: object) -> str:
    from policy_engine.evidence import capability_string

    try:
        return capability_string(op)  # type: ignore[arg-type]
    except TypeError:
        return type(op).__name__


def _explained(ps: PolicySet, *, manifest: Manifest, grant: Grant,
               request: ExplainRequest) -> Decision:
    return explain(ps, manifest, grant, request).decision


def _replayed(ps: PolicySet, *, block: dict[str, Any], envelope_id: str,
              key: bytes | None) -> Decision:
    return decide(ps, block, envelope_id, key)


def request_probes(paths: Iterable[Path]) -> Iterator[Probe]:
    """Request files (``explain``'s format) with the manifest and grant they name.

    :raises DiagnosticsError: a request, manifest or grant does not load.
    """
    for path in paths:
        request = load_request(path)
        manifest = load_manifest(resolve_fixture(path, request.manifest, "manifest"))
        grant = load_grant(resolve_fixture(path, request.grant, "grant"))
        yield Probe(str(path), _capability(request.op),
                    partial(_explained, manifest=manifest, grant=grant, request=request))


def test_file_probes(paths: Iterable[Path]) -> Iterator[Probe]:
    """Every case of policy-test files (``*.sbtest.yaml``), with the file's fixtures.

    :raises DiagnosticsError: a test file or one of its fixtures does not load.
    """
    for path in paths:
        tf = load_test_file(str(path))
        for case in tf.cases:
            spec = case.spec
            manifest, grant = load_manifest(Path(case.manifest)), load_grant(Path(case.grant))
            request = ExplainRequest.model_construct(
                op=spec.op, now_ms=case.now_ms, overrides=spec.overrides,
                settings=spec.settings, context=spec.context, budget_used=spec.budget_used)
            yield Probe(f"{path}: {spec.name}", _capability(spec.op),
                        partial(_explained, manifest=manifest, grant=grant, request=request))


def evidence_probes(calls: Iterable[RecordedCall], seal_key: bytes | None) -> Iterator[Probe]:
    """Recorded calls, decided again from their replay blocks (see ``replay.engine.decide``)."""
    for call in calls:
        block = call.begin.get("replay")
        cap = str(call.begin.get("capability", ""))
        if not isinstance(block, dict):
            continue
        yield Probe(call.envelope_id, cap, partial(_replayed, block=block,
                                                   envelope_id=call.envelope_id, key=seal_key))


def compare(old: PolicySet, new: PolicySet, probes: Iterable[Probe]) -> list[Replayed]:
    """Decide every probe under both versions; ``changed`` when decision or code differ."""
    out: list[Replayed] = []
    for probe in probes:
        try:
            before, after = _verdict(probe.decide(old)), _verdict(probe.decide(new))
        except (Unreplayable, ValueError) as exc:  # ValueError: a witness the model rejects
            out.append(Replayed(probe.label, probe.capability, "unreplayable", None, None,
                                str(exc)))
            continue
        changed = (before.decision, before.code) != (after.decision, after.code)
        out.append(Replayed(probe.label, probe.capability, "changed" if changed else "same",
                            before, after))
    return out
