"""A short history of the few readings that rules judge over time (daemon only).

`gpuguard check` sees one instant; the daemon keeps, per GPU, small samples of the
counters whose growth matters (ECC corrected, AER correctable, PCIe replays, NVLink
error counters summed over the GPU's links) and of the HW-slowdown bit, for about ten
minutes. Checks get it as `ctx.samples` (None in
`check`) and judge rates and persistence instead of single values.

A sample's time `t` is the daemon's time.monotonic(): windows, rates and the span kept are
differences of it, so a step of the wall clock (NTP, a VM restored from a snapshot, +100
days for a few seconds) neither empties a window nor makes a rate negative or tiny.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from gpuguard.model import clock_events
from gpuguard.model.derived import NVLINK_COUNTERS, aer_total
from gpuguard.model.snapshot import GpuSnapshot, Snapshot


@dataclass(frozen=True)
class Sample:
    t: float  # time.monotonic() of the cycle (never the wall clock)
    ecc_corrected: int | None
    aer_correctable: int | None
    replays: int | None
    hw_slowdown: bool | None
    # clocks.power_cap judges capping over time: the SW power cap bit, the (1 s average)
    # draw and the SM clock of each cycle.
    power_cap: bool | None = None
    power_draw_w: float | None = None
    clock_sm_mhz: int | None = None
    # nvlink.errors judges growth: each NVLink error counter summed over the GPU's links
    # (a healthy H200 link shows CRC data 23 since the driver loaded: totals are no fault).
    nvlink_replay: int | None = None
    nvlink_recovery: int | None = None
    nvlink_crc_flit: int | None = None
    nvlink_crc_data: int | None = None
    # The links whose four counters the sums above cover: sums are compared only between
    # samples of the same set, so a link whose counters drop out and come back is never
    # its whole lifetime count taken as growth.
    nvlink_read: frozenset[int] | None = None


def gpu_key(gpu: GpuSnapshot) -> str:
    return gpu.identity().key


def sample(gpu: GpuSnapshot, t: float) -> Sample:
    aer = None
    if gpu.pcie_aer.is_ok:
        aer = aer_total(gpu.pcie_aer.get(), "correctable")
    reasons = gpu.clock_event_reasons.value if gpu.clock_event_reasons.is_ok else None
    nvlink, read = _nvlink_sums(gpu)
    return Sample(
        t=t,
        ecc_corrected=gpu.ecc_volatile_corrected.value if gpu.ecc_volatile_corrected.is_ok
        else None,
        aer_correctable=aer,
        replays=gpu.pcie_replay_counter.value if gpu.pcie_replay_counter.is_ok else None,
        hw_slowdown=None if reasons is None else bool(reasons & clock_events.HW_ANY),
        power_cap=None if reasons is None else bool(reasons & clock_events.SW_POWER_CAP),
        power_draw_w=gpu.power_draw_w.get_or(None),
        clock_sm_mhz=gpu.clock_sm_mhz.get_or(None),
        nvlink_replay=nvlink["replay"],
        nvlink_recovery=nvlink["recovery"],
        nvlink_crc_flit=nvlink["crc_flit"],
        nvlink_crc_data=nvlink["crc_data"],
        nvlink_read=read,
    )


def _nvlink_sums(gpu: GpuSnapshot) -> tuple[dict[str, int | None], frozenset[int] | None]:
    """Each counter summed over the links that gave all four, and which links those are."""
    if not gpu.nvlink_links.is_ok:
        return dict.fromkeys(NVLINK_COUNTERS), None
    full = [link for link in gpu.nvlink_links.get()
            if all(link.get(name) is not None for name in NVLINK_COUNTERS)]
    if not full:
        return dict.fromkeys(NVLINK_COUNTERS), frozenset()
    sums: dict[str, int | None] = {name: sum(link[name] for link in full)
                                   for name in NVLINK_COUNTERS}
    return sums, frozenset(link["link"] for link in full)


class Samples:
    def __init__(self, keep_s: float = 660.0) -> None:
        self.keep_s = keep_s
        self._by_gpu: dict[str, deque[Sample]] = {}

    def add(self, snapshot: Snapshot, t: float) -> None:
        seen = set()
        for gpu in snapshot.gpus:
            key = gpu_key(gpu)
            seen.add(key)
            samples = self._by_gpu.setdefault(key, deque())
            samples.append(sample(gpu, t))
            while samples and t - samples[0].t > self.keep_s:
                samples.popleft()
        for key in set(self._by_gpu) - seen:  # a GPU that left takes its history with it
            del self._by_gpu[key]

    def of(self, gpu: GpuSnapshot) -> list[Sample]:
        """Older samples first; the last one is this cycle's."""
        return list(self._by_gpu.get(gpu_key(gpu), ()))


def growth(samples: list[Sample], field: str) -> tuple[int, float] | None:
    """How much a counter grew between the last two samples, and over how many seconds.
    A drop is a counter reset (driver reload), not negative growth: None."""
    if len(samples) < 2:
        return None
    before, now = getattr(samples[-2], field), getattr(samples[-1], field)
    if before is None or now is None or now < before:
        return None
    return now - before, samples[-1].t - samples[-2].t


def window_growth(samples: list[Sample], field: str, window_s: float
                  ) -> tuple[int, float] | None:
    """How much a counter grew over the last `window_s` seconds, and over how many seconds
    of samples: from the oldest sample in the window after the last drop (a drop is a
    counter reset, e.g. a driver reload, never negative growth). None below two samples."""
    if not samples:
        return None
    now = samples[-1].t
    usable = [(s.t, getattr(s, field)) for s in samples
              if now - s.t <= window_s and getattr(s, field) is not None]
    start = 0
    for i in range(1, len(usable)):
        if usable[i][1] < usable[i - 1][1]:
            start = i
    usable = usable[start:]
    if len(usable) < 2:
        return None
    return usable[-1][1] - usable[0][1], usable[-1][0] - usable[0][0]
