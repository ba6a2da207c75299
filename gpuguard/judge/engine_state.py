"""Stuck, saturated or at capacity: an inference engine judged from its own metrics
(issue 23), read once per fast cycle (gpuguard/daemon/service_engine.py). Pure functions
of the reads of the service's current run and the rule's limits; service.engine,
service.engine_full and service.inference call them.

A read is `[t, error, running, waiting, progress, kv_cache, preemptions]`: `t` on the
daemon's monotonic clock (a step of the wall clock moves no window), `error` None for a
read that answered, a value None where the page did not hold the signal.

- stuck: requests running or waiting and the progress counter has not moved for
  `stuck_after_s`, counted from the first read of that busy, flat stretch; a counter
  that goes back (the engine restarted) is another value, so the stretch starts again;
  a read that failed in between neither breaks nor extends it (the counter on both sides
  says nothing was made);
- saturated: the counter rose since the last read while the probe's request timed out;
- capacity: KV cache use at or above `kv_full` while preemptions rise (or KV alone where
  the engine counts no preemptions): a healthy peak, never a fault.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

T, ERROR, RUNNING, WAITING, PROGRESS, KV, PREEMPTIONS = range(7)
STATES = ("ok", "saturated", "capacity", "stuck", "unknown")  # the metric's encoding


@dataclass(frozen=True)
class Limits:
    stuck_after_s: float
    kv_full: float  # 0 to 1


@dataclass(frozen=True)
class State:
    state: str  # one of STATES
    message: str
    busy: bool = False
    flat_s: float | None = None  # how long busy with the counter flat
    rising: bool = False
    at_capacity: bool = False


def judge(reads: list[list[Any]], limits: Limits, timed_out: bool, unit: str,
          answered: bool = False) -> State:
    """The engine's state after its newest read. `timed_out`: the probe's request of this
    cycle got no answer in time; `answered`: it passed (an engine that served a request
    is not stuck, whatever gauges it has not updated say)."""
    if not reads:
        return State("unknown", "not read yet")
    newest = reads[-1]
    if newest[ERROR] is not None:
        return State("unknown", f"its metrics could not be read: {newest[ERROR]}")
    busy = _busy(newest)
    if busy is None:
        return State("unknown", "its metrics hold neither requests running nor waiting")
    if busy and newest[PROGRESS] is None:
        return State("unknown", f"{_load(newest)} but its metrics hold no progress counter",
                     busy=True)
    reads_ok = [r for r in reads if r[ERROR] is None]
    previous = reads_ok[-2] if len(reads_ok) > 1 else None
    facts = State("ok", "", busy, _flat_for(reads_ok) if busy else None,
                  _rose(previous, newest, PROGRESS),
                  _at_capacity(previous, newest, limits.kv_full))
    state, message = _name(facts, newest, previous, limits, unit, timed_out, answered)
    return State(state, message, facts.busy, facts.flat_s, facts.rising, facts.at_capacity)


def _name(facts: State, newest: list[Any], previous: list[Any] | None, limits: Limits,
          unit: str, timed_out: bool, answered: bool) -> tuple[str, str]:
    """The state the facts make, worst first, and its message."""
    load = _load(newest)
    if facts.flat_s is not None and facts.flat_s >= limits.stuck_after_s and not answered:
        return "stuck", (f"stuck: {load} and no {unit} made for {facts.flat_s:.0f} s "
                         f"(stuck_after {limits.stuck_after_s:g} s)")
    if facts.rising and timed_out:
        return "saturated", f"saturated: {load}, {_made(previous, newest, unit)} since the " \
            "last read"
    if facts.at_capacity:
        preempting = ", preemptions rising" if newest[PREEMPTIONS] is not None else ""
        return "capacity", (f"at capacity: KV cache {100 * newest[KV]:.0f} % used"
                            f"{preempting}, {load}")
    if not facts.busy:
        return "ok", "idle: no request running or waiting"
    if facts.rising:
        return "ok", f"{load}, {_made(previous, newest, unit)} since the last read"
    return "ok", (f"{load}, no {unit} made for {facts.flat_s or 0:.0f} s (stuck after "
                  f"{limits.stuck_after_s:g} s)")


def sustained_capacity(reads: list[list[Any]], kv_full: float, window_s: float
                       ) -> float | None:
    """How long the engine has been at capacity without a break, when that covers at
    least `window_s`: every read answered in the window at or above `kv_full`, and the
    preemptions (where counted) grew over it. None otherwise."""
    answered = [r for r in reads if r[ERROR] is None]
    if not answered or answered[-1][KV] is None or answered[-1][KV] < kv_full:
        return None
    start = len(answered) - 1
    while start > 0 and answered[start - 1][KV] is not None \
            and answered[start - 1][KV] >= kv_full:
        start -= 1
    first, newest = answered[start], answered[-1]
    held = float(newest[T] - first[T])
    if held < window_s:
        return None
    if newest[PREEMPTIONS] is not None and not _rose(first, newest, PREEMPTIONS):
        return None
    return held


def _busy(read: list[Any]) -> bool | None:
    known = [v for v in (read[RUNNING], read[WAITING]) if v is not None]
    return None if not known else sum(known) > 0


def _flat_for(answered: list[list[Any]]) -> float:
    """Seconds since the first read of the busy stretch in which the counter holds the
    newest read's value."""
    newest = answered[-1]
    start = newest
    for read in reversed(answered[:-1]):
        if read[PROGRESS] != newest[PROGRESS] or not _busy(read):
            break
        start = read
    return float(newest[T] - start[T])


def _rose(before: list[Any] | None, after: list[Any], column: int) -> bool:
    return before is not None and before[column] is not None and after[column] is not None \
        and after[column] > before[column]


def _at_capacity(previous: list[Any] | None, newest: list[Any], kv_full: float) -> bool:
    if newest[KV] is None or newest[KV] < kv_full:
        return False
    return newest[PREEMPTIONS] is None or _rose(previous, newest, PREEMPTIONS)


def _load(read: list[Any]) -> str:
    parts = [f"{int(read[column])} {word}" for column, word in
             ((RUNNING, "running"), (WAITING, "waiting")) if read[column] is not None]
    return " and ".join(parts) if parts else "requests unknown"


def _made(previous: list[Any] | None, newest: list[Any], unit: str) -> str:
    if previous is None or previous[PROGRESS] is None or newest[PROGRESS] is None:
        return f"{unit} made"
    return f"{newest[PROGRESS] - previous[PROGRESS]:,.0f} {unit} made"
