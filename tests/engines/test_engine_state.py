"""Stuck, saturated, at capacity or unknown (gpuguard/judge/engine_state.py), from
sequences of reads as the daemon keeps them: [t (monotonic), error, running, waiting,
progress, kv_cache, preemptions]."""

from __future__ import annotations

from typing import Any

from gpuguard.judge.engine_state import Limits, judge, sustained_capacity

LIMITS = Limits(stuck_after_s=120.0, kv_full=0.95)


def read(t: float, running: float | None = 4, waiting: float | None = 0,
         progress: float | None = 1000, kv: float | None = 0.3,
         preempted: float | None = 0, error: str | None = None) -> list[Any]:
    return [t, error, running, waiting, progress, kv, preempted]


def flat(start: float, end: float, step: float = 5.0, **values: Any) -> list[list[Any]]:
    reads, t = [], start
    while t <= end:
        reads.append(read(t, **values))
        t += step
    return reads


def test_busy_and_flat_for_stuck_after_is_stuck_with_how_long_and_how_many():
    reads = flat(0, 115, waiting=12)
    assert judge(reads, LIMITS, False, "tokens").state == "ok"  # 115 s: not yet
    reads += flat(120, 125, waiting=12)
    state = judge(reads, LIMITS, False, "tokens")
    assert state.state == "stuck" and state.flat_s == 125.0
    assert state.message == ("stuck: 4 running and 12 waiting and no tokens made for 125 s "
                             "(stuck_after 120 s)")


def test_the_window_starts_at_the_first_flat_read_not_the_run():
    reads = [read(t, progress=t * 10) for t in range(0, 300, 5)]  # rising for 300 s
    reads += flat(300, 400, progress=2950)
    state = judge(reads, LIMITS, False, "tokens")
    # 2950 was first read at t=295 (the last rising read): 105 s flat, not stuck
    assert state.state == "ok" and state.flat_s == 105.0


def test_a_counter_that_goes_back_in_the_same_run_is_unknown_for_the_window():
    """Review 4 (engine_two_pages_masks_hung.py): the run is the same (the daemon starts
    the reads over for a new one), so a counter that goes back is no one engine's."""
    reads = flat(0, 100, progress=5000)
    reads += flat(105, 200, progress=0)
    state = judge(reads, LIMITS, True, "tokens")
    assert state.state == "unknown" and "went back from 5,000 to 0" in state.message
    # stuck_after past the step, the reads after it are judged: flat since 105
    assert judge(reads + flat(205, 230, progress=0), LIMITS, False, "tokens").state == "stuck"


def test_idle_is_never_stuck():
    reads = flat(0, 1000, running=0, waiting=0)
    state = judge(reads, LIMITS, False, "tokens")
    assert state.state == "ok" and state.message == "idle: no request running or waiting"


def test_an_engine_that_answered_the_probe_is_not_stuck():
    """Gauges an engine has not updated say flat; a request it served says it works."""
    reads = flat(0, 300)
    assert judge(reads, LIMITS, False, "tokens", answered=True).state == "ok"


def test_a_failed_read_in_between_neither_breaks_nor_extends_the_window():
    reads = [*flat(0, 60), read(65, error="cannot connect"), *flat(70, 125)]
    state = judge(reads, LIMITS, False, "tokens")
    assert state.state == "stuck" and state.flat_s == 125.0


def test_metrics_unreachable_is_unknown():
    reads = [*flat(0, 300), read(305, error="answered 503")]
    state = judge(reads, LIMITS, False, "tokens")
    assert state.state == "unknown" and "answered 503" in state.message
    assert judge([], LIMITS, False, "tokens").state == "unknown"


def test_busy_without_a_progress_counter_is_unknown():
    state = judge([read(0, progress=None)], LIMITS, False, "tokens")
    assert state.state == "unknown" and "no progress counter" in state.message
    assert judge([read(0, running=None, waiting=None)], LIMITS, False,
                 "tokens").state == "unknown"


def test_rising_while_the_probe_times_out_is_saturated():
    reads = [read(0, running=256, waiting=900, progress=1000),
             read(5, running=256, waiting=900, progress=26000)]
    state = judge(reads, LIMITS, True, "tokens")
    assert state.state == "saturated"
    assert state.message == ("saturated: 256 running and 900 waiting, 25,000 tokens made "
                             "since the last read")
    # the same reads with the probe answering: ok, busy
    assert judge(reads, LIMITS, False, "tokens").state == "ok"
    # flat while the probe times out: not saturated (until stuck_after: ok, then stuck)
    assert judge(flat(0, 5), LIMITS, True, "tokens").state == "ok"


def test_kv_full_with_preemptions_rising_is_capacity_and_ok_otherwise():
    reads = [read(0, kv=0.97, preempted=10, progress=1),
             read(5, kv=0.97, preempted=14, progress=2)]
    assert judge(reads, LIMITS, False, "tokens").state == "capacity"
    still = [read(0, kv=0.97, preempted=10), read(5, kv=0.97, preempted=10, progress=1001)]
    assert judge(still, LIMITS, False, "tokens").state == "ok"
    # an engine that counts no preemptions (SGLang): its KV pool alone
    no_count = [read(0, kv=0.97, preempted=None), read(5, kv=0.97, preempted=None)]
    assert judge(no_count, LIMITS, False, "tokens").state == "capacity"


def test_capacity_is_sustained_only_over_the_whole_window():
    full = [read(t, kv=0.97, preempted=t) for t in range(0, 905, 5)]
    assert sustained_capacity(full, 0.95, 900) == 900.0
    assert sustained_capacity(full[:-1], 0.95, 900) is None
    broken = [*full[:90], read(450, kv=0.5, preempted=450), *full[91:]]
    assert sustained_capacity(broken, 0.95, 900) is None
    held = [read(t, kv=0.97, preempted=3) for t in range(0, 905, 5)]  # no preemption
    assert sustained_capacity(held, 0.95, 900) is None
