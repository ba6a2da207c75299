"""The fleet brake (docs/slurm.md#the-fleet-brake): a bad rule or a bad driver push must not
drain a cluster. Before draining, the node counts the nodes of its partitions that gpuguard
drained within the window, this drain included; at or above the share it does not drain.
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
from dataclasses import dataclass

from gpuguard.integrations.slurm import PREFIX
from gpuguard.integrations.slurm_ctl import NodeInfo


@dataclass
class BrakeSettings:
    percent: float = 20.0
    window_s: float = 600.0
    small_partition: int = 5
    # the wait before the recount: at most this share of HealthCheckInterval, and at most
    # max_jitter_s (slurmd kills a health program after 60 s)
    jitter_share: float = 0.2
    max_jitter_s: float = 30.0


@dataclass
class Count:
    drained_by_us: list[str]  # within the window, this node not included
    total: int

    def describe(self) -> str:
        return f"{len(self.drained_by_us) + 1} of {self.total} node(s) with this one"


def count(nodes: dict[str, NodeInfo], me: str, now: float, window_s: float) -> Count:
    """The partitions' nodes gpuguard drained within the window (Slurm's reason time is
    wall clock: it is the only time two nodes share)."""
    recent = [n.name for n in nodes.values() if n.name != me and n.drained
              and n.reason.startswith(PREFIX) and n.reason_time is not None
              and now - window_s <= n.reason_time <= now + 60]
    return Count(sorted(recent), len(nodes))


def holds(found: Count, settings: BrakeSettings) -> bool:
    """Whether draining one more node would reach the brake."""
    if found.total <= settings.small_partition:
        return len(found.drained_by_us) >= 1
    return (len(found.drained_by_us) + 1) * 100.0 / found.total >= settings.percent


def jitter_s(settings: BrakeSettings, interval_s: float | None) -> float:
    """The random wait before the recount (seconds)."""
    share = settings.jitter_share * (interval_s or 60.0)
    return random.uniform(0.0, max(0.0, min(share, settings.max_jitter_s)))
