"""`gpuguard qualify`'s NVML sampler (issue 29): a forked worker (a call hung in the kernel
cannot be interrupted), a thread per GPU in it, writes JSON lines {"t": "sample" | "ecc" |
"xid", "mono": time.monotonic(), "gpu": i, ...} (CLOCK_MONOTONIC is system-wide: they line
up with the CUDA workers' phases). The parent drains them on a thread (a full pipe would
stall the sampler) into bounded lists. summarise(): the reading's `load`; series(): a chart."""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import select
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from gpuguard.io import forked
from gpuguard.model import clock_events
from gpuguard.sources.nvml_progress import Progress

SLOW_EVERY_S = 1.0  # ECC totals and remapped rows: slower calls, slower counters
MAX_SAMPLES = 12000  # per GPU: 20 min at 100 ms, twice the longest level's deadline
MAX_XIDS = 1000  # a storm: the first are kept
GRACE_S, REAP_S = 1.0, 1.0  # the drain outlives the worker's deadline; the wait to reap it
REASONS = {"hw_slowdown": clock_events.HW_SLOWDOWN, "hw_thermal": clock_events.HW_THERMAL,
           "hw_power_brake": clock_events.HW_POWER_BRAKE,
           "sw_power_cap": clock_events.SW_POWER_CAP, "sw_thermal": clock_events.SW_THERMAL}


@dataclass(frozen=True, slots=True)
class Sample:
    mono: float
    power_w: float | None = None
    power_limit_w: float | None = None
    sm_mhz: int | None = None
    mem_mhz: int | None = None
    gpu_temp_c: int | None = None
    hbm_temp_c: int | None = None
    reasons: int | None = None  # the clock event reasons bitmask


@dataclass(frozen=True, slots=True)
class EccRead:
    mono: float
    corrected: int | None = None  # volatile totals: they reset when the driver loads
    uncorrected: int | None = None
    remap_pending: bool | None = None
    remap_failed: bool | None = None
    hbm_temp_limit_c: int | None = None  # the memory's max temperature threshold


@dataclass(frozen=True, slots=True)
class Xid:
    mono: float
    gpu: int | None  # None: a device we could not place
    code: int


@dataclass
class Samples:
    """What came. `error`: the worker failed (nvmlInit, died, hung); `gpu_errors`: why a GPU's
    sampling failed or stopped early. `decimated[gpu]`: each kept sample stands for this many."""

    interval_s: float
    started: float
    stopped: float = 0.0
    samples: dict[int, list[Sample]] = field(default_factory=dict)
    ecc: dict[int, list[EccRead]] = field(default_factory=dict)
    xids: list[Xid] = field(default_factory=list)
    error: str | None = None
    gpu_errors: dict[int, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    decimated: dict[int, int] = field(default_factory=dict)


class Sampler:
    """start(): fork the worker for the GPUs at these NVML indices; it samples every
    `interval_s` until stop() or `deadline_s` from now. A GPU with no sample for `stall_s`
    (default: the larger of 3 s and 20 intervals) at the end is reported hung."""

    def __init__(self, indices: list[int], interval_s: float = 0.1, *, deadline_s: float,
                 max_samples: int = MAX_SAMPLES, stall_s: float | None = None) -> None:
        self.indices = list(indices)
        self.max_samples = max(2, max_samples + max_samples % 2)  # even: groups align
        self.stall_s = stall_s if stall_s is not None else max(3.0, 20 * interval_s)
        self.got = Samples(interval_s=interval_s, started=time.monotonic())
        self.until = self.got.started + deadline_s
        self._board = Progress()  # slot 0: start-up calls; slot k+1: indices[k]'s thread
        self._seen: dict[int, int] = {}  # samples that came, per GPU
        self._eof_at: float | None = None
        self._stop = threading.Event()
        forked.prepare()  # the parent may be threaded: no dlopen in the child for prctl
        self._fd, write_fd = os.pipe()

        def child() -> None:
            os.close(self._fd)
            with os.fdopen(write_fd, "w", buffering=1) as out:
                _worker(out, self._board, self.indices, interval_s, self.until)

        self.pid = forked.fork(child)
        os.close(write_fd)
        self._thread = threading.Thread(target=self._drain, name="qualify-sampler", daemon=True)
        self._thread.start()

    def _drain(self) -> None:
        pending = b""
        while (left := self.until + GRACE_S - time.monotonic()) > 0 or self._stop.is_set():
            stopping = self._stop.is_set()  # then only what is already in the pipe
            if not select.select([self._fd], [], [], 0.0 if stopping else min(0.25, left))[0]:
                if stopping:
                    return
                continue
            data = os.read(self._fd, 1 << 16)
            if not data:
                self._eof_at = time.monotonic()
                return
            *lines, pending = (pending + data).split(b"\n")
            for line in lines:
                with contextlib.suppress(ValueError, TypeError, KeyError):
                    self._take(json.loads(line))  # a line cut by a kill is dropped

    def _take(self, msg: dict[str, Any]) -> None:
        kind, got = msg.get("t"), self.got
        if kind == "sample":
            gpu = int(msg["gpu"])
            seen = self._seen[gpu] = self._seen.get(gpu, 0) + 1
            stride = got.decimated.get(gpu, 1)
            sample = Sample(**{k: msg[k] for k in Sample.__slots__ if k in msg})
            got.decimated[gpu] = thin(got.samples.setdefault(gpu, []), sample, seen, stride,
                                      self.max_samples)
            if got.decimated[gpu] != stride:
                got.notes.append(f"GPU {gpu}: 1 sample kept in {got.decimated[gpu]}")
        elif kind == "ecc":
            reads = got.ecc.setdefault(int(msg["gpu"]), [])
            reads.append(EccRead(**{k: msg[k] for k in EccRead.__slots__ if k in msg}))
            if len(reads) > self.max_samples:  # keep the first, the last, every other one
                del reads[1:-1:2]
        elif kind == "xid" and len(got.xids) < MAX_XIDS:
            got.xids.append(Xid(float(msg["mono"]), msg.get("gpu"), int(msg["code"])))
        elif kind == "init_error":
            got.error = f"nvmlInit failed: {msg.get('error')}"
        elif kind == "gpu_error":
            got.gpu_errors[int(msg["gpu"])] = str(msg.get("error"))
        elif kind == "note":
            got.notes.append(str(msg.get("text")))

    def stop(self) -> Samples:
        """End the worker (SIGKILL), take what it wrote, say what failed. Returns within
        about REAP_S + 0.5 s whatever the worker is doing; a second call gives the same."""
        got = self.got
        if self._stop.is_set():
            return got
        got.stopped = time.monotonic()
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGKILL)
        self._stop.set()
        self._thread.join(timeout=0.5)  # its waits are at most 0.25 s
        if not self._thread.is_alive():
            os.close(self._fd)
        if (code := forked.exit_code(self.pid, time.monotonic() + REAP_S)) is None:
            got.notes.append(f"the NVML sampler (pid {self.pid}) did not exit when killed")
        self._judge(code)
        return got

    def _judge(self, code: int | None) -> None:
        """Samples.error and gpu_errors: nvmlInit failed, the worker died, or a GPU's
        sampling stopped before the end (named with the NVML call it is in)."""
        got, calls = self.got, self._board.active()
        end = min(got.stopped, self.until, self._eof_at or self.until)
        if got.error is None and end == self._eof_at and code not in (None, 0):
            where = f" in {'; '.join(calls)}" if calls else ""
            got.error = f"the NVML sampler {forked.describe_ending(code)}{where}"
        if got.error is not None:  # the whole worker failed: every GPU with it
            got.gpu_errors = {gpu: got.error for gpu in self.indices} | got.gpu_errors
            return
        for gpu in [gpu for gpu in self.indices if gpu not in got.gpu_errors]:
            if (why := _stalled(got.samples.get(gpu), gpu, got.started, end, self.stall_s,
                                calls)) is not None:
                got.gpu_errors[gpu] = why
                got.error = "; ".join(filter(None, [got.error, f"GPU {gpu}: {why}"]))


def _stalled(kept: list[Sample] | None, gpu: int, started: float, end: float, stall_s: float,
             calls: list[str]) -> str | None:
    """Why a GPU's last sample is more than `stall_s` before the end, naming its call."""
    last = kept[-1].mono if kept else started
    if end - last <= stall_s:
        return None
    mine = [c for c in calls if c.endswith(f"(GPU {gpu})")] or calls
    what = f"in {'; '.join(mine)}" if mine else "no call under way"
    return f"NVML did not answer: no sample{' came' * (not kept)} for {end - last:.1f} s ({what})"


start = Sampler  # sampler.start(indices, interval_s, deadline_s=...) -> Sampler


def thin(kept: list[Sample], sample: Sample, seen: int, stride: int, cap: int) -> int:
    """Add a GPU's `seen`-th sample to `kept` (each standing for `stride` in a row); returns
    the stride from now on. At `cap` (even) the list is halved, the stride doubled, keeping
    of each group the one the rules would judge (a judged reason, else the hotter)."""
    if stride > 1 and (seen - 1) % stride:  # not the first of its group: it competes
        kept[-1] = max(kept[-1], sample, key=_weight)
        return stride
    kept.append(sample)
    if len(kept) < cap:
        return stride
    kept[:] = [max(kept[i:i + 2], key=_weight) for i in range(0, len(kept), 2)]
    return stride * 2


def _weight(sample: Sample) -> tuple[bool, int, int]:
    judged = (sample.reasons or 0) & (clock_events.HW_ANY | clock_events.SW_THERMAL)
    return bool(judged), sample.hbm_temp_c or -1, sample.gpu_temp_c or -1


def _worker(out: Any, board: Progress, indices: list[int], interval_s: float,
            until: float) -> None:
    """The forked child: NVML, a handle per GPU, a sampling thread each, the Xid events."""
    board.set(0, "import pynvml")
    import pynvml as nv

    from gpuguard.sources import nvml_read

    emit = nvml_read.line_writer(out)
    board.set(0, "nvmlInit")
    try:
        nv.nvmlInit()
    except nv.NVMLError as exc:
        emit({"t": "init_error", "error": f"{type(exc).__name__}: {exc}"})
        return
    handles: dict[int, Any] = {}
    for gpu in indices:
        board.set(0, f"nvmlDeviceGetHandleByIndex (GPU {gpu})")
        try:
            handles[gpu] = nv.nvmlDeviceGetHandleByIndex(gpu)
        except nv.NVMLError as exc:
            emit({"t": "gpu_error", "gpu": gpu, "error": f"nvmlDeviceGetHandleByIndex: {exc}"})
    board.set(0, "")
    threads = [threading.Thread(target=_xid_events, args=(nv, handles, emit), daemon=True)]
    threads += [threading.Thread(target=_sample_gpu, daemon=True, args=(
        nv, handles[gpu], gpu, emit, board, slot, interval_s, until))
        for slot, gpu in enumerate(indices, start=1) if gpu in handles]
    for thread in threads:
        thread.start()
    for thread in threads[1:]:  # one hung in a call is left behind: the process exits anyway
        thread.join(timeout=max(0.0, until - time.monotonic()) + 0.1)


def _sample_gpu(nv: Any, h: Any, gpu: int, emit: Callable[[dict[str, Any]], None],
                board: Progress, slot: int, interval_s: float, until: float) -> None:
    """Sample on a fixed monotonic grid (a late tick is skipped, never shifts the rest)."""
    from gpuguard.sources import nvml_multi, nvml_read

    where = f" (GPU {gpu})"

    def read(fn: Any, *args: Any, then: Callable[[Any], Any] = int, call: str = "") -> Any:
        try:
            board.set(slot, (call or fn.__name__) + where)
            return then(fn(*args))
        except Exception:  # any failure of a call is that value unknown, never the worker's
            return None

    reasons = getattr(nv, nvml_read.clock_event_reasons_call(nv), None)
    mem_max = nvml_multi.constant(nv, "NVML_TEMPERATURE_THRESHOLD_MEM_MAX", 2)
    began = next_slow = time.monotonic()
    while (now := time.monotonic()) < until:
        emit({"t": "sample", "mono": round(now, 6), "gpu": gpu,
              "power_w": read(nv.nvmlDeviceGetPowerUsage, h, then=lambda mw: mw / 1000),
              "power_limit_w": read(nv.nvmlDeviceGetEnforcedPowerLimit, h,
                                    then=lambda mw: mw / 1000),
              "sm_mhz": read(nv.nvmlDeviceGetClockInfo, h, nv.NVML_CLOCK_SM),
              "mem_mhz": read(nv.nvmlDeviceGetClockInfo, h, nv.NVML_CLOCK_MEM),
              "gpu_temp_c": read(nv.nvmlDeviceGetTemperature, h, nv.NVML_TEMPERATURE_GPU),
              "hbm_temp_c": read(nvml_multi.field_value, nv, h, "NVML_FI_DEV_MEMORY_TEMP",
                                 call="nvmlDeviceGetFieldValues (NVML_FI_DEV_MEMORY_TEMP)"),
              "reasons": read(reasons, h)})
        if now >= next_slow:
            total = nv.nvmlDeviceGetTotalEccErrors
            rows = read(nv.nvmlDeviceGetRemappedRows, h, then=list)
            emit({"t": "ecc", "mono": round(now, 6), "gpu": gpu,
                  "corrected": read(total, h, nv.NVML_MEMORY_ERROR_TYPE_CORRECTED,
                                    nv.NVML_VOLATILE_ECC),
                  "uncorrected": read(total, h, nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
                                      nv.NVML_VOLATILE_ECC),
                  "remap_pending": None if rows is None else bool(rows[2]),
                  "remap_failed": None if rows is None else bool(rows[3]),
                  "hbm_temp_limit_c": read(nv.nvmlDeviceGetTemperatureThreshold, h, mem_max)})
            next_slow = began + (int((now - began) / SLOW_EVERY_S) + 1) * SLOW_EVERY_S
        board.set(slot, "")  # between ticks: a slot that holds a call is a call under way
        tick = int((time.monotonic() - began) / interval_s) + 1
        time.sleep(max(0.0, min(began + tick * interval_s, until) - time.monotonic()))


def _xid_events(nv: Any, handles: dict[int, Any], emit: Callable[[dict[str, Any]], None]) -> None:
    """NVML's Xid events of our GPUs (nvmlEventSetWait), placed by their device handle."""
    from ctypes import c_void_p, cast

    try:
        event_set = nv.nvmlEventSetCreate()
        for handle in handles.values():
            with contextlib.suppress(nv.NVMLError):
                nv.nvmlDeviceRegisterEvents(handle, nv.nvmlEventTypeXidCriticalError, event_set)
        by_address = {cast(h, c_void_p).value: gpu for gpu, h in handles.items()}
        while True:
            with contextlib.suppress(nv.NVMLError_Timeout):
                data = nv.nvmlEventSetWait(event_set, 1000)
                emit({"t": "xid", "mono": round(time.monotonic(), 6), "code": int(data.eventData),
                      "gpu": by_address.get(cast(data.device, c_void_p).value)})
    except (nv.NVMLError, AttributeError) as exc:
        emit({"t": "note", "text": f"no NVML Xid events: {type(exc).__name__}: {exc}"})


def summarise(samples: Samples, gpu: int, window: tuple[float, float], ramp_s: float = 2.0,
              run: tuple[float, float] | None = None) -> dict[str, Any]:
    """The spec's `load` section for one GPU. Power and clocks: the samples of `window`
    (monotonic seconds) after its first `ramp_s`; reasons and temperatures: all of the
    window; ECC, remaps and Xids: all of `run` (default: all sampled; an error in the memory
    test counts too). A value never read is None (reasons too: never counts of zero)."""
    inside = _between(samples.samples.get(gpu, []), *window)
    steady = _between(inside, window[0] + ramp_s, window[1])
    span = run or (samples.started, samples.stopped)
    reasons, limits = _got(inside, "reasons"), _got(samples.ecc.get(gpu, []), "hbm_temp_limit_c")
    gap = _median([b.mono - a.mono for a, b in itertools.pairwise(inside)])
    return {
        "samples": len(inside), "interval_ms": None if gap is None else round(gap * 1000, 1),
        **_power(steady),
        "sm_clock_mhz": _spread(_got(steady, "sm_mhz")),
        "mem_clock_mhz": _spread(_got(steady, "mem_mhz")),
        "gpu_temp_c_max": max(_got(inside, "gpu_temp_c"), default=None),
        "hbm_temp_c_max": max(_got(inside, "hbm_temp_c"), default=None),
        "hbm_temp_limit_c": limits[-1] if limits else None,
        "reasons": {name: sum(1 for bits in reasons if bits & bit)
                    for name, bit in REASONS.items()} if reasons else None,
        "ecc": _ecc(_between(samples.ecc.get(gpu, []), *span)),
        # NVML's events carry the code only: no log line to grade by
        "xids": [{"code": x.code, "text": ""} for x in _between(samples.xids, *span)
                 if x.gpu == gpu],
        "hours": round(max(0.0, span[1] - span[0]) / 3600, 6),
    }


SERIES = ("power_w", "sm_mhz", "mem_mhz", "gpu_temp_c", "hbm_temp_c")


def series(samples: Samples, gpu: int, origin: float | None = None
           ) -> dict[str, list[tuple[float, float | None]]]:
    """The chart's lines for one GPU, named as Sample's fields (SERIES): (seconds since
    `origin`, default the GPU's first sample; the value, None where it was not read)."""
    kept = samples.samples.get(gpu, [])
    zero = origin if origin is not None else (kept[0].mono if kept else 0.0)
    return {name: [(round(s.mono - zero, 3), getattr(s, name)) for s in kept] for name in SERIES}


def _between(items: list[Any], lo: float, hi: float) -> list[Any]:
    return [item for item in items if lo <= item.mono <= hi]


def _got(items: list[Sample] | list[EccRead], attr: str) -> list[Any]:
    return [value for item in items if (value := getattr(item, attr)) is not None]


def _power(steady: list[Sample]) -> dict[str, float | None]:
    power = _got(steady, "power_w")
    median, limit = _median(power), _median(_got(steady, "power_limit_w"))
    return {"power_w_median": None if median is None else round(median, 2),
            "power_w_max": max(power, default=None), "power_limit_w": limit,
            "power_share": round(median / limit, 4) if median is not None and limit else None}


def _median(values: list[float]) -> float | None:
    ordered, n = sorted(values), len(values)
    if n == 0:
        return None
    return float(ordered[n // 2]) if n % 2 else (ordered[n // 2 - 1] + ordered[n // 2]) / 2


def _spread(values: list[int]) -> dict[str, int] | None:
    median = _median([float(v) for v in values])
    return None if median is None else {"min": min(values), "median": round(median),
                                        "max": max(values)}


def _ecc(reads: list[EccRead]) -> dict[str, Any]:
    """New errors: last - first read; a drop is a reset of the volatile counter (a driver
    reload), after which all it counts is new. Remaps: the first read and the last."""
    out: dict[str, Any] = {}
    for key, attr in (("uncorrectable_new", "uncorrected"), ("correctable_new", "corrected")):
        counts = _got(reads, attr)
        out[key] = None if not counts else (
            counts[-1] - counts[0] if counts[-1] >= counts[0] else counts[-1])
    for name in ("remap_pending", "remap_failed"):
        flags = _got(reads, name)
        out[name], out[f"{name}_before"] = (flags[-1], flags[0]) if flags else (None, None)
    return out
