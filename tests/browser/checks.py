"""What the status page promises, as checks on a page loaded in the browser: each raises
AssertionError, saying what broke (test_status_page_browser.py holds the daemon's pages to
them; tests/test_status_page_mutations.py makes sure they can fail)."""

from __future__ import annotations

import base64
import hashlib
import re
import urllib.request
from typing import Any

from tests.browser.cdp import Browser, Page

CSP = re.compile(r"default-src 'none'; style-src 'sha256-(?P<hash>[A-Za-z0-9+/]+={0,2})'; "
                 r"base-uri 'none'; form-action 'none'; frame-ancestors 'none'")
STYLE = re.compile(rb"<style>(?P<css>.*?)</style>", re.S)
HOST_FIELDS = {"driver", "cuda", "gpus", "verdict", "age"}
READINGS = {"temperature", "power", "clocks", "ecc", "xids"}
STATES = ("ok", "warning", "critical", "unknown")
STOP_RELOAD = "./?refresh=off"

def js_list(selector: str, expression: str = "e.textContent.trim()") -> str:
    return f"[...document.querySelectorAll({selector!r})].map(e => {expression})"


def luminance(css: str) -> float:
    """Relative luminance (WCAG) of a computed `rgb(r, g, b)` colour, opaque."""
    match = re.fullmatch(r"rgba?\((\d+), (\d+), (\d+)(?:, ([\d.]+))?\)", css)
    assert match, css
    assert match.group(4) in (None, "1"), f"a see-through colour: {css}"

    def channel(v: str) -> float:
        c = int(v) / 255
        return c / 12.92 if c <= 0.03928 else ((c + 0.055) / 1.055) ** 2.4

    r, g, b = (channel(match.group(n)) for n in (1, 2, 3))
    return 0.2126 * r + 0.7152 * g + 0.0722 * b


def check_headers(browser: Browser, page: Page, url: str) -> None:
    """The answer's headers, the policy's hash that of the one inline style, and a browser
    that applied that style and refused nothing."""
    assert page.response is not None and page.response.status == 200, page.response
    headers = page.response.headers
    assert headers.get("content-type") == "text/html; charset=utf-8", headers
    assert headers.get("x-content-type-options") == "nosniff", headers
    assert headers.get("referrer-policy") == "no-referrer", headers
    assert headers.get("cache-control") == "no-store", headers
    csp = headers.get("content-security-policy")
    assert csp is not None, f"no Content-Security-Policy: {headers}"
    match = CSP.fullmatch(csp)
    assert match, csp
    with urllib.request.urlopen(url, timeout=5) as resp:
        body = resp.read()
    styles = STYLE.findall(body)
    assert len(styles) == 1, f"{len(styles)} inline <style>, not one"
    assert base64.b64encode(hashlib.sha256(styles[0]).digest()).decode() == match["hash"]
    assert page.csp_violations() == [], page.csp_violations()
    assert browser.evaluate("document.styleSheets.length") == 1
    assert browser.evaluate("document.styleSheets[0].cssRules.length") > 0


def check_document(browser: Browser, reloads: bool = True) -> None:
    """The DOM every status page has: lang, one h1, main, no script, the refresh (or the
    page without it), the colour schemes, the host's fields, the sections, the GPU cards."""
    ev = browser.evaluate
    assert ev("document.documentElement.lang") == "en"
    assert ev("document.querySelectorAll('h1').length") == 1
    assert ev("document.querySelectorAll('main').length") == 1
    assert ev("document.querySelectorAll('script').length") == 0, "a script on the page"
    refresh = ev("document.querySelector('head meta[http-equiv=refresh]')?.content")
    first_link = ev("document.querySelector('a')?.getAttribute('href')")
    if reloads:
        assert refresh is not None, "no <meta http-equiv=refresh>"
        assert re.fullmatch(r"\d+", refresh) and int(refresh) > 0, refresh
        assert first_link == STOP_RELOAD, f"the first link is {first_link!r}"
    else:
        assert refresh is None, refresh
        assert first_link == "./", f"the first link is {first_link!r}"
    assert ev("document.querySelector('meta[name=color-scheme]')?.content") == "light dark"
    fields = ev(js_list("#host dl dd[data-field]", "e.dataset.field"))
    assert set(fields) == HOST_FIELDS and len(fields) == len(HOST_FIELDS), fields
    assert ev("document.querySelector('#host dd[data-field=verdict]').textContent.trim()") \
        in STATES
    assert ev("document.querySelector('#host dd[data-field=age]').textContent.trim()") != ""
    assert ev("document.querySelector('#host p#freshness')?.dataset.state") \
        in ("fresh", "stale", "none")
    for section in ("host", "gpus", "host-findings", "services", "events"):
        assert ev(f"document.querySelectorAll('body section#{section}').length") == 1, section
    assert ev("document.querySelector('main').contains(document.querySelector('#gpus'))")
    footer = ev("document.querySelector('footer')?.textContent") or ""
    assert "memory" in footer and "restart" in footer, footer
    cards = ev(js_list("#gpus article.gpu", "[e.id, e.dataset.index, e.dataset.state]"))
    assert [c[:2] for c in cards] == [[f"gpu-{n}", str(n)] for n in range(len(cards))], cards
    assert all(c[2] in STATES for c in cards), cards
    for n in range(len(cards)):
        card = f"#gpu-{n}"
        assert str(n) in ev(f"document.querySelector('{card} h3').textContent")
        readings = ev(js_list(f"{card} dl.readings dd[data-field]", "e.dataset.field"))
        assert set(readings) >= READINGS, readings
        for name in READINGS:
            assert ev(f"document.querySelector('{card} dd[data-field={name}]')"
                      ".textContent.trim()"), (card, name)
        assert ev(f"!!document.querySelector('{card} figure.chart svg')"), card
        # each finding in the card's list (a card without any has no <li>, and the page
        # then leaves the <ul> out too)
        assert ev(f"document.querySelectorAll('{card} li.finding').length") == \
            ev(f"document.querySelectorAll('{card} ul.findings > li.finding').length")


def check_dark(browser: Browser, load: Any) -> None:
    """`load(scheme)` loads the page under that colour scheme: dark on dark, light on light."""
    background = "getComputedStyle(document.body).backgroundColor"
    colour = "getComputedStyle(document.body).color"
    load("dark")
    dark_bg, dark_fg = browser.evaluate(background), browser.evaluate(colour)
    assert luminance(dark_bg) < 0.1, f"dark scheme, background {dark_bg}"
    assert luminance(dark_fg) > 0.4, f"dark scheme, text {dark_fg}"
    load("light")
    light_bg, light_fg = browser.evaluate(background), browser.evaluate(colour)
    assert luminance(light_bg) > 0.8, f"light scheme, background {light_bg}"
    assert luminance(light_fg) < 0.2, f"light scheme, text {light_fg}"
