"""gpuguard/judge/trend.py: the fitted slope and the leak judgement on known series."""

from __future__ import annotations

import pytest

from gpuguard.judge.trend import Limits, fit, judge

MIB = 1024 * 1024
LIMITS = Limits(warmup_s=60, min_samples=10, min_r2=0.8, recent_ratio=0.5, horizon_s=3600)


def test_fit_recovers_slope_and_intercept() -> None:
    line = fit([(t, 3.0 * t + 7.0) for t in range(10)])
    assert line is not None
    assert line.slope == pytest.approx(3.0)
    assert line.intercept == pytest.approx(7.0)
    assert line.r2 == pytest.approx(1.0)
    assert line.samples == 10 and line.span_s == 9


def test_fit_needs_two_times() -> None:
    assert fit([(1.0, 5.0)]) is None
    assert fit([(1.0, 5.0), (1.0, 6.0)]) is None


def test_fit_flat_series_has_zero_slope() -> None:
    line = fit([(t, 4.0) for t in range(5)])
    assert line is not None and line.slope == 0 and line.r2 == 1.0


def test_step_leak_is_a_leak_with_projection() -> None:
    # +512 MiB every 5 s, sampled every second, 10 GiB of headroom
    points = [(float(t), (t // 5) * 512.0 * MIB) for t in range(100, 200)]
    growth = judge(points, 10 * 1024 * MIB, ready_at=0.0, limits=LIMITS)
    assert growth.leak, growth.reason
    assert growth.slope == pytest.approx(512 * MIB / 5, rel=0.05)
    assert growth.projected_s == pytest.approx(10 * 1024 / (512 / 5), rel=0.05)


def test_ramp_then_flat_is_not_a_leak() -> None:
    # grows for 120 s after warm-up, then holds for 60 s: the whole window fits a rise
    # well (r² 0.93), only the flat newest third tells it from a leak
    points = [(float(t), min(t - 60, 120) * 100.0 * MIB) for t in range(60, 240)]
    line = fit(points)
    assert line is not None and line.slope > 0 and line.r2 > LIMITS.min_r2
    growth = judge(points, 1024 * MIB, ready_at=0.0, limits=LIMITS)
    assert not growth.leak
    assert "newest third" in growth.reason


def test_warmup_samples_are_left_out() -> None:
    # growing only during the first 60 s after start: nothing is left to judge as growth
    points = [(float(t), min(t, 60) * MIB) for t in range(0, 120)]
    growth = judge(points, 1.0, ready_at=0.0, limits=LIMITS)
    assert not growth.leak
    assert growth.slope == 0


def test_too_few_samples_is_not_judged() -> None:
    points = [(float(t), t * MIB) for t in range(100, 109)]
    growth = judge(points, 1.0, ready_at=0.0, limits=LIMITS)
    assert not growth.leak and growth.samples == 9 and "10 needed" in growth.reason
    assert judge([*points, (109.0, 109.0 * MIB)], 1.0, 0.0, LIMITS).leak


def test_noise_is_not_a_trend() -> None:
    values = [0, 9, 1, 8, 2, 9, 0, 9, 1, 10, 0, 9, 2, 10, 1, 10]
    points = [(float(100 + i), v * MIB) for i, v in enumerate(values)]
    growth = judge(points, 1.0, ready_at=0.0, limits=LIMITS)
    assert not growth.leak and "r²" in growth.reason


def test_far_limit_is_not_a_leak() -> None:
    points = [(float(t), t * 1.0) for t in range(100, 200)]
    at_horizon = judge(points, 3600.0, 0.0, LIMITS)  # exactly the horizon away
    assert not at_horizon.leak and at_horizon.projected_s == pytest.approx(3600)
    assert judge(points, 3590.0, 0.0, LIMITS).leak
