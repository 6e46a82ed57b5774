"""One outcome per call: a run's result and, when it was refused or failed, its refusal."""

from __future__ import annotations

import json
from dataclasses import dataclass
from json.encoder import encode_basestring
from operator import is_, itemgetter
from typing import Any

from policy_engine.confirm.broker import Asked, needs_consent
from policy_engine.errors import ErrorCode, spec_of
from policy_engine.model import Decision
from policy_engine.orchestrator import RunOutcome
from policy_engine.refusal import ConsentSeen, Refusal, RefusedBy

_BACKEND = frozenset({ErrorCode.PROVIDER_UNAVAILABLE.value, ErrorCode.EXECUTION_FAILED.value,
                      ErrorCode.NOT_FOUND.value, ErrorCode.UNKNOWN_INTERNAL.value})
_LIMITS = frozenset({ErrorCode.BUDGET_EXCEEDED.value, ErrorCode.TIMEOUT.value})


def refused_by(outcome: RunOutcome, asked: Asked | None) -> RefusedBy:
    """Which layer refused: the approver, the limits, the backend, the manifest, the grant or
    a policy rule (``service`` is the faces' own: authentication, bad input)."""
    res, decision = outcome.result, outcome.decision
    code = res.code or ErrorCode.UNKNOWN_INTERNAL.value
    if (asked is not None and not asked.answer.approved) or needs_consent(decision):
        return "consent"
    if code in _LIMITS:
        return "limits"
    if code in _BACKEND or outcome.end.sandbox_error_kind in ("capability", "provider"):
        return "backend"
    if code == ErrorCode.DENY_TOOL.value:
        return "manifest"
    if code == ErrorCode.SCHEMA_VALIDATION_FAILED.value:
        return "service"
    if code == ErrorCode.PERMISSION_DENY.value and decision.rule is None:
        return "grant"  # not granted, expired or revoked: no rule decided it
    return "policy"


def refusal_of(outcome: RunOutcome, asked: Asked | None) -> Refusal | None:
    """The refusal of a call that did not succeed (``None`` when it ran)."""
    res = outcome.result
    if res.ok:
        return None
    code = res.code or ErrorCode.UNKNOWN_INTERNAL.value
    known = code in ErrorCode._value2member_map_
    spec = spec_of(ErrorCode(code)) if known else spec_of(ErrorCode.UNKNOWN_INTERNAL)
    by = refused_by(outcome, asked)
    # a backend's no names no rule: the rule the decision carries is the one that allowed it
    rule = outcome.decision.rule if by != "backend" else None
    return Refusal(code=code, http_status=spec.http_status, retryable=spec.retryable,
                   message=res.message or "", refused_by=by,
                   rule=rule.model_dump(mode="json") if rule is not None else None,
                   consent=asked.seen() if asked is not None else ConsentSeen(),
                   envelope_id=outcome.envelope_id)


@dataclass(frozen=True, slots=True)
class Called:
    """What the gateway answers for one call: the orchestrator's outcome, the consent asked
    (if any) and the refusal (``None`` when the call ran)."""

    outcome: RunOutcome
    asked: Asked | None
    refusal: Refusal | None

    @property
    def ok(self) -> bool:
        return self.outcome.result.ok

    @property
    def envelope_id(self) -> str:
        return self.outcome.envelope_id

    def to_json(self) -> dict[str, Any]:
        """The run document (`POST /v1/ops`, `run --format json`): result, decision, evidence,
        and ``consent``/``refusal`` when there are."""
        return {**self.outcome.to_json(), **self._extras()}

    def to_json_bytes(self, **after: Any) -> bytes:
        """``to_json()`` with ``after``'s members appended, as compact UTF-8 JSON (the
        service's encoding), the evidence member being the end record's bytes as its sinks
        wrote them: rendered once per call, not again for the answer (issue 27)."""
        o = self.outcome
        tail = {**self._extras(), **after}
        rest = b"," + _compact(tail)[1:] if tail else b"}"
        # pydantic renders the models straight to bytes (no dict, no json.dumps); the same
        # members, in the same order, as ``head_json``
        return b"".join((b'{"result":', o.result.__pydantic_serializer__.to_json(o.result),
                         b',"decision":', _decision_json(o.decision),
                         b',"envelope_id":', _string(o.envelope_id),
                         b',"evidence":', o.end.json_bytes(), rest))

    def _extras(self) -> dict[str, Any]:
        data: dict[str, Any] = {}
        if self.asked is not None:
            data["consent"] = {**self.asked.answer.to_json(), "kind": self.asked.kind}
        if self.refusal is not None:
            data["refusal"] = self.refusal.to_json()
        return data


_DECISIONS: dict[int, tuple[Decision, bytes]] = {}
_DECISIONS_MAX = 1024


def _decision_json(decision: Decision) -> bytes:
    """``decision`` as the run document shows it, remembered by identity: the guard answers a
    cached decision with the same (frozen) object every time. The entry holds the object, so
    its id cannot be reused while remembered. Another grant's allow under the same compiled
    profile is the guard's prebuilt allow restamped with that profile's hash (``verdict``:
    every other field the same object): it is the kept rendering around the new hash."""
    hit = _DECISIONS.get(id(decision))
    if hit is not None and hit[0] is decision:
        return hit[1]
    rendered = _restamped_json(decision)
    if rendered is None:
        rendered = decision.model_dump_json(exclude_none=True).encode()
    if len(_DECISIONS) >= _DECISIONS_MAX:
        _DECISIONS.clear()  # a cache, not a limit
    _DECISIONS[id(decision)] = (decision, rendered)
    return rendered


# the fields but the hash (their ids) -> (those objects, the JSON before and after the hash;
# ``None`` while seen once: a decision nobody restamps is rendered once, as before; ``False``
# when its rendering holds the mark elsewhere too)
_AROUND: dict[tuple[int, ...],
              tuple[tuple[object, ...], tuple[bytes, bytes] | bool | None]] = {}
_MARK = b"0pe0mark0"  # plain ASCII: rendered as it is, once, where the hash goes
# a decision's fields but the hash, in one C call (a generator over ``__dict__`` cost ≈ 1 µs)
_OTHERS = itemgetter(*(name for name in Decision.model_fields if name != "profile_hash"))


def _restamped_json(decision: Decision) -> bytes | None:
    """``decision``'s rendering from the kept one of an allow whose every field but
    ``profile_hash`` is the same object, when its hash is hex (nothing to escape); ``None``
    when there is none (yet)."""
    phash = decision.profile_hash
    if decision.decision != "allow" or type(phash) is not str or \
            not (phash.isascii() and phash.isalnum()):
        return None
    others = _OTHERS(decision.__dict__)
    key = tuple(map(id, others))
    kept = _AROUND.get(key)
    if kept is None or not all(map(is_, kept[0], others)):
        if len(_AROUND) >= _DECISIONS_MAX:
            _AROUND.clear()  # a cache, not a limit
        _AROUND[key] = (others, None)  # the entry holds the objects: their ids stay theirs
        return None
    around = kept[1]
    if around is None:  # the second of its kind: worth the marked rendering
        marked = decision.model_copy(update={"profile_hash": _MARK.decode()}).model_dump_json(
            exclude_none=True).encode()
        around = marked.partition(_MARK)[::2] if marked.count(_MARK) == 1 else False
        _AROUND[key] = (others, around)
    if not isinstance(around, tuple):
        return None
    return around[0] + phash.encode() + around[1]


# ``json.dumps`` with these options builds this encoder on every call; it holds only them
_COMPACT = json.JSONEncoder(ensure_ascii=False, allow_nan=False, separators=(",", ":"))


def _compact(value: object) -> bytes:
    """What starlette's ``JSONResponse`` renders for ``value``."""
    return _COMPACT.encode(value).encode()


def _string(value: str) -> bytes:
    """``_compact`` of a string: the encoder's own string step, without its set-up (a str
    subclass or a lone surrogate goes the whole way, for its exact answer)."""
    if type(value) is not str or not value.isascii():
        return _compact(value)
    return encode_basestring(value).encode()
