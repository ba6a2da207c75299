"""Host text on the status page, in the real browser (issue 31): every host-sourced field
filled with hostile and generated strings (HTML metacharacters, quotes, `</style>`,
`javascript:` URLs, control characters, very long text), served with the page's own
headers; the DOM the browser built has exactly the elements and attributes of a benign
page, each string's text is in it as the page shows it, and nothing ran."""

from __future__ import annotations

import dataclasses
import random

import pytest

from gpuguard.outputs.page_style import HEADERS
from gpuguard.outputs.status_page import Page, render, shown
from tests.browser.cdp import Browser
from tests.browser.loopback import serve
from tests.test_status_page_render import NASTY, filled, generated, sample_page

# every element with its attribute names, in document order, as the browser built them
STRUCTURE = ("Array.from(document.querySelectorAll('*')).map(e => e.tagName + '|' + "
             "Array.from(e.attributes).map(a => a.name).join(','))")


def still(page: Page) -> Page:
    # no reload while the test looks (the reload's own test: test_status_page_browser.py)
    return dataclasses.replace(page, refresh_s=0)


@pytest.mark.parametrize("seed", range(6))
def test_host_text_is_text_in_the_browser(browser: Browser, seed: int) -> None:
    rng = random.Random(seed)
    strings = [rng.choice(NASTY) if i % 2 else generated(rng) for i in range(64)]
    # seed 0 puts each nasty string in turn into every field
    if seed == 0:
        strings = NASTY * 6
    used: list[tuple[str, str]] = []
    sample = still(sample_page())
    hostile = filled(sample, strings, used)
    pages = {"/benign": render(sample).encode(), "/hostile": render(hostile).encode()}
    with serve(pages, HEADERS) as url:
        browser.navigate(url + "/benign")
        benign_structure = browser.evaluate(STRUCTURE)
        loaded = browser.navigate(url + "/hostile")
        assert browser.evaluate(STRUCTURE) == benign_structure
        text = browser.evaluate("document.documentElement.textContent")
        for name, value in used:
            if name == "events_note":  # shown only where there are no events
                continue
            assert shown(value) in text or shown(value, 200) in text, (name, value)
        # nothing from the strings ran, and the policy had nothing to refuse
        assert browser.evaluate("typeof window.alert === 'function' && "
                                "document.querySelectorAll('script,img,svg [onload]')"
                                ".length") == 0
        assert loaded.csp_violations() == []
