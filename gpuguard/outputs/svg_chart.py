"""Line charts of time series as standalone SVG, drawn by gpuguard itself.

Why: `gpuguard qualify --chart FILE` draws power, clocks and temperatures over the run and
the status page (issue 31) draws each GPU's last hour; gpuguard ships no plotting
dependency (no matplotlib), and the page is served under a strict Content-Security-Policy.
So a chart is elements and presentation attributes only: no script, no event attribute,
no style, no href, no font to fetch; every text escaped (a GPU name is host input). Classes
(`plot`, `grid`, `limit`, `band`, `series`, ...) let a page's stylesheet restyle it (dark).
Bounded: at most MAX_DRAWN points drawn per series, the lowest and highest of each pixel
column so a one-sample spike survives. Deterministic: same input, same bytes.
"""

from __future__ import annotations

import dataclasses
import html
import math
import re
from collections.abc import Sequence

Point = tuple[float, float | None]
XY = tuple[float, float]
Tick = tuple[float, str]  # a value and its label

# Okabe-Ito, the colour-blind-safe set; yellow last: it is faint on white
PALETTE = ("#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9",
           "#000000", "#F0E442")
MAX_DRAWN = 1000      # points per series, gaps included
MAX_ABS = 1e15        # beyond this a value is not a reading: dropped like an infinity
TEXT_MAX = 80         # characters of a title or label; hostile input stays bounded
NAME_MAX = 40         # characters of a legend entry
LEFT, RIGHT, TITLE_H, HEAD_H, ROW_H, GAP, BOTTOM = 60, 16, 30, 20, 16, 14, 40
# characters XML 1.0 forbids even escaped (NUL, ESC, lone surrogates, U+FFFE): a GPU
# name holding one would make the whole document unreadable
_NOT_XML = re.compile("[^\t\n\r\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")


@dataclasses.dataclass(frozen=True)
class Series:
    """x: seconds since the run began; y None or NaN: a gap (a break in the line)."""
    name: str
    points: Sequence[Point]
    unit: str = ""


@dataclasses.dataclass(frozen=True)
class Limit:
    """A dashed horizontal line at value, e.g. the enforced power limit."""
    label: str
    value: float


@dataclasses.dataclass(frozen=True)
class Band:
    """A shaded span of x across every panel, e.g. a phase of the run."""
    label: str
    x0: float
    x1: float


@dataclasses.dataclass(frozen=True)
class Panel:
    title: str
    unit: str
    series: Sequence[Series]
    limits: Sequence[Limit] = ()


@dataclasses.dataclass(frozen=True)
class Frame:
    """A panel's plot area in pixels and the data range it shows."""
    left: float
    top: float
    width: float
    height: float
    xs: XY  # the x range shown, left to right
    ys: XY  # the y range shown, bottom to top

    def px(self, x: float) -> float:
        return self.left + (x - self.xs[0]) / ((self.xs[1] - self.xs[0]) or 1.0) * self.width

    def py(self, y: float) -> float:
        return self.top + (self.ys[1] - y) / ((self.ys[1] - self.ys[0]) or 1.0) * self.height


def text(value: str, limit: int = TEXT_MAX) -> str:
    """value as element content: one line, at most limit characters, escaped."""
    one = " ".join(_NOT_XML.sub("\ufffd", value).split())
    if len(one) > limit:
        one = one[:max(1, limit - 1)] + "\u2026"
    # quotes too, so the text stays safe if it is ever moved into an attribute
    return html.escape(one, quote=True)


def num(value: float) -> str:
    """A coordinate: at most one decimal, no trailing .0, no -0."""
    out = f"{value:.1f}".removesuffix(".0")
    return "0" if out == "-0" else out


def label(cls: str, x: float, y: float, content: str, size: int = 11, anchor: str = "start",
          extra: str = "") -> str:
    """A <text> element; content is already escaped (text() or a number)."""
    return (f'<text class="{cls}" x="{num(x)}" y="{num(y)}" font-size="{size}" '
            f'text-anchor="{anchor}" fill="#333"{extra}>{content}</text>')


def usable(value: float) -> bool:
    return math.isfinite(value) and abs(value) <= MAX_ABS


def nice_ticks(lo: float, hi: float, count: int) -> list[Tick]:
    """Round ticks (1, 2 or 5 times a power of ten) from at or below lo to at or above hi,
    about count intervals, each with its label."""
    if hi <= lo:  # a constant series: a band around it, never a division by zero
        pad = abs(lo) * 0.05 or 1.0
        lo, hi = lo - pad, hi + pad
    raw = (hi - lo) / max(1, count)
    mag = 10.0 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 5, 10) if raw <= m * mag * (1 + 1e-9))
    first, last = math.floor(lo / step + 1e-9), math.ceil(hi / step - 1e-9)
    decimals = max(0, -math.floor(math.log10(step) + 1e-9))
    values = [k * step for k in range(first, last + 1)]
    if not 0 < last - first <= 4 * count + 4:  # precision lost at this magnitude
        values, decimals = [lo, hi], 6
    labels = (f"{v:.{decimals}f}" for v in values)
    return [(float(t), t.lstrip("-") if float(t) == 0 else t) for t in labels]


def clean(points: Sequence[Point], x_range: tuple[float, float] | None) -> list[Point]:
    """Usable points sorted by x; a gap kept as y None; infinities dropped."""
    kept: list[Point] = []
    for x, y in points:
        if not usable(x) or (x_range is not None and not x_range[0] <= x <= x_range[1]):
            continue
        if y is None or math.isnan(y):
            kept.append((x, None))
        elif usable(y):
            kept.append((x, y))
    kept.sort(key=lambda p: p[0])
    return kept


class Reducer:
    """Keeps the lowest and highest point of each bucket; a gap cuts the line. At most
    one cut at the first gap of a bucket and one at its end: at most 4 points a bucket."""

    def __init__(self) -> None:
        self.segments: list[list[XY]] = [[]]
        self.bucket = -1
        self.low: XY | None = None
        self.high: XY | None = None
        self.broken = False    # this bucket's first gap already cut the line
        self.trailing = False  # a later gap of this bucket has no point after it

    def add(self, bucket: int, x: float, y: float | None) -> None:
        if bucket != self.bucket:
            self.close_bucket()
            self.bucket = bucket
        if y is None:
            self.trailing = self.broken
            if not self.broken:
                self.flush(cut=True)
                self.broken = True
            return
        self.trailing = False
        if self.low is None or y < self.low[1]:
            self.low = (x, y)
        if self.high is None or y > self.high[1]:
            self.high = (x, y)

    def flush(self, cut: bool = False) -> None:
        kept = [p for p in (self.low, self.high) if p is not None]
        if len(kept) == 2 and kept[0] == kept[1]:
            kept.pop()
        self.segments[-1].extend(sorted(kept, key=lambda p: p[0]))
        self.low = self.high = None
        if cut and self.segments[-1]:
            self.segments.append([])

    def close_bucket(self) -> None:
        self.flush(cut=self.trailing)
        self.broken = self.trailing = False

    def finish(self) -> list[list[XY]]:
        self.close_bucket()
        return [s for s in self.segments if s]


def reduce_points(points: Sequence[Point], xs: XY, columns: int) -> list[list[XY]]:
    """The segments to draw: at most MAX_DRAWN points in all, one bucket a pixel column."""
    per_bucket = 4 if any(y is None for _, y in points) else 2
    buckets = max(1, min(MAX_DRAWN // per_bucket, columns))
    x0, span = xs[0], (xs[1] - xs[0]) or 1.0
    reducer = Reducer()
    for x, y in points:
        reducer.add(min(buckets - 1, max(0, int((x - x0) / span * buckets))), x, y)
    return reducer.finish()


def legend(panel: Panel, width: int) -> list[tuple[float, int, str]]:
    """(x, row, escaped label) per series, wrapped to the chart's width."""
    placed: list[tuple[float, int, str]] = []
    x, row = float(LEFT), 0
    for series in panel.series:
        unit = f" ({series.unit})" if series.unit and series.unit != panel.unit else ""
        entry = text(series.name + unit, NAME_MAX)
        # the width of the unescaped text: a swatch, the name, a space before the next
        size = 22 + min(len(series.name + unit), NAME_MAX) * 6.6 + 14
        if x > LEFT and x + size > width - RIGHT:
            x, row = float(LEFT), row + 1
        placed.append((x, row, entry))
        x += size
    return placed


def draw_legend(panel: Panel, width: int, top: float) -> tuple[list[str], float]:
    """The panel's title and legend, and the height they take."""
    unit = f" ({panel.unit})" if panel.unit else ""
    out = [label("panel-title", LEFT, top + 14, text(panel.title + unit, (width - LEFT) // 8), 13,
                 extra=' font-weight="bold"')]
    placed = legend(panel, width)
    for i, (x, row, name) in enumerate(placed):
        y = top + HEAD_H + row * ROW_H + 8
        colour = PALETTE[i % len(PALETTE)]
        out.append(f'<g class="legend"><line x1="{num(x)}" y1="{num(y - 4)}" '
                   f'x2="{num(x + 16)}" y2="{num(y - 4)}" stroke="{colour}" '
                   f'stroke-width="2.5"/>{label("legend-label", x + 22, y, name)}</g>')
    rows = 1 + max((row for _, row, _ in placed), default=-1)
    return out, HEAD_H + rows * ROW_H + 4


def band_spans(frame: Frame, bands: Sequence[Band]) -> list[tuple[int, float, float, str]]:
    """(index, left px, right px, label) of each band that is inside the x range."""
    spans = []
    for i, band in enumerate(bands):
        lo, hi = max(band.x0, frame.xs[0]), min(band.x1, frame.xs[1])
        if usable(lo) and usable(hi) and hi > lo:
            spans.append((i, frame.px(lo), frame.px(hi), band.label))
    return spans


def band_labels(frame: Frame, bands: Sequence[Band], y: float) -> list[str]:
    """Each band's label under the x axis, centred on it, cut to fit (never over data)."""
    out = []
    for _, left, right, name in band_spans(frame, bands):
        room = int((right - left - 4) / 6)
        if room >= 2:
            out.append(label("band-label", (left + right) / 2, y,
                             text(name, min(room, NAME_MAX)), 10, "middle"))
    return out


def draw_grid(frame: Frame, yticks: list[Tick], xticks: list[Tick]) -> list[str]:
    out: list[str] = []
    right, bottom = frame.left + frame.width, frame.top + frame.height
    for t, tick in yticks:
        y = num(frame.py(t))
        out.append(f'<line class="grid" x1="{num(frame.left)}" y1="{y}" x2="{num(right)}" '
                   f'y2="{y}" stroke="#dddddd"/>'
                   + label("y-tick", frame.left - 6, frame.py(t) + 4, tick, anchor="end"))
    for t, _ in xticks:
        x = num(frame.px(t))
        out.append(f'<line class="grid" x1="{x}" y1="{num(frame.top)}" x2="{x}" '
                   f'y2="{num(bottom)}" stroke="#dddddd"/>')
    return out


def draw_limits(frame: Frame, limits: Sequence[Limit]) -> list[str]:
    out: list[str] = []
    right = frame.left + frame.width
    for limit in limits:
        if not usable(limit.value):
            continue
        y = frame.py(limit.value)
        # below the line when it is at the top, so the label stays inside the plot
        label_y = y + 12 if y - frame.top < 14 else y - 4
        out.append(f'<line class="limit" x1="{num(frame.left)}" y1="{num(y)}" '
                   f'x2="{num(right)}" y2="{num(y)}" stroke="#333333" '
                   f'stroke-width="1" stroke-dasharray="6 4"/>'
                   + label("limit-label", right - 4, label_y, text(limit.label), 10, "end"))
    return out


def draw_series(frame: Frame, series: Series, points: list[Point], colour: str) -> str:
    parts = [f'<g class="series" stroke="{colour}" fill="none" stroke-width="1.5" '
             f'stroke-linejoin="round"><title>{text(series.name)}</title>']
    for seg in reduce_points(points, frame.xs, int(frame.width)):
        coords = [(num(frame.px(x)), num(frame.py(y))) for x, y in seg]
        if len(coords) == 1:  # a sample alone between gaps: a dot, not nothing
            parts.append(f'<circle cx="{coords[0][0]}" cy="{coords[0][1]}" r="1.5" '
                         f'fill="{colour}"/>')
        else:
            joined = " ".join(f"{x},{y}" for x, y in coords)
            parts.append(f'<polyline points="{joined}"/>')
    return "".join(parts) + "</g>"


def draw_panel(panel: Panel, cleaned: list[list[Point]], frame: Frame,
               xticks: list[Tick], bands: Sequence[Band]) -> list[str]:
    """One panel's plot; frame's y range is ignored when the panel has no data."""
    out = [f'<rect class="plot" x="{num(frame.left)}" y="{num(frame.top)}" '
           f'width="{num(frame.width)}" height="{num(frame.height)}" fill="none" '
           f'stroke="#999999"/>']
    out += [f'<rect class="band" x="{num(left)}" y="{num(frame.top)}" '
            f'width="{num(right - left)}" height="{num(frame.height)}" fill="#000000" '
            f'fill-opacity="{"0.1" if i % 2 else "0.05"}"/>'
            for i, left, right, _ in band_spans(frame, bands)]
    ys = [y for pts in cleaned for _, y in pts if y is not None]
    if not ys:
        return [*out, label("no-data", frame.left + frame.width / 2,
                            frame.top + frame.height / 2 + 5, "no data", 13, "middle")]
    ys += [lim.value for lim in panel.limits if usable(lim.value)]
    yticks = nice_ticks(min(ys), max(ys), max(2, int(frame.height // 40)))
    framed = dataclasses.replace(frame, ys=(yticks[0][0], yticks[-1][0]))
    out += draw_grid(framed, yticks, xticks)
    out += draw_limits(framed, panel.limits)
    for i, (series, pts) in enumerate(zip(panel.series, cleaned, strict=True)):
        out.append(draw_series(framed, series, pts, PALETTE[i % len(PALETTE)]))
    return out


def x_axis(cleaned: list[list[list[Point]]], bands: Sequence[Band],
           x_range: tuple[float, float] | None,
           plot_w: int) -> tuple[float, float, list[Tick]]:
    """The x range drawn (x_range, else the data's and the bands' made round) and its
    ticks; no ticks without data."""
    if x_range is None:
        xs = [x for panel in cleaned for pts in panel for x, _ in pts]
        xs += [x for b in bands for x in (b.x0, b.x1) if usable(x)]
        ticks = nice_ticks(min(xs), max(xs), max(2, plot_w // 90)) if xs else []
        return (ticks[0][0], ticks[-1][0], ticks) if ticks else (0.0, 1.0, [])
    lo, hi = x_range
    ticks = nice_ticks(lo, hi, max(2, plot_w // 90))
    eps = (hi - lo) * 1e-9
    return lo, hi, [t for t in ticks if lo - eps <= t[0] <= hi + eps]


def check_size(width: int, panel_height: int, x_range: tuple[float, float] | None) -> None:
    if not 240 <= width <= 10000 or not 40 <= panel_height <= 4000:
        raise ValueError(f"chart size {width}x{panel_height}: width 240..10000, "
                         "panel height 40..4000")
    if x_range is not None and not (usable(x_range[0]) and usable(x_range[1])
                                    and x_range[0] < x_range[1]):
        raise ValueError(f"x_range {x_range}: two finite values, low first")


def draw_footer(frame: Frame, xticks: list[Tick], x_label: str,
                bands: Sequence[Band], any_panel: bool) -> list[str]:
    """Under the last panel: x ticks, the bands' names, the x label; for no panel "no data"."""
    bottom = frame.top + frame.height
    labels = band_labels(frame, bands, bottom + 28)
    if not any_panel:
        return [label("no-data", frame.left + frame.width / 2, TITLE_H + 20, "no data", 13,
                      "middle")]
    out = [label("x-tick", frame.px(t), bottom + 14, tick, anchor="middle") for t, tick in xticks]
    if xticks:
        out.append(label("axis-label", frame.left + frame.width / 2,
                         bottom + (44 if labels else 30), text(x_label), anchor="middle"))
    return out + labels


def chart(panels: Sequence[Panel], title: str, *, bands: Sequence[Band] = (),
          width: int = 800, panel_height: int = 160,
          x_range: tuple[float, float] | None = None,
          x_label: str = "seconds since start", standalone: bool = True) -> str:
    """A whole SVG document (what `--chart FILE` writes), or with standalone False the
    <svg> element alone, to inline in a page. Panels are stacked and share the x axis
    (x_range fixes it, else the data's); panel_height is each plot area's height."""
    check_size(width, panel_height, x_range)
    plot_w = width - LEFT - RIGHT
    cleaned = [[clean(s.points, x_range) for s in p.series] for p in panels]
    x0, x1, xticks = x_axis(cleaned, bands, x_range, plot_w)
    body: list[str] = []
    frame = Frame(LEFT, TITLE_H, plot_w, 0, (x0, x1), (0, 1))
    for i, (panel, pts) in enumerate(zip(panels, cleaned, strict=True)):
        top = frame.top + frame.height + (GAP if i else 0)
        legend_lines, head_h = draw_legend(panel, width, top)
        frame = Frame(LEFT, top + head_h, plot_w, panel_height, (x0, x1), (0, 1))
        body += legend_lines + draw_panel(panel, pts, frame, xticks, bands)
    body += draw_footer(frame, xticks, x_label, bands, bool(panels))
    height = math.ceil(frame.top + frame.height + BOTTOM + (14 if panels and bands else 0))
    declaration = '<?xml version="1.0" encoding="UTF-8"?>\n' if standalone else ""
    return (declaration + f'<svg xmlns="http://www.w3.org/2000/svg" class="gpuguard-chart" '
            f'width="{width}" height="{height}" viewBox="0 0 {width} {height}" '
            f'role="img" font-family="sans-serif"><title>{text(title)}</title>'
            f'<rect class="background" x="0" y="0" width="{width}" height="{height}" '
            f'fill="#ffffff"/>'
            + label("title", LEFT, 20, text(title, (width - LEFT) // 9), 15,
                    extra=' font-weight="bold"') + "\n"
            + "\n".join(body) + "\n</svg>" + ("\n" if standalone else ""))
