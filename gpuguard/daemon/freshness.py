"""One freshness rule, owned here (issue 28, item 5): how old a result of each cadence may
get before every consumer calls it stale: `gpuguard status` and `slurm health` (the
socket's verdict, daemon/verdict_view.py), node-problem-detector's files (their max_age,
daemon/verdict_files.py) and /healthz (daemon/status.py) all read this one value.

    stale_after = 2 x (interval + the longest a cycle of that cadence may take)

The second term comes from the configured deadlines, summed where they run one after
another in a cycle and the largest where they run at once: NVML's sweep (`--timeout`: a
sweep that reaches it is a finding, driver.responsive, in a cycle that ends), the
services' inference requests and engine reads (all at once: the slowest service's, plus
the grace the cycle gives them), a probe container's run (the slow cycle's, with
--probe-image) and the wait for a new finding's history (daemon/recorder.py). The host
sources' file reads take milliseconds; their deadline is a fault's bound, not a
cycle's length: one that reaches it makes its own fields unknown, and cycles that keep
running late make the results stale, which errs toward unknown.
A daemon that is slow by design (a service whose probe may take 3 s under a 1 s cadence)
is then never called stale while its cycles end within their deadlines; one whose cycle
stopped ending is, two of its longest cycles later.
"""

from __future__ import annotations

from dataclasses import dataclass, field

STALE_AFTER_CYCLES = 2


@dataclass(frozen=True)
class Freshness:
    """The cadences' intervals and the longest a cycle of each may take (seconds)."""

    intervals: dict[str, float]
    longest: dict[str, float] = field(default_factory=dict)

    def interval(self, cadence: str) -> float:
        return self.intervals.get(cadence, self.intervals.get("fast", 5.0))

    def cycle_bound(self, cadence: str) -> float:
        return self.longest.get(cadence, 0.0)

    def stale_after(self, cadence: str) -> float:
        """Seconds after which a result of this cadence is stale (unknown)."""
        return STALE_AFTER_CYCLES * (self.interval(cadence) + self.cycle_bound(cadence))

    def why(self, cadence: str) -> str:
        """The rule in words, for a stale result's message and the status header."""
        bound = self.cycle_bound(cadence)
        tail = f", a cycle may take up to {bound:g} s" if bound else ""
        return f"stale after {self.stale_after(cadence):g} s: every {self.interval(cadence):g} s" \
            f"{tail}"

    def to_log(self) -> dict[str, float]:
        """What the daemon logs at start and on SIGHUP (`freshness`)."""
        out: dict[str, float] = {}
        for cadence in sorted(self.intervals):
            out[f"{cadence}_interval_s"] = self.interval(cadence)
            out[f"{cadence}_cycle_bound_s"] = round(self.cycle_bound(cadence), 3)
            out[f"{cadence}_stale_after_s"] = round(self.stale_after(cadence), 3)
        return out


def bounds(nvml_timeout_s: float, service_wait_s: float, history_wait_s: float,
           probe_timeout_s: float = 0.0) -> dict[str, float]:
    """The longest a fast and a slow cycle may legitimately take, from their deadlines:
    a fast cycle sweeps NVML, then waits for the services (at once: the slowest) and for
    a new finding's history; a slow one may sweep NVML (when the fast cycles' sweep is
    old), runs the probe container, and waits for history."""
    fast = nvml_timeout_s + service_wait_s + history_wait_s
    slow = nvml_timeout_s + probe_timeout_s + history_wait_s
    return {"fast": fast, "slow": slow}
