"""Every kernel-log fixture gives the verdict it gave before the driver-prefix rule (issue 28,
item 1): tests/fixtures/kmsg/expected-verdicts.json holds what the code of commit 087a9c7
said of each (how it was written: tests/sources/kmsg_verdicts.py). A line the rule no longer
takes changes a verdict here, and says which."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.sources.kmsg_verdicts import EXPECTED, fixtures, ranked, verdict

_EXPECTED = json.loads(EXPECTED.read_text())


def test_every_fixture_has_an_expected_verdict():
    assert sorted(_EXPECTED) == [p.name for p in fixtures()]


# Lost-GPU lines without an Xid that issue 36 (item 1) now counts as Xid 79, in fixtures
# the expected file had before: the addresses xid.recent's host result names for them (the
# probe failure names none). Nothing else of those verdicts changes.
NOW_CAUGHT = {"driver-shapes.log": "0000:01:00.0, no address (not among the GPUs NVML lists): "
                                   "Xid 79 x2 (GPU has fallen off the bus; the driver logged",
              "gsp.kmsg": "0000:a2:00.0 (not among the GPUs NVML lists): Xid 79 (GPU has "
                          "fallen off the bus; the driver logged 'GPU 0000:a2:00.0: "
                          "RmInitAdapter failed!"}


def without_lost_lines(found: dict[str, Any]) -> dict[str, Any]:
    """The verdict without xid.recent's host result and the lost-GPU events without an Xid
    (those carry the driver's `line`)."""
    summary = {**found["summary"],
               "xids": [e for e in found["summary"]["xids"] if "line" not in e]}
    return {**found, "summary": summary,
            "results": [r for r in found["results"] if r[:2] != ["xid.recent", None]]}


@pytest.mark.parametrize("fixture", fixtures(), ids=lambda p: p.name)
def test_the_fixture_gives_the_verdict_it_gave_before(fixture):
    got = json.loads(json.dumps(verdict(fixture)))
    if fixture.name not in NOW_CAUGHT:
        assert ranked(got) == ranked(_EXPECTED[fixture.name])
        return
    host = next(r for r in got["results"] if r[:2] == ["xid.recent", None])
    assert host[2] == "critical" and host[3].startswith(NOW_CAUGHT[fixture.name]), host
    assert ranked(without_lost_lines(got)) == ranked(without_lost_lines(_EXPECTED[fixture.name]))
