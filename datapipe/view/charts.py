"""Chart geometry for the templates, which draw it as inline SVG (no charting script, nothing fetched).

A histogram's bars are links to the documents in their range, so it works without JavaScript;
``static/view.js`` adds selecting a range by dragging across it. Thresholds are drawn as lines.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

from datapipe.view.listing import Histogram
from datapipe.view.thresholds import Threshold

WIDTH, HEIGHT, PAD_L, PAD_B, PAD_T = 720, 180, 48, 34, 18


def fmt(v: float) -> str:
    """A number for an axis or a link: whole numbers whole, others to 4 significant digits."""
    if v is None:
        return ""
    if float(v).is_integer() and abs(v) < 1e15:
        return f"{int(v):,}"
    return f"{v:.4g}"


@dataclass
class Bar:
    x: float
    y: float
    w: float
    h: float
    title: str
    href: str
    selected: bool = False


@dataclass
class Line:
    x: float
    label: str
    y: float = 0.0  # where its label goes


@dataclass
class HistChart:
    column: str
    width: int
    height: int
    plot_left: int
    plot_bottom: int
    bars: list[Bar]
    ticks: list[Line]
    thresholds: list[Line]
    edges: list[float]
    log: bool
    top: float
    exact: bool
    note: str
    selection: tuple[float, float] | None = None
    hidden_thresholds: list[str] = field(default_factory=list)
    base: str = "/documents"  # the documents this chart is of: a dragged range is added to it
    lo: float = 0.0  # the axis: the values' range, widened to a threshold just beyond it
    hi: float = 1.0


def hist_chart(
    hist: Histogram,
    href: Callable[[float, float], str],
    thresholds: list[Threshold] = (),  # type: ignore[assignment]
    selected: tuple[float | None, float | None] = (None, None),
    width: int = WIDTH,
    height: int = HEIGHT,
    base: str = "/documents",
) -> HistChart:
    edges = hist.edges

    def tr(v: float) -> float:
        return math.log10(1.0 + max(v, 0.0)) if hist.log else v

    lo, hi = edges[0], edges[-1]
    near = (tr(hi) - tr(lo)) or 1.0
    for t in thresholds:  # a threshold just beyond the values (kept documents' min_chars) widens the axis to it
        if tr(lo) - near / 2 <= tr(t.value) < tr(lo):
            lo = t.value
        elif tr(hi) < tr(t.value) <= tr(hi) + near / 2:
            hi = t.value
    span = (tr(hi) - tr(lo)) or 1.0
    plot_w, plot_h = width - PAD_L - 8, height - PAD_B - PAD_T

    def x_of(v: float) -> float:
        return PAD_L + plot_w * (tr(min(max(v, lo), hi)) - tr(lo)) / span

    top = max(hist.counts, default=0.0) or 1.0
    sel_lo, sel_hi = selected
    bars = []
    for i, c in enumerate(hist.counts):
        a, b = edges[i], edges[i + 1]
        x0, x1 = x_of(a), x_of(b)
        h = plot_h * c / top
        inside = (sel_lo is not None or sel_hi is not None) and (sel_lo is None or b > sel_lo) and (sel_hi is None or a <= sel_hi)
        last = i == len(hist.counts) - 1
        title = f"{fmt(a)} to {fmt(b)}{'' if last else ' (excl.)'}: {'' if hist.exact else '≈'}{fmt(round(c))} documents"
        upper = b if last else _below(b, hist.integral)
        bars.append(Bar(x0 + 0.5, PAD_T + plot_h - h, max(x1 - x0 - 1.0, 1.0), max(h, 0.0), title, href(a, upper), inside))
    ticks = []
    step = max(1, len(edges) // 6)
    for i in range(0, len(edges), step):
        ticks.append(Line(x_of(edges[i]), fmt(edges[i])))
    lines, hidden = [], []
    for n, t in enumerate(thresholds):
        if lo <= t.value <= hi:
            lines.append(Line(x_of(t.value), t.label, PAD_T + 10 + 11 * (n % 4)))
        else:
            hidden.append(f"{t.label} (outside the values shown)")
    note = (
        ""
        if hist.exact
        else (f"estimated from {hist.files_read:,} of {hist.files_total:,} files ({hist.rows_read:,} documents read)")
    )
    selection = None
    if sel_lo is not None or sel_hi is not None:
        selection = (x_of(sel_lo if sel_lo is not None else lo), x_of(sel_hi if sel_hi is not None else hi))
    return HistChart(
        hist.column,
        width,
        height,
        PAD_L,
        PAD_T + plot_h,
        bars,
        ticks,
        lines,
        edges,
        hist.log,
        top,
        hist.exact,
        note,
        selection,
        hidden,
        base,
        lo,
        hi,
    )


def _below(v: float, integral: bool) -> float:
    """The largest value a bin that ends (exclusively) at ``v`` holds, for a link's inclusive upper bound:
    one less for whole numbers, else the float just below."""
    return v - 1 if integral and float(v).is_integer() else math.nextafter(v, -math.inf)


@dataclass
class Bars:
    """Horizontal bars, one per row, for a table column (widths in pixels)."""

    width: int
    rows: list[list[tuple[float, float, str]]]  # per row: (x, w, css class)


def bars(values: list[list[float]], classes: list[str], width: int = 180) -> Bars:
    top = max((sum(v) for v in values), default=0.0) or 1.0
    rows = []
    for v in values:
        x, parts = 0.0, []
        for value, cls in zip(v, classes):
            w = width * value / top
            if w > 0:
                parts.append((x, max(w, 0.5), cls))
            x += w
        rows.append(parts)
    return Bars(width, rows)
