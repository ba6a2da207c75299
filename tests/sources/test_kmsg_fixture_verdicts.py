"""Every kernel-log fixture gives the verdict it gave before the driver-prefix rule (issue 28,
item 1): tests/fixtures/kmsg/expected-verdicts.json holds what the code of commit 087a9c7
said of each (how it was written: tests/sources/kmsg_verdicts.py). A line the rule no longer
takes changes a verdict here, and says which."""

from __future__ import annotations

import json

import pytest

from tests.sources.kmsg_verdicts import EXPECTED, fixtures, ranked, verdict

_EXPECTED = json.loads(EXPECTED.read_text())


def test_every_fixture_has_an_expected_verdict():
    assert sorted(_EXPECTED) == [p.name for p in fixtures()]


@pytest.mark.parametrize("fixture", fixtures(), ids=lambda p: p.name)
def test_the_fixture_gives_the_verdict_it_gave_before(fixture):
    got = json.loads(json.dumps(verdict(fixture)))
    assert ranked(got) == ranked(_EXPECTED[fixture.name])
