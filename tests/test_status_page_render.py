"""gpuguard/outputs/status_page.py and gpuguard/daemon/page_model.py: every text from the
host reaches the page as text (never an element or an attribute of its own), the page is
made from the daemon's one verdict (a stale result is shown stale, never an old ok), and
its history is bounded. The same page in a real browser: tests/browser/."""

from __future__ import annotations

import dataclasses
import random
import time
from html.parser import HTMLParser
from typing import Any

import pytest

from gpuguard.daemon.freshness import Freshness
from gpuguard.daemon.page_history import BOARDS_MAX, POINTS_MAX, SPAN_S, PageHistory
from gpuguard.daemon.page_model import PageParts, build
from gpuguard.daemon.verdict_view import fresh_results
from gpuguard.model.identity import GpuId
from gpuguard.model.results import Result, Status
from gpuguard.model.snapshot import Snapshot
from gpuguard.outputs.status_page import (
    EventRow,
    Finding,
    GpuCard,
    Page,
    Reading,
    ServiceRow,
    render,
    shown,
)
from gpuguard.sources import replay
from tests.daemon.conftest import LIVE

# Fields that are not host text: constants of page_model, states the renderer admits from
# a fixed set only (page_state), numbers, and the chart, drawn from numbers by svg_chart
NOT_HOST = {"name@Reading", "label@Reading", "state", "status", "verdict", "freshness",
            "chart_svg", "index", "refresh_s"}

NASTY = ["<script>alert(1)</script>", "\"'><img src=x onerror=alert(1)>", "</style><b>x",
         "javascript:alert(1)", "a\x00b\x1b[31mc\x7fd\u202e", "&amp;&lt;&#x3c;", "]]><!--",
         "x" * 5000, "<svg onload=alert(1)>", "\r\n\t<", "\ud83d\ude00 \u2028 \ufeff"]


def generated(rng: random.Random) -> str:
    alphabet = "<>&\"'=/ `;:()[]{}!-\\" + "\x00\x01\x08\x0b\x1b\x7f\x85\u2028" + "aZ9"
    return "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 60)))


class Tree(HTMLParser):
    """Every element with its attributes, and the text of each data-probe element."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.elements: list[tuple[str, tuple[str, ...]]] = []
        self.attributes: list[tuple[str, str, str]] = []
        self.texts: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.elements.append((tag, tuple(name for name, _ in attrs)))
        self.attributes.extend((tag, name, value or "") for name, value in attrs)

    def handle_data(self, data: str) -> None:
        self.texts.append(data)


def parse(html_text: str) -> Tree:
    tree = Tree()
    tree.feed(html_text)
    tree.close()
    return tree


def filled(value: Any, strings: list[str], used: list[tuple[str, str]]) -> Any:
    """`value` (a Page or a part of one) with every host text replaced by the next of
    `strings`, each one recorded with its field's name so the test can look for it."""
    kind = type(value).__name__
    changes = {}
    for f in dataclasses.fields(value):
        current = getattr(value, f.name)
        if f.name in NOT_HOST or f"{f.name}@{kind}" in NOT_HOST:
            continue
        if isinstance(current, str):
            changes[f.name] = strings[len(used) % len(strings)]
            used.append((f.name, changes[f.name]))
        elif isinstance(current, list | tuple):
            changes[f.name] = [filled(v, strings, used) for v in current]
    return dataclasses.replace(value, **changes)


def sample_page() -> Page:
    finding = Finding("pcie.link_width", "critical", "x8 of x16", "reseat", "drain (why)")
    card = GpuCard(0, "NVIDIA H200", "GPU-1", "165", "0000:18:00.0", "critical",
                   [Reading("temperature", "Temperature", "40 C")], [finding])
    return Page("host", "580", "13.0", "1", "critical", "3 s", "fresh", "fresh", 5,
                "2026-12-02 10:00:00 UTC", [card], [finding],
                [ServiceRow("llm", "gpu", "ok", "never", "initial")],
                [EventRow("2026-12-02 10:00:00", "rule", "pcie.link_width", "0", "went")],
                "", "history note")


@pytest.mark.parametrize("events", [True, False])
@pytest.mark.parametrize("seed", range(20))
def test_host_text_stays_text(seed: int, events: bool) -> None:
    """Every host field filled with hostile or generated strings: the page has exactly the
    elements and attribute names of a benign one, and each string's text is on it (the
    note that says why there are no events only where there are none)."""
    rng = random.Random(seed)
    strings = [rng.choice(NASTY) if rng.random() < 0.5 else generated(rng)
               for _ in range(64)]
    sample = sample_page() if events else dataclasses.replace(sample_page(), events=[])
    benign = parse(render(sample))
    used: list[tuple[str, str]] = []
    hostile = parse(render(filled(sample, strings, used)))
    assert hostile.elements == benign.elements
    assert [(t, n) for t, n, _ in hostile.attributes] == \
        [(t, n) for t, n, _ in benign.attributes]
    text = "".join(hostile.texts)
    for name, value in used:
        if name == "events_note" and events:
            continue
        assert shown(value) in text or shown(value, 200) in text, (name, value)
    # no attribute the browser would follow or run (a javascript: URL lives only there)
    # but the reload control's own constant link
    for tag, name, value in hostile.attributes:
        assert name not in ("src", "action", "formaction", "xlink:href", "style") \
            and not name.startswith("on"), (tag, name)
        assert name != "href" or value in ("./?refresh=off", "./"), (tag, value)


def test_the_reader_can_stop_the_reload_before_it_comes() -> None:
    """WCAG 2.2.1: a control to turn the timer off, the first thing on the page."""
    reloading = render(sample_page())
    assert '<meta http-equiv="refresh" content="5">' in reloading
    assert reloading.index('href="./?refresh=off"') < reloading.index("<h1>")
    still = render(dataclasses.replace(sample_page(), refresh_s=0))
    assert 'http-equiv="refresh"' not in still and 'href="./"' in still


def test_control_characters_are_shown_escaped_and_long_text_is_bounded() -> None:
    assert shown("a\x1bb\nc") == "a\\x1bb\\nc"
    assert len(shown("x" * 5000)) == 2000 and shown("x" * 5000).endswith("\u2026")


def entries(age: float) -> list[tuple[Result, str, float]]:
    now = time.monotonic()
    gpu = GpuId(0, "GPU-e0cc4faf-3513-e344-77bc-2539754d547d", "00000000:18:00.0")
    return [(Result("thermal.margin", Status.OK, Status.CRITICAL, "47 C below T.Limit", gpu),
             "fast", now - age),
            (Result("driver.loaded", Status.OK, Status.CRITICAL, "loaded"), "fast", now - age)]


def page_of(age: float) -> str:
    snap = replay.load(LIVE)
    now = time.monotonic()
    results, ages = fresh_results(entries(age), Freshness({"fast": 5.0}), now)
    history = PageHistory()
    history.add(snap, now)
    return render(build(PageParts(snap, results, ages, None, 5, history=history, now=now)))


def test_a_fresh_verdict_is_shown_ok() -> None:
    page = page_of(1.0)
    assert 'id="freshness" data-state="fresh"' in page
    assert 'id="gpu-0" data-index="0" data-state="ok"' in page


def test_a_stale_verdict_is_shown_stale_never_the_old_ok() -> None:
    """The daemon's results older than the freshness rule allows: the banner says stale,
    the card is unknown, the readings say they are the last sweep's."""
    page = page_of(600.0)
    assert 'id="freshness" data-state="stale"' in page and "STALE" in page
    assert 'id="gpu-0" data-index="0" data-state="unknown"' in page
    assert 'data-state="ok"' not in page and "(last sweep, stale)" in page
    assert 'data-rule="thermal.margin" data-status="unknown"' in page


def test_no_verdict_yet_is_said() -> None:
    page = render(build(PageParts(None, [], {}, None, 5)))
    assert 'data-state="none"' in page and "first cycle has not ended" in page


def test_the_history_is_an_hour_bounded_per_gpu_and_in_boards() -> None:
    snap = replay.load(LIVE)
    history = PageHistory()
    start = 1000.0
    for i in range(3 * POINTS_MAX):  # 0.5 s apart: thinned to one a second
        history.add(snap, start + i * 0.5)
    now = start + (3 * POINTS_MAX - 1) * 0.5
    key = PageHistory.key(snap.gpus[0].uuid.value, 0)
    points = history.points(key, now)
    assert len(points) <= POINTS_MAX
    assert all(now - p.at <= SPAN_S for p in points)
    assert points[-1].temperature_c == float(snap.gpus[0].temperature_c.get())
    # boards: a sweep of many GPUs keeps at most BOARDS_MAX rings
    many = Snapshot(host=snap.host, nvml=snap.nvml, gpus=[
        dataclasses.replace(snap.gpus[0], index=i, uuid=type(snap.gpus[0].uuid).ok(f"G-{i}"))
        for i in range(BOARDS_MAX + 10)])
    history.add(many, now + 1)
    assert sum(1 for i in range(BOARDS_MAX + 10)
               if history.points(f"G-{i}", now + 1)) <= BOARDS_MAX


def test_each_service_shows_where_it_serves_its_engine_and_its_last_failover() -> None:
    """From the supervisor's view and service.engine's judgement, never judged again."""
    from gpuguard.supervisor.service import ServiceView
    from gpuguard.supervisor.state import ServiceState

    when = 1_790_000_000.0
    views = [ServiceView("llm", ServiceState(active="cpu", reason="xid.recent: Xid 79",
                                             last_transition=when), None),
             ServiceView("embed", ServiceState(), None)]
    engine = Result("service.engine", Status.CRITICAL, Status.CRITICAL, "llm is stuck",
                    observed={"services": {"llm": {"state": "stuck"}}})
    page = build(PageParts(replay.load(LIVE), [engine], {"fast": 1.0}, None, 5,
                           services=views))
    llm, embed = page.services
    assert (llm.name, llm.active, llm.engine, llm.why) == \
        ("llm", "cpu", "stuck", "xid.recent: Xid 79")
    assert llm.last_failover.startswith("2026-")
    assert (embed.active, embed.engine, embed.last_failover) == ("gpu", "-", "never")
    html_text = render(page)
    assert '<tr data-service="llm">' in html_text and "xid.recent: Xid 79" in html_text
    # no supervisor configured: the page says so, not an empty table
    none = render(build(PageParts(replay.load(LIVE), [engine], {"fast": 1.0}, None, 5)))
    assert "No supervised service" in none and "data-service" not in none
