"""The console's query and form fields, validated: a bad value is a 422, never a crash."""

from __future__ import annotations

import calendar
import re
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from policy_engine.console.index import FILTERS

MAX_FIELD = 300
_CURSOR = re.compile(r"[0-9]{1,16}:[A-Za-z0-9_.:-]{1,100}")
_WHEN = re.compile(r"([0-9]{4})-([0-9]{2})-([0-9]{2})(?:[T ]([0-9]{2}):([0-9]{2}))?")
DECISIONS = ("allow", "deny", "pending")
VALIDITIES = {"5m": 5 * 60_000, "1h": 60 * 60_000, "8h": 8 * 60 * 60_000, "24h": 24 * 60 * 60_000}
"""How long an approval stays valid, as the approval form offers it."""


class BadInput(ValueError):
    """A field the console cannot use: ``field`` names it, the message says why."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field


@dataclass(frozen=True, slots=True)
class CallQuery:
    """The calls page's filters, time range, page cursor and page size."""

    filters: dict[str, str]
    since: int | None
    until: int | None
    cursor: str | None
    size: int

    def link(self, **change: str | None) -> str:
        """The query string of this query with ``change`` applied (for links)."""
        from urllib.parse import urlencode

        values: dict[str, str] = {k: v for k, v in self.filters.items() if v}
        if self.since is not None:
            values["since"] = _show(self.since)
        if self.until is not None:
            values["until"] = _show(self.until)
        if self.size != 50:
            values["size"] = str(self.size)
        for key, value in change.items():
            if value is None:
                values.pop(key, None)
            else:
                values[key] = value
        return urlencode(values)


def call_query(items: Iterable[tuple[str, str]] | Mapping[str, str]) -> CallQuery:
    pairs = list(items.items()) if isinstance(items, Mapping) else list(items)
    known = set(FILTERS) | {"since", "until", "cursor", "size", "rule"}
    names = [name for name, _ in pairs]
    unknown = sorted(set(names) - known)
    if unknown:
        raise BadInput("query", "a parameter this page does not take")
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise BadInput(twice[0], "given more than once")
    params = dict(pairs)
    filters: dict[str, str] = {}
    for name in FILTERS:
        value = params.get("rule" if name == "rule_id" else name, "").strip()
        if len(value) > MAX_FIELD or any(ord(c) < 32 for c in value):
            raise BadInput(name, f"at most {MAX_FIELD} printable characters")
        filters[name] = value
    if filters["decision"] and filters["decision"] not in DECISIONS:
        raise BadInput("decision", f"one of {', '.join(DECISIONS)}")
    cursor = params.get("cursor") or None
    if cursor is not None and not _CURSOR.fullmatch(cursor):
        raise BadInput("cursor", "not a cursor this console made")
    raw_size = params.get("size") or "50"
    if not raw_size.isdigit() or not 10 <= int(raw_size) <= 200:
        raise BadInput("size", "a whole number from 10 to 200")
    return CallQuery(filters, when(params.get("since"), "since"),
                     when(params.get("until"), "until"), cursor, int(raw_size))


def when(value: str | None, field: str) -> int | None:
    """``YYYY-MM-DD`` or ``YYYY-MM-DDTHH:MM`` (UTC) as epoch milliseconds."""
    if not value:
        return None
    match = _WHEN.fullmatch(value.strip())
    if match is None:
        raise BadInput(field, "a date `YYYY-MM-DD` or `YYYY-MM-DDTHH:MM` (UTC)")
    y, mo, d, h, mi = (int(g) if g else 0 for g in match.groups())
    try:
        parts = time.strptime(f"{y:04d}-{mo:02d}-{d:02d} {h:02d}:{mi:02d}", "%Y-%m-%d %H:%M")
    except ValueError:
        raise BadInput(field, "not a real date and time") from None
    return calendar.timegm(parts) * 1000


def _show(ms: int) -> str:
    return time.strftime("%Y-%m-%dT%H:%M", time.gmtime(ms / 1000))


@dataclass(frozen=True, slots=True)
class AnswerForm:
    """An approver's answer: approve or deny, a reason, and how long a yes stays valid."""

    approve: bool
    reason: str
    valid_for_ms: int


def answer_form(form: Mapping[str, str]) -> AnswerForm:
    action = form.get("action", "")
    if action not in ("approve", "deny"):
        raise BadInput("action", "`approve` or `deny`")
    reason = form.get("reason", "").strip()
    if not reason:
        raise BadInput("reason", "say why (it is kept in the evidence)")
    if len(reason) > 500:
        raise BadInput("reason", "at most 500 characters")
    validity = form.get("validity", "5m")
    if validity not in VALIDITIES:
        raise BadInput("validity", f"one of {', '.join(VALIDITIES)}")
    return AnswerForm(action == "approve", reason, VALIDITIES[validity])
