"""Charts drawn on the server as SVG: no script, nothing a strict CSP has to allow."""

from __future__ import annotations

import time
from collections.abc import Sequence
from html import escape
from typing import Any

WIDTH, HEIGHT, PAD = 640, 180, 28


def series_svg(series: Sequence[dict[str, Any]], title: str) -> str:
    """Stacked bars per time bucket: allowed calls and refused calls."""
    if not series:
        return _empty(title)
    top = max(1, max(int(p["calls"]) for p in series))
    step = (WIDTH - 2 * PAD) / len(series)
    bars = []
    for i, point in enumerate(series):
        x = PAD + i * step
        calls, refused = int(point["calls"]), int(point["refused"])
        h_all = (HEIGHT - 2 * PAD) * calls / top
        h_ref = (HEIGHT - 2 * PAD) * refused / top
        when = time.strftime("%Y-%m-%d %H:%M", time.gmtime(int(point["at"]) / 1000))
        label = escape(f"{when} UTC: {calls} calls, {refused} refused")
        bars.append(
            f'<g><title>{label}</title>'
            f'<rect class="bar-ok" x="{x:.1f}" y="{HEIGHT - PAD - h_all:.1f}" '
            f'width="{max(1.0, step - 2):.1f}" height="{h_all:.1f}"/>'
            f'<rect class="bar-deny" x="{x:.1f}" y="{HEIGHT - PAD - h_ref:.1f}" '
            f'width="{max(1.0, step - 2):.1f}" height="{h_ref:.1f}"/></g>')
    return (f'<svg role="img" aria-label="{escape(title)}" viewBox="0 0 {WIDTH} {HEIGHT}" '
            f'class="chart"><title>{escape(title)}</title>'
            f'<text x="{PAD}" y="16" class="axis">max {top} calls per bucket</text>'
            + "".join(bars) + "</svg>")


def bars_svg(rows: Sequence[tuple[str, int]], title: str) -> str:
    """Horizontal bars, one per label (refusals by code or by rule)."""
    if not rows:
        return _empty(title)
    top = max(1, max(n for _, n in rows))
    line = 22
    height = PAD + line * len(rows)
    parts = []
    for i, (label, n) in enumerate(rows):
        y = 10 + i * line
        w = (WIDTH - 260) * n / top
        parts.append(f'<text x="0" y="{y + 14}" class="axis">{escape(label[:40])}</text>'
                     f'<rect class="bar-deny" x="250" y="{y}" width="{w:.1f}" height="16">'
                     f'<title>{escape(label)}: {n}</title></rect>'
                     f'<text x="{254 + w:.1f}" y="{y + 13}" class="axis">{n}</text>')
    return (f'<svg role="img" aria-label="{escape(title)}" viewBox="0 0 {WIDTH} {height}" '
            f'class="chart"><title>{escape(title)}</title>' + "".join(parts) + "</svg>")


def _empty(title: str) -> str:
    return (f'<svg role="img" aria-label="{escape(title)}: no data" viewBox="0 0 {WIDTH} 40" '
            f'class="chart"><text x="{PAD}" y="24" class="axis">no data</text></svg>')
