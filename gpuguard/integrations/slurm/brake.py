"""The fleet brake (docs/slurm.md#the-fleet-brake): a bad rule or a bad driver push must not
drain a cluster. Before draining (health) or failing a job (prolog, epilog: Slurm drains
then), the node counts the nodes of its partitions that gpuguard drained within the
window (on slurmctld's clock: integrations/slurm/clock.py), this drain included; at or
above the share it does not drain. That is a rate: a push that keeps failing would still
empty the partition one window at a time, so there is also a cap: the nodes drained with
gpuguard's reason now, whatever their age; at or above `cap_percent` of the partition no
new drain, ever (existing drains are not undone).
Slurm's "Prolog error"/"Epilog error" drains within the window count as gpuguard's for
both (health takes its own over only at its next run).
A partition of `small_partition` nodes or fewer (a share of them is one node or none)
drains one node at a time: like EKS's node auto repair, which applies its 20 % to groups
of more than five nodes.

slurmd runs health programs on every node at about the same moment, so after a driver push
each node would count the others before any of them drained. The node therefore waits a
random share of the health interval and counts again just before draining. What remains:
two nodes whose recounts fall within one sinfo round trip of each other can both drain
past the share (docs/slurm.md says how far).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from gpuguard.integrations.slurm.clock import Clock
from gpuguard.integrations.slurm.ctl import NodeInfo
from gpuguard.integrations.slurm.plan import SLURM_SCRIPT_REASONS, ours


@dataclass
class BrakeSettings:
    percent: float = 20.0
    window_s: float = 600.0
    small_partition: int = 5
    # the wait before the recount: at most this share of HealthCheckInterval, and at most
    # max_jitter_s (slurmd kills a health program after 60 s)
    jitter_share: float = 0.2
    max_jitter_s: float = 30.0
    cap_percent: float = 30.0


@dataclass
class Count:
    drained_by_us: list[str]  # within the window, this node not included
    total: int
    held_by_us: list[str] = field(default_factory=list)  # any age, this node not included

    def describe(self) -> str:
        return f"{len(self.drained_by_us) + 1} of {self.total} node(s) with this one"


def count(nodes: dict[str, NodeInfo], me: str, clock: Clock, window_s: float) -> Count:
    """The partitions' nodes gpuguard drained within the window. Slurm's reason time is
    slurmctld's wall clock, the only time two nodes share: the window is on that clock
    (integrations/slurm/clock.py), and a reason time after its end counts too."""
    since = clock.since(window_s, [n.reason_time for n in nodes.values()])

    def recent(n: NodeInfo) -> bool:
        return n.reason_time is not None and n.reason_time >= since

    others = [n for n in nodes.values() if n.name != me and n.drained]
    held = [n for n in others if ours(n.reason)
            or (n.reason in SLURM_SCRIPT_REASONS and recent(n))]
    return Count(sorted(n.name for n in held if recent(n)), len(nodes),
                 sorted(n.name for n in held))


def cap_nodes(total: int, settings: BrakeSettings) -> int:
    """How many nodes gpuguard may hold drained at once (at least one)."""
    return max(1, int(total * settings.cap_percent / 100.0))


def why_held(found: Count, settings: BrakeSettings) -> str | None:
    """Why one more drain would reach the brake (None: it would not)."""
    cap = cap_nodes(found.total, settings)
    if len(found.held_by_us) >= cap:
        return (f"{len(found.held_by_us)} of {found.total} node(s) already drained by "
                f"gpuguard (any age) reach the cap of {cap} ({settings.cap_percent:g} %)")
    rate = (f"{found.describe()} drained by gpuguard within {settings.window_s:g} s "
            f"reaches the brake ({settings.percent:g} %)")
    if found.total <= settings.small_partition:
        return rate if len(found.drained_by_us) >= 1 else None
    return rate if (len(found.drained_by_us) + 1) * 100.0 / found.total >= settings.percent \
        else None


def holds(found: Count, settings: BrakeSettings) -> bool:
    """Whether draining one more node would reach the brake (its rate or its cap)."""
    return why_held(found, settings) is not None


def jitter_s(settings: BrakeSettings, interval_s: float | None) -> float:
    """The random wait before the recount (seconds)."""
    share = settings.jitter_share * (interval_s or 60.0)
    return random.uniform(0.0, max(0.0, min(share, settings.max_jitter_s)))
