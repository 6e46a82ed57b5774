"""Re-deciding recorded calls under another policy, offline: nothing is executed (seed 000 §14).

The "simulated executor" is the guard's dry run: each recorded call is rebuilt from its begin
record's ``replay`` block (policy_engine/recording/record.py), its profile built under the new
policy and the guard asked, exactly the steps the orchestrator takes before anything runs.
"""

from __future__ import annotations

import base64
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import TypeAdapter, ValidationError

from policy_engine.errors import ErrorCode, PolicyEngineError
from policy_engine.evidence.jsonline import load_line
from policy_engine.evidence.verify import is_sqlite, read_jsonl, read_sqlite
from policy_engine.graph.policyset import PolicySet
from policy_engine.guard import Guard
from policy_engine.model import Decision, ExecOp, Grant, Manifest, Overrides, Settings
from policy_engine.profile import ProfileBuilder
from policy_engine.recording.record import unseal

_OP: TypeAdapter[ExecOp] = TypeAdapter(ExecOp)
# refusals decided before any policy was consulted: a policy change cannot alter them
_POLICY_FREE = ("grant expired", "grant revoked")


@dataclass(frozen=True, slots=True)
class Verdict:
    """One side of a comparison: decision, code and deciding rule (``id@file:line:col``)."""

    decision: str
    code: str | None
    rule: str | None

    def to_json(self) -> dict[str, Any]:
        return {"decision": self.decision, "code": self.code, "rule": self.rule}


@dataclass(frozen=True, slots=True)
class RecordedCall:
    envelope_id: str
    begin: Mapping[str, Any]
    end: Mapping[str, Any] | None


@dataclass(frozen=True, slots=True)
class Replayed:
    """The outcome for one recorded call."""

    envelope_id: str
    capability: str
    status: str  # same | changed | unreplayable
    old: Verdict | None
    new: Verdict | None
    note: str = ""

    def to_json(self) -> dict[str, Any]:
        return {"envelope_id": self.envelope_id, "capability": self.capability,
                "status": self.status, "old": self.old.to_json() if self.old else None,
                "new": self.new.to_json() if self.new else None, "note": self.note}


def rule_label(rule: Mapping[str, Any] | None) -> str | None:
    if not rule:
        return None
    return f"{rule.get('id')}@{Path(str(rule.get('file'))).name}:{rule.get('line')}:" \
           f"{rule.get('column')}"


def load_calls(path: Path) -> list[RecordedCall]:
    """Begin/end pairs of a JSONL or SQLite evidence log, in begin order.

    :raises OSError: unreadable. :raises ValueError: not an evidence log.
    """
    raws = read_sqlite(path)[0] if is_sqlite(path) else read_jsonl(path)  # rows in order
    begins: dict[str, Mapping[str, Any]] = {}
    ends: dict[str, Mapping[str, Any]] = {}
    for raw in raws:
        try:
            rec = load_line(raw)
        except ValueError:
            continue  # `evidence verify` reports damaged lines; replay uses what it can read
        if not isinstance(rec, dict) or not isinstance(rec.get("envelope_id"), str):
            continue
        (begins if rec.get("type") == "begin" else ends).setdefault(rec["envelope_id"], rec)
    return [RecordedCall(eid, b, ends.get(eid)) for eid, b in begins.items()]


def old_verdict(end: Mapping[str, Any] | None) -> Verdict | None:
    if end is None:
        return None
    decision = end.get("decision") or ("deny" if end.get("status") == "denied" else "allow")
    code = end.get("error_code") if decision == "deny" else None
    return Verdict(str(decision), code, rule_label(end.get("rule")))


class Unreplayable(Exception):
    """The record lacks what deciding it again needs; the message says what and how to fix."""


def _payload(value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, dict) and value.get("invalid_base64"):
        return "!"  # not base64, like the original
    size = int(value.get("size", 0)) if isinstance(value, dict) else 0
    return base64.b64encode(bytes(size)).decode()


def rebuild_op(view: Mapping[str, Any], sealed: Mapping[str, Any]) -> ExecOp:
    """The op from its replay view, withheld parts taken from the opened sealed copy."""
    data = dict(view)
    kind = data.get("kind")
    if "url" in sealed:
        data["url"] = sealed["url"]
    elif data.get("url") == "<unparsed>":
        raise Unreplayable("its URL could not be parsed and is withheld (no sealed copy)")
    if kind == "fs.write":
        data["bytes_b64"] = _payload(data.get("bytes_b64")) or ""
    elif kind == "net.http":
        data["body_b64"] = _payload(data.get("body_b64"))
    elif kind == "proc.exec":
        data["stdin_b64"] = _payload(data.get("stdin_b64"))
        args = data.get("args") or []
        if any(a is None for a in args):
            if "args" not in sealed:
                missing = ", ".join(str(i + 1) for i, a in enumerate(args) if a is None)
                raise Unreplayable(f"argument(s) {missing} are recorded as keyed digests only "
                                   "(enable `options.replay.seal` to replay them)")
            data["args"] = sealed["args"]
    return _OP.validate_python(data)


def decide(policyset: PolicySet, block: Mapping[str, Any], envelope_id: str,
           seal_key: bytes | None) -> Decision:
    """Decide one recorded call under ``policyset``, as the orchestrator would before running.

    :raises Unreplayable: what is missing.
    """
    sealed: dict[str, Any] = {}
    if block.get("withheld") and block.get("sealed"):
        if seal_key is None:
            raise Unreplayable("its withheld parts are sealed: give --seal-key")
        try:
            sealed = unseal(seal_key, envelope_id, str(block["sealed"]))
        except ValueError as exc:
            raise Unreplayable(str(exc)) from None
    if block.get("context_keys") and "context" not in sealed:
        raise Unreplayable("its context is recorded as names only (enable "
                           "`options.replay.seal` to replay context conditions)")
    try:
        op = rebuild_op(block["op"], sealed)
        grant = Grant.model_validate(block["grant"])
        manifest = Manifest.model_validate(block["manifest"])
        settings = Settings.model_validate(block["settings"]) if block.get("settings") else None
        overrides = (Overrides.model_validate(block["overrides"]) if block.get("overrides")
                     else None)
    except (ValidationError, KeyError, TypeError) as exc:
        raise Unreplayable(f"its replay block does not load: {exc}") from None
    now = int(block.get("now_ms") or 0)
    if grant.expires_at <= now:
        return Decision(decision="deny", code=ErrorCode.PERMISSION_DENY.value,
                        reason="grant expired")
    try:
        profile = ProfileBuilder(policyset).build(grant, manifest, settings=settings,
                                                  overrides=overrides)
    except PolicyEngineError as exc:
        return Decision(decision="deny", code=exc.code.value, reason=exc.reason)
    return Guard(policyset).decide(profile, op, context=sealed.get("context") or None,
                                   now_ms=now)


def replay(policyset: PolicySet, calls: Iterable[RecordedCall],
           seal_key: bytes | None = None) -> list[Replayed]:
    out: list[Replayed] = []
    for call in calls:
        old = old_verdict(call.end)
        cap = str(call.begin.get("capability", ""))
        block = call.begin.get("replay")
        if old is None:
            out.append(Replayed(call.envelope_id, cap, "unreplayable", None, None,
                                "no end record (the call never finished)"))
            continue
        if call.end is not None and call.end.get("reason") in _POLICY_FREE:
            out.append(Replayed(call.envelope_id, cap, "same", old, old,
                                f"{call.end.get('reason')}: decided before any policy"))
            continue
        if not isinstance(block, Mapping):
            out.append(Replayed(call.envelope_id, cap, "unreplayable", old, None,
                                "recorded without a replay block"))
            continue
        try:
            d = decide(policyset, block, call.envelope_id, seal_key)
        except Unreplayable as exc:
            out.append(Replayed(call.envelope_id, cap, "unreplayable", old, None, str(exc)))
            continue
        rule = d.rule.model_dump() if d.rule else None
        new = Verdict(d.decision, d.code if not d.allowed else None, rule_label(rule))
        changed = (new.decision, new.code) != (old.decision, old.code)
        out.append(Replayed(call.envelope_id, cap, "changed" if changed else "same", old, new))
    return out
