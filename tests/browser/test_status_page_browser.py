"""The daemon's status page (issue 31) in a real browser, as a person would see it: the real
daemon serving a healthy and a faulty replayed host (tests/browser/hosts.py), headless
Debian chromium over the DevTools protocol (tests/browser/cdp.py), axe-core injected through
the protocol (tests/browser/axe.py): the headers and the DOM the page promises (issue 31).
A page that breaks them fails here with what it broke."""

from __future__ import annotations

import base64
import hashlib
import re
import struct
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.browser import axe
from tests.browser.cdp import Browser
from tests.browser.conftest import need_axe, need_chromium
from tests.browser.hosts import (
    DESKTOP,
    FAULTY_GPU,
    FAULTY_RULE,
    HOSTS,
    PHONE,
    status_page,
    status_pages,
)
from tests.conftest import REPO
from tests.daemon.conftest import DaemonProcess

CSP = re.compile(r"default-src 'none'; style-src 'sha256-(?P<hash>[A-Za-z0-9+/]+={0,2})'; "
                 r"base-uri 'none'; form-action 'none'; frame-ancestors 'none'")
STYLE = re.compile(rb"<style>(?P<css>.*?)</style>", re.S)
HOST_FIELDS = {"driver", "cuda", "gpus", "verdict", "age"}
READINGS = {"temperature", "power", "clocks", "ecc", "xids"}
VIEWS = {"desktop": (DESKTOP, False, "light"), "360": (PHONE, True, "light"),
         "dark": (DESKTOP, False, "dark")}


@pytest.fixture(scope="module")
def daemons(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, DaemonProcess]]:
    need_chromium()  # before any daemon starts
    with status_pages(tmp_path_factory.mktemp("status-pages"), fast_interval=60) as started:
        yield started


@pytest.fixture
def view(browser: Browser) -> Iterator[Any]:
    """`view(url, "desktop" | "360" | "dark")`: the page loaded so; the browser reset after."""
    def load(url: str, name: str = "desktop") -> Any:
        (width, height), mobile, scheme = VIEWS[name]
        browser.set_viewport(width, height, mobile=mobile)
        browser.color_scheme(scheme)
        return browser.navigate(url)

    yield load
    browser.send("Emulation.clearDeviceMetricsOverride")
    browser.color_scheme(None)


def js_list(selector: str, expression: str = "e.textContent.trim()") -> str:
    return f"[...document.querySelectorAll({selector!r})].map(e => {expression})"


def luminance(css: str) -> float:
    """Relative luminance (WCAG) of a computed `rgb(r, g, b)` / `rgba(...)` colour."""
    match = re.fullmatch(r"rgba?\((\d+), (\d+), (\d+)(?:, ([\d.]+))?\)", css)
    assert match, css
    assert match.group(4) in (None, "1"), f"a see-through background: {css}"
    def channel(v: str) -> float:
        c = int(v) / 255
        return c / 12.92 if c <= 0.03928 else ((c + 0.055) / 1.055) ** 2.4
    r, g, b = (channel(match.group(n)) for n in (1, 2, 3))
    return 0.2126 * r + 0.7152 * g + 0.0722 * b


# --- served as the contract says -----------------------------------------------------------
@pytest.mark.parametrize("host", HOSTS)
def test_headers_and_the_style_hash(browser: Browser, daemons: dict[str, DaemonProcess],
                                    view: Any, host: str) -> None:
    page = view(daemons[host].url + "/")
    assert page.response is not None and page.response.status == 200
    headers = page.response.headers
    assert headers.get("content-type") == "text/html; charset=utf-8"
    assert headers.get("x-content-type-options") == "nosniff"
    assert headers.get("referrer-policy") == "no-referrer"
    assert headers.get("cache-control") == "no-store"
    csp = headers.get("content-security-policy")
    assert csp is not None, headers
    match = CSP.fullmatch(csp)
    assert match, csp
    with urllib.request.urlopen(daemons[host].url + "/", timeout=5) as resp:
        body = resp.read()
    styles = STYLE.findall(body)
    assert len(styles) == 1, "one inline <style>"
    assert base64.b64encode(hashlib.sha256(styles[0]).digest()).decode() == match["hash"]
    # the browser applied the style (its hash matched) and refused nothing
    assert page.csp_violations() == []
    assert browser.evaluate("document.styleSheets.length") == 1
    assert browser.evaluate("document.styleSheets[0].cssRules.length") > 0


@pytest.mark.parametrize("host", HOSTS)
def test_the_document_is_the_contract(browser: Browser, daemons: dict[str, DaemonProcess],
                                      view: Any, host: str) -> None:
    view(daemons[host].url + "/")
    ev = browser.evaluate
    assert ev("document.documentElement.lang") == "en"
    assert ev("document.querySelectorAll('h1').length") == 1
    assert ev("document.querySelectorAll('main').length") == 1
    assert ev("document.querySelectorAll('script').length") == 0  # no script at all
    refresh = ev("document.querySelector('head meta[http-equiv=refresh]')?.content")
    assert refresh is not None and re.fullmatch(r"\d+", refresh) and int(refresh) > 0, refresh
    assert ev("document.querySelector('meta[name=color-scheme]')?.content") == "light dark"
    fields = ev(js_list("#host dl dd[data-field]", "e.dataset.field"))
    assert set(fields) == HOST_FIELDS and len(fields) == len(HOST_FIELDS), fields
    assert ev("document.querySelector('#host dd[data-field=verdict]').textContent.trim()") \
        in ("ok", "warning", "critical", "unknown")
    assert ev("document.querySelector('#host dd[data-field=age]').textContent.trim()") != ""
    # a replay judged just now: fresh, never shown as the last ok of a stale verdict
    assert ev("document.querySelector('#host p#freshness')?.dataset.state") == "fresh"
    for section in ("host", "gpus", "host-findings", "services", "events"):
        assert ev(f"document.querySelectorAll('body section#{section}').length") == 1, section
    assert ev("document.querySelector('main').contains(document.querySelector('#gpus'))")
    # no service is supervised on these hosts: the section says so
    assert ev("document.querySelectorAll('#services tr[data-service]').length") == 0
    assert ev("document.querySelector('#services p')?.textContent.trim()"), "says none"
    footer = ev("document.querySelector('footer')?.textContent") or ""
    assert "memory" in footer and "restart" in footer, footer
    cards = ev(js_list("#gpus article.gpu", "[e.id, e.dataset.index, e.dataset.state]"))
    assert [c[:2] for c in cards] == [[f"gpu-{n}", str(n)] for n in range(len(cards))]
    assert all(c[2] in ("ok", "warning", "critical", "unknown") for c in cards), cards
    for n in range(len(cards)):
        card = f"#gpu-{n}"
        assert ev(f"document.querySelector('{card} h3').textContent").find(str(n)) >= 0
        readings = ev(js_list(f"{card} dl.readings dd[data-field]", "e.dataset.field"))
        assert set(readings) >= READINGS, readings
        for field in READINGS:
            assert ev(f"document.querySelector('{card} dd[data-field={field}]')"
                      ".textContent.trim()"), (card, field)
        assert ev(f"!!document.querySelector('{card} figure.chart svg')"), card
        # each finding in the card's list (a card without any has no <li>, and the page
        # then leaves the <ul> out too)
        assert ev(f"document.querySelectorAll('{card} li.finding').length") == \
            ev(f"document.querySelectorAll('{card} ul.findings > li.finding').length")


def test_the_healthy_gpu_has_no_finding(browser: Browser, daemons: dict[str, DaemonProcess],
                                        view: Any) -> None:
    view(daemons["healthy"].url + "/")
    cards = browser.evaluate(js_list("#gpus article.gpu", "[e.id, e.dataset.state]"))
    assert cards == [["gpu-0", "ok"]]
    assert browser.evaluate("document.querySelectorAll('#gpu-0 li').length") == 0
    assert browser.evaluate(
        "document.querySelector('#host dd[data-field=gpus]').textContent.trim()") == "1"


def test_the_failing_gpu_names_the_rule_and_its_action(
        browser: Browser, daemons: dict[str, DaemonProcess], view: Any) -> None:
    view(daemons["faulty"].url + "/")
    ev = browser.evaluate
    card = f"#gpu-{FAULTY_GPU}"
    assert ev(f"document.querySelector('{card}').dataset.state") == "critical"
    assert ev("document.querySelector('#host dd[data-field=verdict]').textContent.trim()") \
        == "critical"
    findings = ev(js_list(f"{card} li.finding", "[e.dataset.rule, e.dataset.status, "
                          "e.querySelector('code.rule')?.textContent, "
                          "e.querySelector('.message')?.textContent, "
                          "e.querySelector('p.action')?.textContent, "
                          "e.querySelector('p.fix')?.textContent]"))
    assert [f[:3] for f in findings] == [[FAULTY_RULE, "critical", FAULTY_RULE]], findings
    _, _, _, message, action, fix = findings[0]
    assert "x8" in message and "x16" in message, message
    assert "inspect_hardware" in action, action  # the rule's suggested action
    assert fix and "lspci" in fix, fix  # and rules/pcie.yaml's remediation
    # the other GPU, and the host, are fine
    assert ev("document.querySelector('#gpu-0').dataset.state") == "ok"
    assert ev("document.querySelectorAll('#gpu-0 li').length") == 0
    assert ev("document.querySelectorAll('#host-findings li.finding').length") == 0


def test_the_page_reloads_itself(browser: Browser, tmp_path: Path) -> None:
    """The meta refresh, in the browser: the page comes back on its own, the style still
    allowed by its hash (the daemon's default fast interval: every 5 s)."""
    need_chromium()
    with status_page("healthy", tmp_path) as daemon:
        page = browser.navigate(daemon.url + "/")
        assert browser.evaluate("document.querySelector('meta[http-equiv=refresh]').content") \
            == "5"
        first = browser.evaluate("performance.timeOrigin")
        browser.wait_next_load(timeout=15)
        assert browser.evaluate("performance.timeOrigin") > first
        assert browser.evaluate("document.styleSheets[0].cssRules.length") > 0
        assert page.csp_violations() == []


# --- readable: 360 px, dark ---------------------------------------------------------------
@pytest.mark.parametrize("host", HOSTS)
def test_no_horizontal_scroll_at_360_px(browser: Browser, daemons: dict[str, DaemonProcess],
                                        view: Any, host: str) -> None:
    view(daemons[host].url + "/", "360")
    assert browser.evaluate("window.innerWidth") == 360
    wide = browser.evaluate(
        "[...document.querySelectorAll('body *')].filter(e => e.getBoundingClientRect().right"
        " > 360.5).slice(0, 5).map(e => e.tagName + (e.id ? '#' + e.id : '') + "
        "(e.className && typeof e.className === 'string' ? '.' + e.className : '') + ' ' + "
        "Math.round(e.getBoundingClientRect().right))")
    assert browser.evaluate("document.documentElement.scrollWidth") <= 360, wide


# Words the browser had to break in the middle to fit (a word: a run of non-blank characters,
# cut after each '-' and '/', where a line may break anyway); text inside the SVG charts is
# laid out by the chart, not wrapped, and text in a box 1 px wide is for screen readers.
BROKEN_WORDS = """(() => {
  const broken = [];
  const walker = document.createTreeWalker(document.body, NodeFilter.SHOW_TEXT);
  for (let node = walker.nextNode(); node; node = walker.nextNode()) {
    const parent = node.parentElement;
    if (parent.closest('svg')) continue;
    let hidden = false;  // read to a screen reader only (a 1 px clipped box, say): not seen
    for (let e = parent; e && !hidden; e = e.parentElement)
      hidden = e.getBoundingClientRect().width <= 1;
    if (hidden) continue;
    for (const m of node.textContent.matchAll(/[^\\s\\-\\/]+[\\-\\/]?/g)) {
      const range = document.createRange();
      range.setStart(node, m.index);
      range.setEnd(node, m.index + m[0].length);
      const lines = new Set([...range.getClientRects()].filter(r => r.width > 0)
                            .map(r => Math.round(r.top)));
      const where = parent.closest('[id]');
      if (lines.size > 1)
        broken.push(`${m[0]} (${parent.tagName.toLowerCase()} in #${where ? where.id : ''})`);
    }
  }
  return broken;
})()"""


@pytest.mark.parametrize("host", HOSTS)
def test_no_word_is_broken_at_360_px(browser: Browser, daemons: dict[str, DaemonProcess],
                                     view: Any, host: str) -> None:
    view(daemons[host].url + "/", "360")
    assert browser.evaluate(BROKEN_WORDS) == []


def test_a_broken_word_is_found(browser: Browser, view: Any) -> None:
    view("data:text/html,<p style='width:3em;overflow-wrap:anywhere'>unbreakable ok-then</p>"
         "<p style='position:absolute;width:1px;overflow:hidden'>read aloud only</p>", "360")
    assert browser.evaluate(BROKEN_WORDS) == ["unbreakable (p in #)"]


@pytest.mark.parametrize("host", HOSTS)
def test_the_dark_scheme_is_dark(browser: Browser, daemons: dict[str, DaemonProcess],
                                 view: Any, host: str) -> None:
    background = "getComputedStyle(document.body).backgroundColor"
    colour = "getComputedStyle(document.body).color"
    view(daemons[host].url + "/", "dark")
    dark_bg, dark_fg = browser.evaluate(background), browser.evaluate(colour)
    assert luminance(dark_bg) < 0.1, dark_bg
    assert luminance(dark_fg) > 0.4, dark_fg
    view(daemons[host].url + "/", "desktop")
    light_bg, light_fg = browser.evaluate(background), browser.evaluate(colour)
    assert luminance(light_bg) > 0.8, light_bg
    assert luminance(light_fg) < 0.2, light_fg


# --- accessible -----------------------------------------------------------------------------
# axe-core's meta-refresh rule (WCAG 2.2.1, timing adjustable) calls any timed refresh under
# 20 hours critical; issue 31 asks for exactly that refresh (a page left open in a tab, with
# no script). Accepted on the one <meta http-equiv="refresh"> and nowhere else, until the
# page's refresh is decided otherwise; test_the_only_accepted_axe_violation_is_the_refresh
# keeps the exception from hiding anything more.
ACCEPTED = {"meta-refresh": ['meta[http-equiv="refresh"]']}


def accepted(violation: dict[str, Any]) -> bool:
    targets = [" ".join(map(str, n["target"])) for n in violation["nodes"]]
    return ACCEPTED.get(violation["id"]) == targets


def test_the_only_accepted_axe_violation_is_the_refresh(
        browser: Browser, daemons: dict[str, DaemonProcess], view: Any) -> None:
    need_axe()
    view(daemons["faulty"].url + "/")
    ids = {v["id"]: v for v in axe.serious(axe.audit(browser))}
    assert set(ids) <= set(ACCEPTED), axe.describe(list(ids.values()))
    if "meta-refresh" in ids:
        assert accepted(ids["meta-refresh"]), axe.describe([ids["meta-refresh"]])
    assert not accepted({"id": "meta-refresh", "nodes": [{"target": ["meta"]},
                                                         {"target": ["img"]}]})
    assert not accepted({"id": "color-contrast", "nodes": [{"target": ["p"]}]})


@pytest.mark.parametrize("name", list(VIEWS))
@pytest.mark.parametrize("host", HOSTS)
def test_axe_finds_nothing_serious(browser: Browser, daemons: dict[str, DaemonProcess],
                                   view: Any, host: str, name: str) -> None:
    need_axe()
    view(daemons[host].url + "/", name)
    found = axe.audit(browser)
    bad = [v for v in axe.serious(found) if not accepted(v)]
    assert bad == [], f"axe-core {axe.PINNED}, {host} host, {name}:\n" + axe.describe(bad)
    # the page's CSP was not loosened for the audit
    assert browser.evaluate("document.querySelectorAll('script').length") == 0


# --- make screenshots -----------------------------------------------------------------------
def png_size(data: bytes) -> tuple[int, int]:
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", data[16:24])
    return width, height


def test_make_screenshots_writes_six_pngs(tmp_path: Path) -> None:
    need_chromium()
    out = tmp_path / "images"
    run = subprocess.run([sys.executable, "scripts/screenshots.py", "--out", str(out)],
                         cwd=REPO, capture_output=True, text=True, timeout=240, check=False)
    assert run.returncode == 0, run.stdout + run.stderr
    names = sorted(p.name for p in out.iterdir())
    assert names == sorted(f"status-{h}-{v}.png" for h in HOSTS for v in VIEWS)
    for name in names:
        data = (out / name).read_bytes()
        width, height = png_size(data)
        want = PHONE[0] if "-360" in name else DESKTOP[0]
        assert width == want, (name, width)
        assert 200 <= height <= 20000, (name, height)
        assert len(data) > 10_000, (name, len(data))
