"""A headless chromium per module (tests/browser/cdp.py), and axe-core for it."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from tests.browser import axe
from tests.browser.cdp import CHROMIUM, Browser, Page
from tests.browser.hosts import DESKTOP, PHONE


def need_chromium() -> None:
    # like dockerd, nginx and promtool: a tool the README's test command installs fails the
    # test where it is missing, so a run without it cannot pass for one that drove a browser
    if not CHROMIUM.exists():
        pytest.fail(f"{CHROMIUM} is missing: ./scripts/test.sh installs Debian's chromium")


def need_axe() -> None:
    version = axe.installed_version()
    if version != axe.PINNED:
        pytest.fail(f"axe-core {axe.PINNED} is not in node_modules/ (found: {version}): "
                    "./scripts/test.sh installs it with npm ci")


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    need_chromium()
    with Browser.start() as started:
        yield started


# name: (viewport, mobile, colour scheme)
VIEWS = {"desktop": (DESKTOP, False, "light"), "360": (PHONE, True, "light"),
         "dark": (DESKTOP, False, "dark")}


@pytest.fixture
def view(browser: Browser) -> Iterator[Callable[..., Page]]:
    """`view(url, "desktop" | "360" | "dark")`: the page loaded so; the browser reset after."""
    def load(url: str, name: str = "desktop") -> Page:
        (width, height), mobile, scheme = VIEWS[name]
        browser.set_viewport(width, height, mobile=mobile)
        browser.color_scheme(scheme)
        return browser.navigate(url)

    yield load
    browser.send("Emulation.clearDeviceMetricsOverride")
    browser.color_scheme(None)
