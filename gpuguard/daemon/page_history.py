"""The status page's last hour per GPU: one point (temperature, power, SM clock) per fast
cycle, in memory only (lost on restart; the page says so), bounded whatever the cadence
and the number of boards.

Why not the samples the rules keep (model/samples.py): those hold what the rules judge,
over the windows the rules ask for; this holds exactly an hour for display, thinned to one
point a second when the fast cadence is shorter, so a 0.1 s cadence costs what a 1 s one
does. Times are monotonic: a step of the wall clock neither empties nor stretches it.
"""

from __future__ import annotations

import collections
import threading
from dataclasses import dataclass

from gpuguard.model.snapshot import Snapshot

SPAN_S = 3600.0
MIN_SPACING_S = 1.0
POINTS_MAX = int(SPAN_S / MIN_SPACING_S)  # per GPU
BOARDS_MAX = 64  # rings kept; a board not sampled for an hour is dropped first


@dataclass(frozen=True)
class Point:
    at: float  # time.monotonic()
    temperature_c: float | None
    power_w: float | None
    sm_clock_mhz: float | None


class PageHistory:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._rings: dict[str, collections.deque[Point]] = {}

    @staticmethod
    def key(uuid: str | None, index: int) -> str:
        return uuid or f"index:{index}"

    def add(self, snap: Snapshot, now: float) -> None:
        """The sweep's readings of each GPU (None where a reading failed: a gap)."""
        with self._lock:
            for gpu in snap.gpus:
                ring = self._rings.setdefault(self.key(gpu.uuid.value, gpu.index),
                                              collections.deque(maxlen=POINTS_MAX))
                if ring and now - ring[-1].at < MIN_SPACING_S:
                    continue
                ring.append(Point(now, _number(gpu.temperature_c.get_or(None)),
                                  _number(gpu.power_draw_w.get_or(None)),
                                  _number(gpu.clock_sm_mhz.get_or(None))))
            self._forget(now)

    def points(self, key: str, now: float) -> list[Point]:
        with self._lock:
            ring = self._rings.get(key)
            return [p for p in ring if now - p.at <= SPAN_S] if ring else []

    def _forget(self, now: float) -> None:
        for ring in self._rings.values():
            while ring and now - ring[0].at > SPAN_S:
                ring.popleft()
        for key in [k for k, ring in self._rings.items() if not ring]:
            del self._rings[key]
        while len(self._rings) > BOARDS_MAX:  # the board sampled longest ago goes first
            del self._rings[min(self._rings, key=lambda k: self._rings[k][-1].at)]


def _number(value: object) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) \
        else None
