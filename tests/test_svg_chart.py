"""gpuguard/outputs/svg_chart.py: the SVG is well formed, maps values where they belong,
breaks lines at gaps, keeps spikes through the reduction, stays bounded, escapes every text
and holds nothing a strict Content-Security-Policy would refuse (issues 29 and 31)."""

from __future__ import annotations

import math
import os
import re
import xml.etree.ElementTree as ET
from collections.abc import Sequence
from pathlib import Path

import pytest

from gpuguard.outputs.svg_chart import (
    MAX_DRAWN,
    NAME_MAX,
    PALETTE,
    Band,
    Limit,
    Panel,
    Series,
    chart,
    nice_ticks,
    reduce_points,
)
from tests.conftest import FIXTURES

NS = "{http://www.w3.org/2000/svg}"
EXPECTED = FIXTURES / "svg-chart" / "qualify-run.svg"
# GPUGUARD_TEST_WRITE_SVG=1 rewrites the expected file after a deliberate change of drawing
WRITE_EXPECTED = os.environ.get("GPUGUARD_TEST_WRITE_SVG") == "1"
HOSTILE = "<script>alert(1)</script>\" onload=\"x' &amp; </style>\x00\x1b[31m"
# every attribute the chart may write: presentation attributes, geometry, class, a11y
ALLOWED_ATTRIBUTES = {
    "class", "x", "y", "x1", "y1", "x2", "y2", "cx", "cy", "r", "width", "height",
    "viewBox", "points", "fill", "fill-opacity", "stroke", "stroke-width",
    "stroke-dasharray", "stroke-linejoin", "font-size", "font-weight", "font-family",
    "text-anchor", "role",
}
ALLOWED_ELEMENTS = {"svg", "title", "rect", "text", "line", "polyline", "circle", "g"}


def parse(svg: str) -> ET.Element:
    return ET.fromstring(svg.encode())


def local(tag: str) -> str:
    return tag.removeprefix(NS)


def by_class(root: ET.Element, cls: str) -> list[ET.Element]:
    return [e for e in root.iter() if e.get("class") == cls]


def plot_box(root: ET.Element, index: int = 0) -> tuple[float, float, float, float]:
    rect = by_class(root, "plot")[index]
    return (float(rect.get("x", "")), float(rect.get("y", "")),
            float(rect.get("width", "")), float(rect.get("height", "")))


def lines(root: ET.Element) -> list[list[tuple[float, float]]]:
    """Every polyline's points, in document order."""
    out = []
    for poly in root.iter(f"{NS}polyline"):
        pairs = [p.split(",") for p in poly.get("points", "").split()]
        out.append([(float(x), float(y)) for x, y in pairs])
    return out


def drawn(root: ET.Element) -> int:
    """Points drawn: polyline vertices and lone dots."""
    return sum(map(len, lines(root))) + len(list(root.iter(f"{NS}circle")))


def one_panel(points: list[tuple[float, float | None]], limits: Sequence[Limit] = (),
              panel_height: int = 160,
              x_range: tuple[float, float] | None = None) -> ET.Element:
    panel = Panel("power", "W", [Series("GPU 0", points, "W")], limits)
    return parse(chart([panel], "run", panel_height=panel_height, x_range=x_range))


def texts(root: ET.Element, cls: str) -> list[str]:
    return ["".join(e.itertext()) for e in by_class(root, cls)]


def test_a_whole_document_with_a_view_box_and_a_title() -> None:
    svg = chart([Panel("power", "W", [Series("p", [(0, 1.0), (1, 2.0)])])], "GPU 0",
                width=640, panel_height=120)
    assert svg.startswith('<?xml version="1.0" encoding="UTF-8"?>\n<svg ')
    root = parse(svg)
    assert local(root.tag) == "svg"
    height = root.get("height")
    assert root.get("width") == "640" and root.get("viewBox") == f"0 0 640 {height}"
    assert local(root[0].tag) == "title" and root[0].text == "GPU 0"
    assert plot_box(root)[3] == 120


def test_inline_element_has_no_declaration() -> None:
    svg = chart([], "x", standalone=False)
    assert svg.startswith("<svg ") and svg.endswith("</svg>")
    assert local(parse(svg).tag) == "svg"


def test_values_map_to_the_plot_area_corners() -> None:
    root = one_panel([(0, 0.0), (50, 50.0), (100, 100.0)], panel_height=200)
    left, top, width, height = plot_box(root)
    [line] = lines(root)
    # 0..100 are round: the axis ends exactly there; the top value lands at the top
    assert line == [(left, top + height), (left + width / 2, top + height / 2),
                    (left + width, top)]
    assert texts(root, "y-tick") == ["0", "20", "40", "60", "80", "100"]
    assert texts(root, "x-tick") == ["0", "20", "40", "60", "80", "100"]


def test_points_out_of_order_are_drawn_left_to_right() -> None:
    root = one_panel([(100, 100.0), (0, 0.0), (50, 50.0)], panel_height=200)
    [line] = lines(root)
    assert [x for x, _ in line] == sorted(x for x, _ in line)
    assert line[0][1] > line[-1][1]


@pytest.mark.parametrize("gap", [None, math.nan])
def test_a_gap_breaks_the_line_and_is_never_zero(gap: float | None) -> None:
    root = one_panel([(0, 10.0), (1, 20.0), (2, gap), (3, 30.0), (4, 40.0)])
    _, top, _, height = plot_box(root)
    first, second = lines(root)
    assert len(first) == 2 and len(second) == 2
    assert first[-1][0] < second[0][0]
    # a zero would have stretched the axis down and added a point
    assert texts(root, "y-tick")[0] == "10"
    assert all(top <= y <= top + height for _, y in first + second)


def test_a_sample_alone_between_gaps_is_a_dot() -> None:
    root = one_panel([(0, 1.0), (1, 2.0), (2, None), (3, 5.0), (4, None), (5, 3.0), (6, 4.0)])
    assert len(lines(root)) == 2
    [dot] = root.iter(f"{NS}circle")
    assert float(dot.get("cy", "")) == plot_box(root)[1]  # 5 is the axis' top


def test_gaps_inside_one_pixel_column_still_break_the_line() -> None:
    # column 0 ends on a gap: its last point must not join column 1's first
    points: list[tuple[float, float | None]] = [
        (0.0, 1.0), (0.1, None), (0.2, 2.0), (0.3, None), (1.0, 3.0), (1.1, 4.0)]
    assert reduce_points(points, (0.0, 2.0), 2) == [
        [(0.0, 1.0)], [(0.2, 2.0)], [(1.0, 3.0), (1.1, 4.0)]]


def test_alternating_gaps_in_one_column_cut_it_at_most_twice() -> None:
    points: list[tuple[float, float | None]] = [
        (i / 1000, None if i % 2 else float(i)) for i in range(1000)]
    segments = reduce_points(points, (0.0, 1.0), 1)
    assert segments == [[(0.0, 0.0)], [(0.002, 2.0), (0.998, 998.0)]]


def spiky() -> list[tuple[float, float | None]]:
    points: list[tuple[float, float | None]] = [(i * 0.01, 100.0 + i % 10)
                                                for i in range(100_000)]
    points[54_321] = (543.21, 800.0)
    points[12_345] = (123.45, 0.0)
    return points


def test_a_spike_in_100000_points_survives_and_the_drawing_is_bounded() -> None:
    svg = chart([Panel("power", "W", [Series("p", spiky())])], "run")
    root = parse(svg)
    left, top, width, height = plot_box(root)
    [line] = lines(root)
    assert 100 < len(line) <= MAX_DRAWN
    high = min(line, key=lambda p: p[1])
    low = max(line, key=lambda p: p[1])
    assert high[1] == top and low[1] == top + height  # 0..800 is the axis
    span = 1000.0  # 0..999.99 rounds to 0..1000
    bucket = width / (MAX_DRAWN // 2)
    assert abs(high[0] - (left + 543.21 / span * width)) <= bucket
    assert abs(low[0] - (left + 123.45 / span * width)) <= bucket
    assert len(svg) < 30_000


def test_gaps_everywhere_stay_bounded() -> None:
    points: list[tuple[float, float | None]] = [
        (float(i), None if i % 3 == 0 else float(i % 17)) for i in range(100_000)]
    svg = chart([Panel("p", "", [Series("a", points)])], "run")
    root = parse(svg)
    assert 0 < drawn(root) <= MAX_DRAWN
    assert len(svg) < 40_000


def test_many_series_each_bounded() -> None:
    series = [Series(f"s{k}", [(float(i), float(i * k % 97)) for i in range(20_000)])
              for k in range(3)]
    root = parse(chart([Panel("p", "", series)], "run"))
    for group in by_class(root, "series"):
        assert 0 < sum(len(p.get("points", "").split())
                       for p in group.iter(f"{NS}polyline")) <= MAX_DRAWN


def hostile_chart() -> str:
    panel = Panel(HOSTILE, HOSTILE, [Series(HOSTILE, [(0, 1.0), (1, 2.0)], HOSTILE)],
                  [Limit(HOSTILE, 1.5)])
    return chart([panel, Panel(HOSTILE, "", [])], HOSTILE,
                 bands=[Band(HOSTILE, 0, 1)], x_label=HOSTILE)


def test_hostile_text_is_escaped_and_adds_no_element_or_attribute() -> None:
    svg = hostile_chart()
    root = parse(svg)  # NUL and ESC would make it unreadable: they were replaced
    elements = {local(e.tag) for e in root.iter()}
    assert elements <= ALLOWED_ELEMENTS
    attributes = {name for e in root.iter() for name in e.attrib}
    assert attributes <= ALLOWED_ATTRIBUTES
    assert not any(a.lower().startswith("on") for a in attributes)
    assert "<script" not in svg and "</style" not in svg and "onload=\"x" not in svg
    assert "&lt;script&gt;alert(1)&lt;/script&gt;&quot; onload=&quot;x&#x27;" in svg
    assert "&amp;amp;" in svg
    assert root[0].text is not None and root[0].text.startswith('<script>alert(1)</script>"')
    assert "\x00" not in (root[0].text or "") and "\ufffd" in (root[0].text or "")


def test_no_style_script_or_external_reference_anywhere() -> None:
    svg = chart([Panel("power", "W", [Series("p", [(0, 1.0), (5, 2.0), (6, None)])],
                       [Limit("cap", 2)])], "GPU 0", bands=[Band("burn", 0, 3)])
    for word in ("style", "script", "href", "url(", "@import", "javascript", "<!"):
        assert word not in svg.lower(), word
    assert {name for e in parse(svg).iter() for name in e.attrib} <= ALLOWED_ATTRIBUTES


def test_a_very_long_name_is_cut() -> None:
    name = "N" * 1_000_000
    svg = chart([Panel(name, "", [Series(name, [(0, 1.0), (1, 2.0)])], [Limit(name, 1)])],
                name, bands=[Band(name, 0, 1)])
    assert len(svg) < 10_000
    legend = texts(parse(svg), "legend-label")[0]
    assert len(legend) == NAME_MAX and legend.endswith("\u2026")


def test_limit_lines_are_drawn_at_their_value() -> None:
    root = one_panel([(0, 0.0), (10, 100.0)], limits=[Limit("enforced power limit", 50)],
                     panel_height=200)
    _, top, _, height = plot_box(root)
    [line] = by_class(root, "limit")
    assert line.get("stroke-dasharray")
    assert float(line.get("y1", "")) == float(line.get("y2", "")) == top + height / 2
    assert texts(root, "limit-label") == ["enforced power limit"]


def test_a_limit_above_the_data_stretches_the_axis() -> None:
    root = one_panel([(0, 10.0), (10, 40.0)], limits=[Limit("HBM max 100 C", 100),
                                                     Limit("none", math.inf)])
    [line] = by_class(root, "limit")
    assert float(line.get("y1", "")) == plot_box(root)[1]


def test_same_input_same_bytes() -> None:
    def make() -> str:
        return chart([Panel("power", "W", [Series("p", spiky()), Series("q", [])])],
                     "run", bands=[Band("burn", 10, 100)])
    assert make() == make()


def qualify_like() -> str:
    """A small run of every feature: the expected file is its drawing. Arithmetic only
    (no sin, no exp), so no platform's libm can move a coordinate."""
    t = [i * 0.5 for i in range(121)]
    power: list[tuple[float, float | None]] = [
        (x, 90.0 if x < 2 or x > 45 else 675.0 + abs(i % 8 - 4) * 5) for i, x in enumerate(t)]
    power[40:43] = [(x, None) for x, _ in power[40:43]]
    clocks = [Series("SM clock", [(x, 1470.0 if 2 <= x <= 45 else 1980.0) for x in t], "MHz"),
              Series("memory clock", [(x, 2619.0) for x in t], "MHz")]
    temps = [Series("GPU", [(x, 30 + 40 * x / (x + 10)) for x in t], "C"),
             Series("HBM", [(x, 35 + 45 * x / (x + 12)) for x in t], "C")]
    return chart([Panel("Power", "W", [Series("power", power, "W")],
                        [Limit("enforced power limit 700 W", 700)]),
                  Panel("Clocks", "MHz", clocks),
                  Panel("Temperature", "C", temps, [Limit("HBM max 95 C", 95)]),
                  Panel("ECC", "", [])],
                 "GPU 0 NVIDIA H200 (qualify standard)",
                 bands=[Band("burn", 2, 45), Band("memtest", 45, 55), Band("copy", 55, 60)])


def test_the_drawing_equals_the_expected_file() -> None:
    svg = qualify_like()
    if WRITE_EXPECTED:
        EXPECTED.parent.mkdir(exist_ok=True)
        EXPECTED.write_text(svg)
    assert svg == EXPECTED.read_text()


@pytest.mark.parametrize("panels", [
    [],
    [Panel("p", "W", [])],
    [Panel("p", "W", [Series("s", [])])],
    [Panel("p", "W", [Series("s", [(0, None), (1, math.nan)])])],
    [Panel("p", "W", [Series("s", [(0, math.inf), (math.nan, 1.0), (1, -math.inf)])])],
])
def test_no_data_is_said_not_failed(panels: list[Panel]) -> None:
    root = parse(chart(panels, "run"))
    assert texts(root, "no-data") == ["no data"] * max(1, len(panels))
    assert drawn(root) == 0


def test_one_empty_panel_beside_a_full_one() -> None:
    root = parse(chart([Panel("a", "", [Series("s", [(0, 1.0), (1, 2.0)])]),
                        Panel("b", "", [Series("t", [])])], "run"))
    assert texts(root, "no-data") == ["no data"] and len(lines(root)) == 1


def test_a_constant_series_is_a_flat_line_inside_the_plot() -> None:
    root = one_panel([(0, 5.0), (10, 5.0)])
    _, top, _, height = plot_box(root)
    [line] = lines(root)
    assert line[0][1] == line[1][1] and top < line[0][1] < top + height


def test_a_single_point_is_drawn() -> None:
    root = one_panel([(3, 7.0)])
    [dot] = root.iter(f"{NS}circle")
    left, top, width, height = plot_box(root)
    assert left <= float(dot.get("cx", "")) <= left + width
    assert top < float(dot.get("cy", "")) < top + height


def test_infinite_values_are_dropped_not_gaps() -> None:
    root = one_panel([(0, 1.0), (1, math.inf), (2, 2.0), (math.inf, 3.0), (3, -math.inf),
                      (4, 1e300)])
    [line] = lines(root)
    assert len(line) == 2


def test_bands_shade_every_panel_and_are_named_once() -> None:
    data = [Series("s", [(0, 1.0), (100, 2.0)])]
    root = parse(chart([Panel("a", "", data), Panel("b", "", data)], "run",
                       bands=[Band("burn", 10, 20), Band("outside", 200, 300)],
                       x_range=(0.0, 100.0)))
    rects = by_class(root, "band")
    assert len(rects) == 2
    for i, rect in enumerate(rects):
        left, _, width, _ = plot_box(root, i)
        assert float(rect.get("x", "")) == pytest.approx(left + width * 0.1, abs=0.05)
        assert float(rect.get("width", "")) == pytest.approx(width * 0.1, abs=0.1)
    assert texts(root, "band-label") == ["burn"]


def test_each_series_has_its_own_palette_colour_and_legend() -> None:
    series = [Series(f"s{k}", [(0, float(k)), (1, 1.0 + k)]) for k in range(3)]
    root = parse(chart([Panel("p", "", series)], "run"))
    assert [g.get("stroke") for g in by_class(root, "series")] == list(PALETTE[:3])
    assert texts(root, "legend-label") == ["s0", "s1", "s2"]
    assert [g.findtext(f"{NS}title") for g in by_class(root, "series")] == ["s0", "s1", "s2"]


def test_coordinates_have_at_most_one_decimal() -> None:
    root = parse(chart([Panel("p", "", [Series("s", [(i / 7, math.sin(i) / 3)
                                                     for i in range(300)])])], "run"))
    number = re.compile(r"-?\d+(\.\d)?")
    for element in root.iter():
        for name in ("x", "y", "x1", "y1", "x2", "y2", "width", "height", "cx", "cy"):
            value = element.get(name)
            assert value is None or number.fullmatch(value), (name, value)
        for pair in element.get("points", "").split():
            assert all(number.fullmatch(v) for v in pair.split(",")), pair


def test_x_range_fixes_the_axis_and_drops_what_is_outside() -> None:
    points: list[tuple[float, float | None]] = [(float(x), 1.0 + x % 5)
                                                for x in range(-7200, 1, 10)]
    root = one_panel(points, x_range=(-3600.0, 0.0))
    left, _, width, _ = plot_box(root)
    [line] = lines(root)
    assert line[0][0] == left and line[-1][0] == left + width
    ticks = by_class(root, "x-tick")
    assert ["".join(t.itertext()) for t in (ticks[0], ticks[-1])] == ["-3500", "0"]
    assert all(left <= float(t.get("x", "")) <= left + width for t in ticks)


@pytest.mark.parametrize(("lo", "hi", "count", "labels"), [
    (0, 97, 5, ["0", "20", "40", "60", "80", "100"]),
    (0.3, 0.9, 3, ["0.2", "0.4", "0.6", "0.8", "1.0"]),
    (-0.5, 0.5, 2, ["-0.5", "0.0", "0.5"]),
    (1470, 1980, 4, ["1400", "1600", "1800", "2000"]),
])
def test_ticks_are_round(lo: float, hi: float, count: int, labels: list[str]) -> None:
    assert [label for _, label in nice_ticks(lo, hi, count)] == labels


def test_ticks_of_a_constant_widen_it() -> None:
    ticks = nice_ticks(5.0, 5.0, 4)
    assert ticks[0][0] < 5.0 < ticks[-1][0]
    assert nice_ticks(0.0, 0.0, 4)[0][0] < 0.0


@pytest.mark.parametrize(("width", "height", "x_range"), [
    (10, 160, None), (800, 5, None), (800, 160, (5.0, 1.0)), (800, 160, (0.0, math.inf))])
def test_a_nonsense_layout_is_refused(width: int, height: int,
                                      x_range: tuple[float, float] | None) -> None:
    with pytest.raises(ValueError, match=r"chart size|x_range"):
        chart([], "x", width=width, panel_height=height, x_range=x_range)


def test_the_module_stands_alone() -> None:
    source = (Path(__file__).resolve().parent.parent / "gpuguard" / "outputs"
              / "svg_chart.py").read_text()
    imports = re.findall(r"^(?:from|import) (\S+)", source, re.MULTILINE)
    assert set(imports) <= {"__future__", "dataclasses", "html", "math", "re",
                            "collections.abc"}
