#!/usr/bin/env python3
"""Screenshots of the daemon's status page (issue 31), by the browser tests' own harness:
the real daemon on the healthy and the faulty replayed host (tests/browser/hosts.py),
headless Debian chromium over the DevTools protocol (tests/browser/cdp.py).

Writes status-{healthy,faulty}-{desktop,360,dark}.png into --out (docs/images by default;
`make screenshots`): desktop is 1280 CSS px wide, 360 a phone 360 px wide, dark the desktop
under `prefers-color-scheme: dark`. Each is the whole page, at one device pixel per CSS px.

    .venv/bin/python scripts/screenshots.py [--out DIR]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.browser.cdp import Browser  # noqa: E402
from tests.browser.hosts import DESKTOP, HOSTS, PHONE, status_pages  # noqa: E402

# name: (viewport, mobile, colour scheme)
VIEWS = {"desktop": (DESKTOP, False, "light"), "360": (PHONE, True, "light"),
         "dark": (DESKTOP, False, "dark")}


def shoot(browser: Browser, url: str, view: str) -> bytes:
    (width, height), mobile, scheme = VIEWS[view]
    browser.set_viewport(width, height, mobile=mobile)
    browser.color_scheme(scheme)
    browser.navigate(url)
    return browser.screenshot(full_page=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=REPO / "docs" / "images",
                        help="the folder the PNGs go to (default: docs/images)")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="gpuguard-screenshots-") as tmp, \
            status_pages(Path(tmp)) as daemons, Browser.start() as browser:
        for host in HOSTS:
            for view in VIEWS:
                path = args.out / f"status-{host}-{view}.png"
                path.write_bytes(shoot(browser, daemons[host].url + "/", view))
                print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
