"""The daemon's status page (issue 31) in a real browser, as a person would see it: the real
daemon serving a healthy and a faulty replayed host (tests/browser/hosts.py), headless
Debian chromium over the DevTools protocol (tests/browser/cdp.py), axe-core injected through
the protocol (tests/browser/axe.py): the headers and the DOM the page promises
(tests/browser/checks.py), readable at 360 px and in the dark, accessible."""

from __future__ import annotations

import struct
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.browser import axe, checks
from tests.browser.cdp import Browser, Page
from tests.browser.checks import js_list
from tests.browser.conftest import VIEWS, need_axe, need_chromium
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

View = Callable[..., Page]
STILL = "/?refresh=off"  # the page without its reload


@pytest.fixture(scope="module")
def daemons(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, DaemonProcess]]:
    need_chromium()  # before any daemon starts
    with status_pages(tmp_path_factory.mktemp("status-pages"), fast_interval=60) as started:
        yield started


# --- served as the contract says -----------------------------------------------------------
@pytest.mark.parametrize("path", ["/", STILL])
@pytest.mark.parametrize("host", HOSTS)
def test_headers_and_the_style_hash(browser: Browser, daemons: dict[str, DaemonProcess],
                                    view: View, host: str, path: str) -> None:
    url = daemons[host].url + path
    checks.check_headers(browser, view(url), url)


@pytest.mark.parametrize("host", HOSTS)
def test_the_document_is_the_contract(browser: Browser, daemons: dict[str, DaemonProcess],
                                      view: View, host: str) -> None:
    view(daemons[host].url + "/")
    checks.check_document(browser)
    ev = browser.evaluate
    # a replay judged just now: fresh, never shown as the last ok of a stale verdict
    assert ev("document.querySelector('#freshness').dataset.state") == "fresh"
    # no service is supervised on these hosts: the section says so
    assert ev("document.querySelectorAll('#services tr[data-service]').length") == 0
    assert ev("document.querySelector('#services p')?.textContent.trim()"), "says none"


@pytest.mark.parametrize("host", HOSTS)
def test_the_reload_can_be_stopped_first_thing(browser: Browser,
                                               daemons: dict[str, DaemonProcess],
                                               view: View, host: str) -> None:
    """WCAG 2.2.1: the first link on the page leads to the page without its reload, and
    that page's first link back."""
    view(daemons[host].url + "/")
    still = browser.evaluate("document.querySelector('a').href")
    assert still == daemons[host].url + STILL
    view(still)
    checks.check_document(browser, reloads=False)
    assert browser.evaluate("document.querySelector('a').href") == daemons[host].url + "/"


def test_the_healthy_gpu_has_no_finding(browser: Browser, daemons: dict[str, DaemonProcess],
                                        view: View) -> None:
    view(daemons["healthy"].url + "/")
    cards = browser.evaluate(js_list("#gpus article.gpu", "[e.id, e.dataset.state]"))
    assert cards == [["gpu-0", "ok"]]
    assert browser.evaluate("document.querySelectorAll('#gpu-0 li').length") == 0
    assert browser.evaluate(
        "document.querySelector('#host dd[data-field=gpus]').textContent.trim()") == "1"


def test_the_failing_gpu_names_the_rule_and_its_action(
        browser: Browser, daemons: dict[str, DaemonProcess], view: View) -> None:
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
                                        view: View, host: str) -> None:
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
                                     view: View, host: str) -> None:
    view(daemons[host].url + "/", "360")
    assert browser.evaluate(BROKEN_WORDS) == []


def test_a_broken_word_is_found(browser: Browser, view: View) -> None:
    view("data:text/html,<p style='width:3em;overflow-wrap:anywhere'>unbreakable ok-then</p>"
         "<p style='position:absolute;width:1px;overflow:hidden'>read aloud only</p>", "360")
    assert browser.evaluate(BROKEN_WORDS) == ["unbreakable (p in #)"]


@pytest.mark.parametrize("host", HOSTS)
def test_the_dark_scheme_is_dark(browser: Browser, daemons: dict[str, DaemonProcess],
                                 view: View, host: str) -> None:
    url = daemons[host].url + "/"
    checks.check_dark(browser, lambda scheme: view(url, "dark" if scheme == "dark"
                                                   else "desktop"))


# --- accessible -----------------------------------------------------------------------------
# axe-core's meta-refresh rule (WCAG 2.2.1, timing adjustable) calls any timed refresh under
# 20 hours critical, whatever the page offers; the page offers the reader a link to stop the
# reload, first on the page (test_the_reload_can_be_stopped_first_thing). Accepted on the
# reloading page's one <meta http-equiv="refresh">, where that link is, and nowhere else:
# the page without its reload must pass with none.
ACCEPTED = {"meta-refresh": ['meta[http-equiv="refresh"]']}


def accepted(violation: dict[str, Any], stop_link: bool) -> bool:
    targets = [" ".join(map(str, n["target"])) for n in violation["nodes"]]
    return stop_link and ACCEPTED.get(violation["id"]) == targets


@pytest.mark.parametrize("path", ["/", STILL])
@pytest.mark.parametrize("name", list(VIEWS))
@pytest.mark.parametrize("host", HOSTS)
def test_axe_finds_nothing_serious(browser: Browser, daemons: dict[str, DaemonProcess],
                                   view: View, host: str, name: str, path: str) -> None:
    need_axe()
    view(daemons[host].url + path, name)
    stop_link = browser.evaluate("document.querySelector('a')?.getAttribute('href')") \
        == checks.STOP_RELOAD
    found = axe.audit(browser)
    bad = [v for v in axe.serious(found) if not accepted(v, stop_link)]
    assert bad == [], f"axe-core {axe.PINNED}, {host} host, {name}, {path}:\n" \
        + axe.describe(bad)
    # the page's CSP was not loosened for the audit
    assert browser.evaluate("document.querySelectorAll('script').length") == 0


def test_the_accepted_axe_finding_is_narrow() -> None:
    refresh = {"id": "meta-refresh", "nodes": [{"target": ['meta[http-equiv="refresh"]']}]}
    assert accepted(refresh, stop_link=True)
    assert not accepted(refresh, stop_link=False)
    assert not accepted({"id": "meta-refresh", "nodes": [{"target": ["meta"]},
                                                         {"target": ["img"]}]}, True)
    assert not accepted({"id": "color-contrast", "nodes": [{"target": ["p"]}]}, True)


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
