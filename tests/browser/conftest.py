"""A headless chromium per module (tests/browser/cdp.py), and axe-core for it."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.browser import axe
from tests.browser.cdp import CHROMIUM, Browser


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
