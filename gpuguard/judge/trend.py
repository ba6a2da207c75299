"""Is a quantity growing towards a limit? A least-squares line through a window of samples.

Pure arithmetic, no I/O: service.memory_growth (host RSS and GPU memory of a supervised
service) is judged here, once. gpuguard/model/samples.py has only the growth between two
samples or across a window (counters); a leak needs a fitted slope, since one sample
taken during a burst would make two-point growth say anything.

How a warm-up ramp is told apart from a leak (both grow at first):
1. samples taken before the service first answered, and within `warmup_s` after, are
   left out (a model loading, a KV cache being allocated, CUDA graphs being captured;
   counted from the first answer, not from the process start, since loading a large
   model from network storage can take longer than any fixed warm-up);
2. the growth must still go on in the newest third of the window: the slope fitted over
   that third must be at least `recent_ratio` of the whole window's slope. A ramp that
   then stays flat fits a positive slope over the window but a flat newest third: not a
   leak. A leak keeps growing at the same pace, so its newest third fits the same slope.
3. the line must explain the samples (r² at least `min_r2`): a noisy flat series that
   happens to fit a small upward slope is not a trend.
Only then is the time to the limit projected: headroom / slope.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

Point = tuple[float, float]  # (time in seconds, value)


@dataclass(frozen=True)
class Fit:
    slope: float  # value units per second
    intercept: float
    r2: float  # 1.0 when the values do not vary at all (a flat line explains them)
    samples: int
    span_s: float


def fit(points: Sequence[Point]) -> Fit | None:
    """The least-squares line through the points; None below two points or when they all
    share one time (no slope can be told)."""
    n = len(points)
    if n < 2:
        return None
    mean_t = math.fsum(t for t, _ in points) / n
    mean_v = math.fsum(v for _, v in points) / n
    stt = math.fsum((t - mean_t) ** 2 for t, _ in points)
    if stt == 0.0:
        return None
    stv = math.fsum((t - mean_t) * (v - mean_v) for t, v in points)
    svv = math.fsum((v - mean_v) ** 2 for _, v in points)
    slope = stv / stt
    intercept = mean_v - slope * mean_t
    r2 = 1.0 if svv == 0.0 else min(1.0, (stv * stv) / (stt * svv))
    span = max(t for t, _ in points) - min(t for t, _ in points)
    return Fit(slope, intercept, r2, n, span)


@dataclass(frozen=True)
class Growth:
    """The judgement of one series: `leak` is True only when every condition held."""

    leak: bool
    reason: str
    samples: int
    slope: float | None = None  # per second, over the judged samples
    r2: float | None = None
    recent_slope: float | None = None
    projected_s: float | None = None  # seconds until the headroom is used up


@dataclass(frozen=True)
class Limits:
    """The rule file's numbers (rules/service.yaml, service.memory_growth)."""

    warmup_s: float
    min_samples: int
    min_r2: float
    recent_ratio: float
    horizon_s: float


def judge(points: Sequence[Point], headroom: float, ready_at: float | None,
          limits: Limits) -> Growth:
    """Whether the series (older first, already cut to the window and to the current run
    of the service) grows steadily enough to use up `headroom` within `limits.horizon_s`.
    `ready_at`: when the service first answered; the warm-up is counted from it (None:
    no warm-up is left out)."""
    if ready_at is not None:
        points = [p for p in points if p[0] >= ready_at + limits.warmup_s]
    n = len(points)
    if n < limits.min_samples:
        return Growth(False, f"{n} samples after warm-up, {limits.min_samples} needed", n)
    whole = fit(points)
    if whole is None:
        return Growth(False, "the samples span no time", n)
    if whole.slope <= 0:
        return Growth(False, "not growing", n, whole.slope, whole.r2)
    newest = _newest_third(points)
    recent = fit(newest)
    recent_slope = recent.slope if recent is not None else None
    if recent_slope is None or recent_slope < limits.recent_ratio * whole.slope:
        return Growth(False, "growth stopped in the newest third of the window (a warm-up "
                      "ramp, not a leak)", n, whole.slope, whole.r2, recent_slope)
    if whole.r2 < limits.min_r2:
        return Growth(False, f"no steady trend (r² {whole.r2:.2f} < {limits.min_r2:g})", n,
                      whole.slope, whole.r2, recent_slope)
    projected = max(headroom, 0.0) / whole.slope
    if projected >= limits.horizon_s:
        return Growth(False, "growing, but the limit is further than the horizon", n,
                      whole.slope, whole.r2, recent_slope, projected)
    return Growth(True, "growing steadily towards the limit", n, whole.slope, whole.r2,
                  recent_slope, projected)


def _newest_third(points: Sequence[Point]) -> list[Point]:
    """The samples in the newest third of the series' time span (at least three, so a
    slope can be fitted even when the sampling was uneven)."""
    first, last = points[0][0], points[-1][0]
    cut = last - (last - first) / 3.0
    newest = [p for p in points if p[0] >= cut]
    return newest if len(newest) >= 3 else list(points[-3:])
