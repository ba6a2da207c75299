"""The browser harness itself (tests/browser/cdp.py, tests/browser/axe.py), against small
static pages that a loopback http.server in this test serves: what it reads of a page is
what the page is, and it leaves no process behind."""

from __future__ import annotations

import struct
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.browser import axe
from tests.browser.cdp import Browser, JSError
from tests.browser.conftest import need_axe, need_chromium
from tests.browser.loopback import serve

CSP = "default-src 'none'; style-src 'unsafe-inline'; base-uri 'none'"
STYLE = """<style>
body { background: #ffffff; color: #111111; margin: 0; }
@media (prefers-color-scheme: dark) { body { background: #101418; color: #e8e8e8; } }
.wide { width: 1200px; }
</style>"""
PAGES = {
    "/": f"""<!doctype html><html lang="en"><head><meta charset="utf-8">
<title>harness</title><meta name="viewport" content="width=device-width">{STYLE}</head>
<body><main><h1 id="title">Hello &lt;there&gt;</h1><p>one paragraph</p></main></body></html>""",
    "/wide": f"""<!doctype html><html lang="en"><head><meta charset="utf-8"><title>wide</title>
<meta name="viewport" content="width=device-width">{STYLE}</head>
<body><main><h1>wide</h1><div class="wide">too wide</div></main></body></html>""",
    "/script": """<!doctype html><html lang="en"><head><meta charset="utf-8"><title>s</title>
</head><body><main><h1>script</h1><script>document.title = "ran";</script></main></body></html>""",
    "/inaccessible": """<!doctype html><html><head><meta charset="utf-8"></head>
<body><img src="/nothing.png"><p style="color:#eeeeee;background:#ffffff">faint</p>
</body></html>""",
}


@pytest.fixture(scope="module")
def site() -> Iterator[str]:
    with serve({path: page.encode() for path, page in PAGES.items()},
               [("Content-Security-Policy", CSP), ("X-Harness", "yes")]) as url:
        yield url


def png_size(data: bytes) -> tuple[int, int]:
    assert data[:8] == b"\x89PNG\r\n\x1a\n", data[:16]
    width, height = struct.unpack(">II", data[16:24])
    return width, height


def running_only(pids: list[str]) -> list[str]:
    """Those of `pids` that still run: pgrep counts a zombie that init has not reaped yet."""
    live = []
    for pid in pids:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if state != "Z":
            live.append(pid)
    return live


def test_navigate_reads_the_dom_and_the_headers(browser: Browser, site: str) -> None:
    page = browser.navigate(site + "/")
    assert browser.evaluate("document.getElementById('title').textContent") == "Hello <there>"
    assert browser.evaluate("document.documentElement.lang") == "en"
    assert page.response is not None
    assert page.response.status == 200
    assert page.response.header("Content-Security-Policy") == CSP
    assert page.response.header("x-harness") == "yes"
    assert browser.evaluate("Promise.resolve(6 * 7)") == 42
    assert browser.evaluate("({a: [1, 'b']})") == {"a": [1, "b"]}


def test_a_script_error_is_raised(browser: Browser, site: str) -> None:
    browser.navigate(site + "/")
    with pytest.raises(JSError, match="nope"):
        browser.evaluate("Promise.reject(new Error('nope'))")


def test_csp_violations_are_reported(browser: Browser, site: str) -> None:
    page = browser.navigate(site + "/script")
    assert browser.evaluate("document.title") == "s"  # the inline script never ran
    assert any("Executing inline script violates" in m for m in page.csp_violations()), \
        page.messages
    assert browser.navigate(site + "/").csp_violations() == []


def test_the_viewport_decides_the_scroll_width(browser: Browser, site: str) -> None:
    browser.set_viewport(360, 740, mobile=True)
    try:
        browser.navigate(site + "/")
        assert browser.evaluate("window.innerWidth") == 360
        assert browser.evaluate("document.documentElement.scrollWidth") <= 360
        browser.navigate(site + "/wide")
        assert browser.evaluate("document.documentElement.scrollWidth") >= 1200
    finally:
        browser.send("Emulation.clearDeviceMetricsOverride")


def test_the_colour_scheme_is_emulated(browser: Browser, site: str) -> None:
    background = "getComputedStyle(document.body).backgroundColor"
    browser.navigate(site + "/")
    try:
        browser.color_scheme("dark")
        assert browser.evaluate("matchMedia('(prefers-color-scheme: dark)').matches") is True
        assert browser.evaluate(background) == "rgb(16, 20, 24)"
        browser.color_scheme("light")
        assert browser.evaluate(background) == "rgb(255, 255, 255)"
    finally:
        browser.color_scheme(None)


def test_screenshot_is_a_png_of_the_whole_page(browser: Browser, site: str) -> None:
    browser.set_viewport(800, 600)
    try:
        browser.navigate(site + "/wide")
        width, height = png_size(browser.screenshot())
        assert width >= 1200 and height > 0
        assert png_size(browser.screenshot(full_page=False)) == (800, 600)
    finally:
        browser.send("Emulation.clearDeviceMetricsOverride")


def test_axe_passes_a_plain_page_and_names_what_fails(browser: Browser, site: str) -> None:
    need_axe()
    browser.navigate(site + "/")
    assert axe.serious(axe.audit(browser)) == []
    browser.navigate(site + "/inaccessible")
    found = axe.audit(browser)
    ids = {v["id"] for v in axe.serious(found)}
    assert {"image-alt", "color-contrast", "html-has-lang"} <= ids, axe.describe(found)
    assert "image-alt (critical)" in axe.describe(found)
    # injected through the protocol: the page's CSP stands and still holds for the page
    assert browser.evaluate("document.title") == ""


def test_close_leaves_no_process_and_no_folder() -> None:
    need_chromium()
    browser = Browser.start()
    folder, pid = browser.folder, browser.proc.pid
    assert browser.evaluate("1 + 1") == 2
    running = subprocess.run(["pgrep", "-g", str(pid)], capture_output=True, text=True)
    assert len(running.stdout.split()) >= 2  # the browser and its zygotes, renderers, ...
    browser.close()
    for args in (["-g", str(pid)], ["-f", str(folder)]):
        found = subprocess.run(["pgrep", *args], capture_output=True, text=True)
        assert running_only(found.stdout.split()) == [], (args, found.stdout)
    assert not folder.exists()


def test_a_killed_browser_is_still_cleaned_up() -> None:
    need_chromium()
    browser = Browser.start()
    folder = browser.folder
    browser.proc.kill()  # the main process dies under the harness; close() finds the rest
    browser.close()
    assert browser.leftovers() == []
    assert not folder.exists()
