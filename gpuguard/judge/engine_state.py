"""Stuck, saturated or at capacity: an inference engine judged from its own metrics
(issue 23), read once per fast cycle (gpuguard/daemon/service_engine.py). Pure functions
of the reads of the service's current run and the rule's limits; service.engine,
service.engine_full and service.inference call them.

A read is `[t, error, running, waiting, progress, kv_cache, preemptions]`: `t` on the
daemon's monotonic clock (a step of the wall clock moves no window), `error` None for a
read that answered, a value None where the page did not hold the signal.

- stuck: requests running or waiting throughout `stuck_after_s`, counted from the first
  read of that busy stretch, and the progress counter made less than the profile's floor
  over that window (Progress: per second, per running request or per engine): a counter
  that creeps is no progress. A counter that moves only when a request finishes
  (`on_finish`) is never stuck alone: unknown, a long answer cannot be told from a hang;
  a read that failed in between neither breaks nor extends the stretch;
- a counter that goes back while the run is the same (the daemon starts the reads over
  when the service's run identity changes) is unknown for `stuck_after_s`: two engines
  behind one URL, or a restart gpuguard did not see, are no one engine's progress;
- saturated: the probe's request timed out and the counter made at least the floor over
  the window (the part of it read so far);
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
class Progress:
    """How the engine's progress counter moves (its profile, rules/engines/*.yaml)."""

    floor_per_s: float = 0.05  # the least a busy engine that is not hung makes
    per_request: bool = True  # the floor is per running request (else per engine)
    on_finish: bool = False  # it moves only when a request finishes

    @classmethod
    def of(cls, entry: dict[str, Any]) -> Progress:
        """From the engine entry the daemon records (service_engine.record)."""
        given = entry.get("progress") or {}
        return cls(float(given.get("floor_per_s", cls.floor_per_s)),
                   given.get("per_request", True) is not False,
                   given.get("on_finish") is True)


@dataclass(frozen=True)
class State:
    state: str  # one of STATES
    message: str
    busy: bool = False
    flat_s: float | None = None  # how long busy with the counter flat
    rising: bool = False
    at_capacity: bool = False


@dataclass(frozen=True)
class Window:
    """What the counter made over the busy stretch's last stuck_after_s (or the part of
    it read so far): `covered` when the stretch spans the whole window."""

    made: float
    span_s: float
    need: float
    covered: bool

    @property
    def enough(self) -> bool:
        return self.made > 0 and self.made >= self.need


def judge(reads: list[list[Any]], limits: Limits, timed_out: bool, unit: str,
          answered: bool = False, progress: Progress | None = None) -> State:
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
    back = went_back(reads_ok, limits.stuck_after_s)
    if back is not None:
        return State("unknown", back, busy=busy)
    previous = reads_ok[-2] if len(reads_ok) > 1 else None
    facts = State("ok", "", busy, _flat_for(reads_ok) if busy else None,
                  _rose(previous, newest, PROGRESS),
                  _at_capacity(previous, newest, limits.kv_full))
    window = window_of(reads_ok, limits.stuck_after_s, progress or Progress()) \
        if busy else None
    state, message = _name(facts, window, newest, previous, limits, unit, timed_out,
                           answered, progress or Progress())
    return State(state, message, facts.busy, facts.flat_s, facts.rising, facts.at_capacity)


def _name(facts: State, window: Window | None, newest: list[Any],
          previous: list[Any] | None, limits: Limits, unit: str, timed_out: bool,
          answered: bool, progress: Progress) -> tuple[str, str]:
    """The state the facts make, worst first, and its message."""
    load = _load(newest)
    if window is not None and window.covered and not window.enough and not answered:
        return _slow(facts, window, load, limits, unit, progress)
    if window is not None and window.enough and timed_out:
        return "saturated", f"saturated: {load}, {_made(previous, newest, unit)} since the " \
            "last read"
    if facts.at_capacity:
        preempting = ", preemptions rising" if newest[PREEMPTIONS] is not None else ""
        return "capacity", (f"at capacity: KV cache {100 * newest[KV]:.0f} % used"
                            f"{preempting}, {load}")
    if not facts.busy and timed_out:
        return "unknown", ("idle by its metrics, but the probe's request got no answer in "
                           "time: its metrics are not the engine that serves")
    if not facts.busy:
        return "ok", "idle: no request running or waiting"
    if facts.rising:
        return "ok", f"{load}, {_made(previous, newest, unit)} since the last read"
    return "ok", (f"{load}, no {unit} made for {facts.flat_s or 0:.0f} s (stuck after "
                  f"{limits.stuck_after_s:g} s)")


def _slow(facts: State, window: Window, load: str, limits: Limits, unit: str,
          progress: Progress) -> tuple[str, str]:
    """Busy for the whole window with less than the floor made: stuck, or unknown where
    the counter moves only when a request finishes."""
    if window.made <= 0:
        what = f"no {unit} made for {facts.flat_s or window.span_s:.0f} s"
    else:
        per = "per running request" if progress.per_request else ""
        what = (f"only {window.made:,.0f} {unit} made in {window.span_s:.0f} s (under "
                f"{progress.floor_per_s:g}/s {per}".rstrip() + ")")
    if progress.on_finish:
        return "unknown", (f"{load} and {what}, but its counter moves only when a request "
                           "finishes: a long request cannot be told from a hang")
    return "stuck", f"stuck: {load} and {what} (stuck_after {limits.stuck_after_s:g} s)"


def went_back(answered: list[list[Any]], window_s: float) -> str | None:
    """Why the counter is no one engine's: it went back within the last `window_s`
    while the run is the same (the daemon starts the reads over for a new run)."""
    for i in range(len(answered) - 1, 0, -1):
        before, after, newest = answered[i - 1], answered[i], answered[-1]
        if newest[T] - after[T] >= window_s:
            break
        if before[PROGRESS] is not None and after[PROGRESS] is not None \
                and after[PROGRESS] < before[PROGRESS]:
            return (f"its progress counter went back from {before[PROGRESS]:,.0f} to "
                    f"{after[PROGRESS]:,.0f} {newest[T] - after[T]:.0f} s ago while the "
                    "service's run is the same: two engines behind one URL, or a restart "
                    "gpuguard did not see")
    return None


def window_of(answered: list[list[Any]], window_s: float, progress: Progress) -> Window:
    """What the counter made over the busy stretch's last `window_s` (the newest read
    busy, its counter known)."""
    newest = answered[-1]
    stretch = [newest]
    for read in reversed(answered[:-1]):
        if not _busy(read) or read[PROGRESS] is None:
            break
        stretch.append(read)
    stretch.reverse()  # oldest first
    # the newest read at least window_s old is where the window starts
    base = next((r for r in reversed(stretch) if newest[T] - r[T] >= window_s), stretch[0])
    inside = stretch[stretch.index(base):]
    span = float(newest[T] - base[T])
    running = min((r[RUNNING] for r in inside if r[RUNNING] is not None), default=1.0)
    need = progress.floor_per_s * span * (max(1.0, running) if progress.per_request else 1.0)
    return Window(float(newest[PROGRESS] - base[PROGRESS]), span, need, span >= window_s)


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
