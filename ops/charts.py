"""Charts drawn on the server as inline SVG: no script, no inline style (the CSP allows
neither), colour never the only signal.

Every series has a fill pattern (solid, hatched, dotted, cross-hatched) or a line dash and
marker shape, and its name in the legend beside a swatch drawn the same way. Every chart has a
<title> and a <desc> that summarise it in words, and the template puts the numbers behind it in
a table. Colours and patterns come from ops.css through classes.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from django.utils.html import escape, format_html
from django.utils.safestring import SafeString, mark_safe

WIDTH, HEIGHT = 480, 240
LEFT, RIGHT, TOP, BOTTOM = 66, 8, 12, 30
PATTERNS = ("solid", "hatch", "dots", "cross")
LINE_STYLES = ("solid", "dashed", "dotted")
MARKERS = ("circle", "square", "triangle")


@dataclass
class Series:
    name: str
    values: list[float | None]

    @property
    def total(self) -> float:
        return sum(v for v in self.values if v is not None)


@dataclass
class Chart:
    key: str
    title: str
    kind: str  # "stacked" bars or "lines"
    labels: list[str]
    series: list[Series]
    unit: str = ""
    summary: str = ""
    bucket_word: str = "minute"
    notes: list[str] = field(default_factory=list)

    @property
    def is_empty(self) -> bool:
        return all(not s.total for s in self.series)

    def svg(self) -> SafeString:
        return render(self)

    def legend(self) -> list[tuple[str, SafeString]]:
        return [(s.name, swatch(self, i)) for i, s in enumerate(self.series)]

    def table_rows(self) -> list[tuple[str, list[str]]]:
        """The text alternative's rows: buckets where something happened (empty ones left out,
        as the caption says)."""
        rows = []
        for i, label in enumerate(self.labels):
            values = [s.values[i] for s in self.series]
            if any(v for v in values):
                rows.append((label, [fmt(v, self.unit) for v in values]))
        return rows


def fmt(value: float | None, unit: str = "") -> str:
    if value is None:
        return "–"
    if unit == "s":
        return seconds_text(value)
    return f"{value:,.0f}" if float(value).is_integer() else f"{value:,.2f}"


def seconds_text(value: float) -> str:
    if value < 1:
        return f"{value * 1000:.0f} ms"
    if value < 120:
        return f"{value:.1f} s"
    if value < 7200:
        return f"{value / 60:.0f} min"
    return f"{value / 3600:.1f} h"


def nice_max(value: float) -> float:
    if value <= 0:
        return 1.0
    exponent = 10 ** math.floor(math.log10(value))
    for step in (1, 2, 2.5, 5, 10):
        if value <= step * exponent:
            return step * exponent
    return 10 * exponent


# Tops whose quarters read well: 15 s, 2.5 min, 15 min, 1.5 h …
NICE_SECONDS = (1, 2, 4, 10, 20, 40, 60, 120, 240, 600, 1200, 2400, 3600, 7200, 14400, 21600,
                43200, 86400, 172800, 345600, 604800)


def nice_max_seconds(value: float) -> float:
    """A top for a duration axis whose quarters read well (15 min, 1 h, …)."""
    if value < 1:
        return nice_max(value)
    for step in NICE_SECONDS:
        if value <= step:
            return float(step)
    return nice_max(value)


def _plot_box() -> tuple[float, float, float, float]:
    return LEFT, TOP, WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM


def _defs(chart: Chart) -> str:
    k = escape(chart.key)
    return (
        "<defs>"
        f'<pattern id="{k}-p-hatch" width="6" height="6" patternUnits="userSpaceOnUse" '
        'patternTransform="rotate(45)"><rect class="pat-bg s1" width="6" height="6"/>'
        '<line class="pat-ink" x1="0" y1="0" x2="0" y2="6" stroke-width="3"/></pattern>'
        f'<pattern id="{k}-p-dots" width="5" height="5" patternUnits="userSpaceOnUse">'
        '<rect class="pat-bg s2" width="5" height="5"/>'
        '<circle class="pat-dot" cx="2.5" cy="2.5" r="1.3"/></pattern>'
        f'<pattern id="{k}-p-cross" width="6" height="6" patternUnits="userSpaceOnUse">'
        '<rect class="pat-bg s3" width="6" height="6"/>'
        '<path class="pat-ink" d="M0 0L6 6M6 0L0 6" stroke-width="1"/></pattern>'
        "</defs>"
    )


def _fill(chart: Chart, index: int) -> str:
    pattern = PATTERNS[index % len(PATTERNS)]
    if pattern == "solid":
        return 'class="bar s0"'
    return f'class="bar s{index % len(PATTERNS)}" fill="url(#{escape(chart.key)}-p-{pattern})"'


def _axes(chart: Chart, top: float) -> str:
    x0, y0, w, h = _plot_box()
    parts = []
    for step in range(5):
        value = top * step / 4
        y = y0 + h - h * step / 4
        parts.append(f'<line class="grid" x1="{x0}" y1="{y:.1f}" x2="{x0 + w}" y2="{y:.1f}"/>')
        parts.append(f'<text class="tick" x="{x0 - 4}" y="{y + 5:.1f}" text-anchor="end">'
                     f"{escape(_tick(value, chart.unit))}</text>")
    n = len(chart.labels)
    every = max(1, math.ceil(n / 5))
    for i, label in enumerate(chart.labels):
        last = i == n - 1
        if (i % every == 0 and n - 1 - i >= every / 2) or last:
            x = x0 + w * (i + 0.5) / n
            anchor = "end" if last else "start" if i == 0 else "middle"
            x = x0 + w if last else x0 if i == 0 else x
            parts.append(f'<text class="tick" x="{x:.1f}" y="{HEIGHT - 8}" '
                         f'text-anchor="{anchor}">{escape(label)}</text>')
    parts.append(f'<line class="axis" x1="{x0}" y1="{y0 + h}" x2="{x0 + w}" y2="{y0 + h}"/>')
    return "".join(parts)


def _tick(value: float, unit: str) -> str:
    if unit == "s":
        if not value:
            return "0"
        if value < 1:
            return f"{value * 1000:g} ms"
        if value < 120:
            return f"{value:g} s"
        if value < 7200:
            return f"{round(value / 60, 1):g} min"
        return f"{round(value / 3600, 1):g} h"
    return f"{value:g}" if value < 10_000 else f"{value / 1000:g}k"


def _bars(chart: Chart, top: float) -> str:
    x0, y0, w, h = _plot_box()
    n = len(chart.labels)
    slot = w / n
    width = max(slot * 0.72, 1.0)
    parts = []
    for i in range(n):
        base = 0.0
        for index, series in enumerate(chart.series):
            value = series.values[i] or 0
            if not value:
                continue
            y_top = y0 + h - h * (base + value) / top
            height = h * value / top
            parts.append(
                f'<rect {_fill(chart, index)} x="{x0 + slot * i + (slot - width) / 2:.1f}" '
                f'y="{y_top:.1f}" width="{width:.1f}" height="{max(height, 0.5):.1f}">'
                f"<title>{escape(chart.labels[i])}: {escape(series.name)} "
                f"{escape(fmt(value, chart.unit))}</title></rect>")
            base += value
    return "".join(parts)


def _marker(shape: str, x: float, y: float, css: str) -> str:
    if shape == "square":
        return f'<rect class="{css}" x="{x - 3:.1f}" y="{y - 3:.1f}" width="6" height="6"/>'
    if shape == "triangle":
        return (f'<path class="{css}" d="M{x:.1f} {y - 4:.1f}L{x + 4:.1f} {y + 3:.1f}'
                f'L{x - 4:.1f} {y + 3:.1f}Z"/>')
    return f'<circle class="{css}" cx="{x:.1f}" cy="{y:.1f}" r="3.2"/>'


def _lines(chart: Chart, top: float) -> str:
    x0, y0, w, h = _plot_box()
    n = len(chart.labels)
    parts = []
    for index, series in enumerate(chart.series):
        style = LINE_STYLES[index % len(LINE_STYLES)]
        shape = MARKERS[index % len(MARKERS)]
        css = f"line l{index % 3} {style}"
        points: list[tuple[float, float, float]] = []
        for i, value in enumerate(series.values):
            if value is None:
                if len(points) > 1:
                    parts.append(_polyline(points, css))
                elif points:
                    pass
                parts.extend(_marker(shape, x, y, f"marker l{index % 3}") for x, y, _ in points)
                points = []
                continue
            points.append((x0 + w * (i + 0.5) / n, y0 + h - h * value / top, value))
        if len(points) > 1:
            parts.append(_polyline(points, css))
        parts.extend(_marker(shape, x, y, f"marker l{index % 3}") for x, y, _ in points)
    return "".join(parts)


def _polyline(points: Sequence[tuple[float, float, float]], css: str) -> str:
    coords = " ".join(f"{x:.1f},{y:.1f}" for x, y, _ in points)
    return f'<polyline class="{css}" points="{coords}"/>'


def render(chart: Chart) -> SafeString:
    if chart.kind == "stacked":
        peak = max((sum(s.values[i] or 0 for s in chart.series) for i in range(len(chart.labels))),
                   default=0)
    else:
        peak = max((v or 0 for s in chart.series for v in s.values), default=0)
    top = nice_max_seconds(float(peak)) if chart.unit == "s" else nice_max(float(peak))
    body = _bars(chart, top) if chart.kind == "stacked" else _lines(chart, top)
    k = escape(chart.key)
    svg = (
        f'<svg class="chart" viewBox="0 0 {WIDTH} {HEIGHT}" role="img" '
        f'aria-labelledby="{k}-title {k}-desc" preserveAspectRatio="xMidYMid meet" '
        f'xmlns="http://www.w3.org/2000/svg">'
        f'<title id="{k}-title">{escape(chart.title)}</title>'
        f'<desc id="{k}-desc">{escape(chart.summary)}</desc>'
        f"{_defs(chart)}{_axes(chart, top)}{body}</svg>"
    )
    return mark_safe(svg)  # noqa: S308 - every text above went through escape()


def swatch(chart: Chart, index: int) -> SafeString:
    """The legend's sample of a series, drawn like the series itself."""
    k = f"{chart.key}-key{index}"
    if chart.kind == "stacked":
        fill = _fill(chart, index)
        return format_html(
            '<svg class="swatch" viewBox="0 0 16 16" aria-hidden="true" focusable="false">'
            '<rect {} x="1" y="1" width="14" height="14"/></svg>', mark_safe(fill))  # noqa: S308
    style = LINE_STYLES[index % len(LINE_STYLES)]
    shape = MARKERS[index % len(MARKERS)]
    marker = _marker(shape, 14, 8, f"marker l{index % 3}")
    return format_html(
        '<svg class="swatch swatch-line" id="{}" viewBox="0 0 28 16" aria-hidden="true" '
        'focusable="false"><line class="line l{} {}" x1="1" y1="8" x2="27" y2="8"/>{}</svg>',
        k, index % 3, style, mark_safe(marker))  # noqa: S308
