"""The brake's "now" on slurmctld's clock (docs/slurm.md#the-fleet-brake).

The reason times the brake counts (sinfo's %H) are slurmctld's: it stamps a reason with its
own clock when the drain is set. Compared with this node's clock they are off by the skew
between the two: a node minutes behind slurmctld sees the other drains "in the future", a
node ahead sees them older than they are, and either way the rate let drains through.

So "now" is slurmctld's, from `sdiag`: its first line, `sdiag output at <date> (<Unix
time>)`, is the time slurmctld packed its reply. sdiag(1) documents the tool as showing
"information related to slurmctld execution"; the value is the statistics reply's
`req_time`, which slurmctld fills with its own time(NULL) (src/slurmctld/statistics.c,
pack_all_stat; printed by src/sdiag/sdiag.c), and which Slurm's REST API serves as
`statistics.req_time` of /slurm/v0.0.xx/diag. The man page does not describe the header
line itself: a line this module cannot read is "not known", never a guess.

Where slurmctld's time cannot be had (sdiag missing, refused, past its deadline, or
printing something else), the brake counts as recent every drain whose reason time lies
within the window by either clock it has, or in the future: the node's own, and
slurmctld's as far as its own stamps tell (it cannot have stamped a reason after its now,
so the newest reason time in the partition is a lower bound of its clock). It errs toward
not draining: a node far ahead still sees the drains of the last window, at the price of
counting old drains as recent when no newer reason was set since.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterable
from dataclasses import dataclass

from gpuguard.integrations.slurm.ctl import SlurmSettings, SlurmUnavailable

# "sdiag output at Wed Dec 02 07:18:00 2026 (1796195880)": the Unix time in parentheses
# (Slurm 17.11 and later; older ones printed only the date, which reads as not known)
_HEADER = re.compile(r"^sdiag output at .*\((?P<epoch>\d{9,11})\)\s*$")
HEADER_LINES = 5  # the header is the second line; a banner or a warning may come first


@dataclass(frozen=True)
class Clock:
    """slurmctld's clock relative to this node's (None: not known) and where it came from."""

    offset_s: float | None
    source: str

    def since(self, window_s: float, stamps: Iterable[float | None] = ()) -> float:
        """The earliest reason time that counts as within the window (later ones, in the
        future included, count too: counting errs toward braking)."""
        node_now = time.time()
        if self.offset_s is not None:
            return node_now + self.offset_s - window_s
        newest = max((s for s in stamps if s is not None), default=node_now)
        return min(node_now, newest) - window_s

    def now(self) -> float | None:
        """slurmctld's time now (None: not known)."""
        return None if self.offset_s is None else time.time() + self.offset_s

    def describe(self) -> str:
        if self.offset_s is None:
            return f"slurmctld's clock not known ({self.source}): counting drains within " \
                   "the window by this node's clock or by the newest reason time, or later"
        return f"on slurmctld's clock ({self.source}; this node {_skew(-self.offset_s)})"


def _skew(ahead_s: float) -> str:
    if abs(ahead_s) < 2:
        return "in step"
    return f"{abs(ahead_s):.0f} s {'ahead' if ahead_s > 0 else 'behind'}"


def parse_sdiag(text: str) -> float | None:
    """The Unix time of sdiag's header (None: not there, or not readable)."""
    for line in text.splitlines()[:HEADER_LINES]:
        found = _HEADER.match(line.strip())
        if found:
            return float(found["epoch"])
    return None


def read(settings: SlurmSettings) -> Clock:
    """slurmctld's clock, from one sdiag call (within the settings' deadline)."""
    try:
        out = settings.run("sdiag")
    except SlurmUnavailable as exc:
        return Clock(None, f"sdiag: {exc}")
    replied = time.time()  # after the reply: slurmctld's time is at most this much older
    epoch = parse_sdiag(out)
    if epoch is None:
        return Clock(None, "sdiag printed no 'sdiag output at ... (<Unix time>)' line")
    return Clock(epoch - replied, "sdiag")
