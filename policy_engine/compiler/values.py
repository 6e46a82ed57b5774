"""Quantities with units (sizes, durations, dimensions) and `limits { ... }` blocks to Limits."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from policy_engine.dsl import ast
from policy_engine.errors import Diagnostic
from policy_engine.model import Limits

SIZE_UNITS: dict[str, int] = {
    "B": 1, "KB": 1000, "KiB": 1024, "MB": 1000**2, "MiB": 1024**2, "GB": 1000**3, "GiB": 1024**3,
}
DURATION_UNITS_MS: dict[str, float] = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000}

_QTY = re.compile(r"^([0-9]+(?:\.[0-9]+)?)([A-Za-z]*)$")
_DIM = re.compile(r"^([0-9]+)x([0-9]+)$")


class ValueProblem(Exception):
    """A quantity that cannot be read; carries the diagnostic ID to report."""

    def __init__(self, diag_id: str, message: str):
        super().__init__(message)
        self.diag_id = diag_id
        self.message = message


def parse_size(q: ast.Quantity) -> int:
    """Bytes: ``512``, ``10MiB``, ``1.5GB`` (a bare number is bytes)."""
    number, unit = _split(q)
    if unit and unit not in SIZE_UNITS:
        raise ValueProblem("SBP205", f"unknown size unit `{unit}` in `{q.text}`")
    return int(round(number * SIZE_UNITS.get(unit, 1)))


def parse_duration_ms(q: ast.Quantity) -> int:
    """Milliseconds: ``250ms``, ``60s``, ``5m``, ``1h``; a unit is required."""
    number, unit = _split(q)
    if not unit:
        raise ValueProblem("SBP205", f"duration `{q.text}` needs a unit (ms, s, m or h)")
    if unit not in DURATION_UNITS_MS:
        raise ValueProblem("SBP205", f"unknown duration unit `{unit}` in `{q.text}`")
    return int(round(number * DURATION_UNITS_MS[unit]))


def parse_int(q: ast.Quantity) -> int:
    number, unit = _split(q)
    if unit:
        raise ValueProblem("SBP205", f"`{q.text}` takes no unit")
    if number != int(number):
        raise ValueProblem("SBP213", f"`{q.text}` must be a whole number")
    return int(number)


def parse_float(q: ast.Quantity) -> float:
    number, unit = _split(q)
    if unit:
        raise ValueProblem("SBP205", f"`{q.text}` takes no unit")
    return number


def parse_dimension(q: ast.Quantity) -> tuple[int, int]:
    m = _DIM.match(q.text)
    if not m:
        raise ValueProblem("SBP205", f"`{q.text}` must be `WIDTHxHEIGHT`, e.g. `1920x1080`")
    return int(m.group(1)), int(m.group(2))


def _split(q: ast.Quantity) -> tuple[float, str]:
    m = _QTY.match(q.text)
    if not m:
        raise ValueProblem("SBP205", f"cannot read `{q.text}` as a number with a unit")
    return float(m.group(1)), m.group(2)


@dataclass(frozen=True, slots=True)
class _LimitField:
    fields: tuple[str, ...]
    parse: Callable[[ast.Quantity], Any]


LIMIT_NAMES: dict[str, _LimitField] = {
    "bytes_in": _LimitField(("max_bytes_in",), parse_size),
    "bytes_out": _LimitField(("max_bytes_out",), parse_size),
    "files": _LimitField(("max_files",), parse_int),
    "depth": _LimitField(("max_depth",), parse_int),
    "concurrency": _LimitField(("max_concurrency",), parse_int),
    "timeout": _LimitField(("timeout_ms",), parse_duration_ms),
    "cpu": _LimitField(("cpu_cores",), parse_float),
    "memory": _LimitField(("memory_bytes",), parse_size),
    "pids": _LimitField(("pids",), parse_int),
    "stdout": _LimitField(("max_stdout_bytes",), parse_size),
    "stderr": _LimitField(("max_stderr_bytes",), parse_size),
    "disk_write": _LimitField(("disk_write_bytes",), parse_size),
    "screenshot": _LimitField(("max_screenshot_width", "max_screenshot_height"), parse_dimension),
}
"""Limit names of the language and the ``Limits`` field(s) each one sets."""


def build_limits(
    blocks: Iterable[ast.LimitsBlock], diagnostics: list[Diagnostic], *,
    timeout: ast.Setting | None = None,
) -> Limits:
    """Read ``limits`` blocks (and a block-level ``timeout`` statement) into one ``Limits``.

    Unknown names are SBP213, bad units SBP205, a name given twice SBP201; the values that are
    fine are kept so later stages still see them.
    """
    values: dict[str, Any] = {}
    seen: dict[str, ast.Limit | ast.Setting] = {}
    items: list[tuple[str, ast.Quantity, ast.Limit | ast.Setting]] = []
    if timeout is not None and isinstance(timeout.value, ast.Quantity):
        items.append(("timeout", timeout.value, timeout))
    for block in blocks:
        items.extend((lim.name.value, lim.value, lim) for lim in block.items)
    for name, qty, node in items:
        spec = LIMIT_NAMES.get(name)
        if spec is None:
            diagnostics.append(Diagnostic.make(
                "SBP213", f"unknown limit `{name}`", node.span,
                help="limits: " + ", ".join(LIMIT_NAMES),
            ))
            continue
        if name in seen:
            diagnostics.append(Diagnostic.make(
                "SBP201", f"limit `{name}` is set twice", node.span,
                help=f"first set at {seen[name].span}",
            ))
            continue
        seen[name] = node
        try:
            parsed = spec.parse(qty)
        except ValueProblem as exc:
            diagnostics.append(Diagnostic.make(exc.diag_id, exc.message, qty.span))
            continue
        parts = parsed if isinstance(parsed, tuple) else (parsed,)
        for field_name, part in zip(spec.fields, parts, strict=True):
            values[field_name] = part
    return _validated(values, seen, diagnostics)


def _validated(values: dict[str, Any], nodes: dict[str, ast.Limit | ast.Setting],
               diagnostics: list[Diagnostic]) -> Limits:
    try:
        return Limits(**values)
    except ValidationError as exc:
        by_field = {f: n for n, spec in LIMIT_NAMES.items() for f in spec.fields}
        for err in exc.errors():
            field_name = str(err["loc"][0]) if err["loc"] else ""
            name = by_field.get(field_name, field_name)
            node = nodes.get(name)
            diagnostics.append(Diagnostic.make(
                "SBP213", f"invalid value for limit `{name}`: {err['msg'].lower()}",
                node.span if node is not None else None,
            ))
            values.pop(field_name, None)
        return Limits(**{k: v for k, v in values.items() if k in Limits.model_fields})
