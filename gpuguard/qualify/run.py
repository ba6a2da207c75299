"""One qualify run on this host's GPUs: which GPUs it may take, the host-wide probe lock,
one forked CUDA worker per GPU and the NVML sampler beside them, every worker gone by
the deadline or within a second of a stop, and each GPU's `qualify` reading.

The parent never loads libcuda or NVML (both are in forked workers, as the active probe's
and the NVML sweep's): a driver call that hangs costs a worker, never the run."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import tempfile
import threading
import time
from dataclasses import dataclass, field

from gpuguard.config.gpu_targets import targets_for
from gpuguard.io import forked
from gpuguard.sources.active.host_lock import HostLock
from gpuguard.sources.nvml_progress import Progress
from gpuguard.sources.qualify import assemble, child, sampler
from gpuguard.sources.qualify import plan as levels

TYPE_CHECKING = False
if TYPE_CHECKING:
    from pathlib import Path
    from typing import Any

    from gpuguard.model.snapshot import GpuSnapshot, Snapshot

# How long a run waits for another probe or qualify run to give the GPUs back.
LOCK_WAIT_S = 15.0
# A stopped run: the workers are killed at once (a launch in flight ends within a slice
# and the driver frees the context when the process is gone), then reaped within this.
REAP_S = 3.0
SAMPLE_INTERVAL_S = 0.1


@dataclass
class Request:
    level: str = "standard"
    gpus: tuple[int, ...] = ()
    burn_s: float | None = None
    flip_sm: int | None = None
    seed: int | None = None
    lock_path: str | None = None
    lock_wait_s: float = LOCK_WAIT_S
    deadline_s: float | None = None
    targets_dir: Path | None = None


@dataclass
class Outcome:
    """Each GPU's reading, the sampled series (for the chart and the bundle), the run's
    times (wall for display, monotonic for its length), and whether it was stopped."""

    readings: dict[int, dict[str, Any]] = field(default_factory=dict)
    series: dict[int, dict[str, list[tuple[float, float | None]]]] = field(
        default_factory=dict)
    # each GPU's load window, seconds since the series' origin (the chart's bands)
    windows: dict[int, tuple[float, float]] = field(default_factory=dict)
    sampler_error: str | None = None
    started_at: float = 0.0
    seconds: float = 0.0
    stopped: bool = False
    # a stopped run: seconds from seeing the stop to every worker gone (the GPU free)
    freed_after_s: float | None = None
    options: dict[str, Any] = field(default_factory=dict)


def run(snapshot: Snapshot, request: Request, stop: threading.Event) -> Outcome:
    """Qualify the requested GPUs (all when none named) and fill their readings."""
    seed = request.seed if request.seed is not None else int.from_bytes(os.urandom(4), "big")
    opts = levels.options(request.level, seed, request.burn_s, request.flip_sm)
    if request.deadline_s is not None:
        opts.deadline_s = request.deadline_s
    outcome = Outcome(started_at=time.time(), options={
        "level": opts.level, "burn_s": opts.burn_s, "seed": seed,
        "deadline_s": opts.deadline_s, "flip_sm": opts.flip_sm})
    began = time.monotonic()
    eligible = _eligible(snapshot, request, opts.level, outcome)
    lock = HostLock(request.lock_path) if request.lock_path and eligible else None
    wait_s = min(request.lock_wait_s, opts.deadline_s / 4)
    if lock is not None and lock.acquire(began + wait_s) is False:
        for gpu in eligible:
            outcome.readings[gpu.index] = assemble.refused(
                opts.level, f"another active probe or qualify run holds the GPUs: waited "
                f"{wait_s:g} s for {request.lock_path}")
        eligible = []
    try:
        if eligible:
            _run_workers(eligible, opts, stop, outcome, request.targets_dir)
    finally:
        if lock is not None:
            lock.release()
    outcome.seconds = round(time.monotonic() - began, 3)
    from gpuguard.model.snapshot import Reading

    for gpu in snapshot.gpus:
        if gpu.index in outcome.readings:
            gpu.qualify = Reading.ok(outcome.readings[gpu.index])
    return outcome


def _eligible(snapshot: Snapshot, request: Request, level: str,
              outcome: Outcome) -> list[GpuSnapshot]:
    """The GPUs asked for that may be taken; the others refused, saying why."""
    eligible = []
    for gpu in snapshot.gpus:
        if request.gpus and gpu.index not in request.gpus:
            continue
        why = levels.refusal(gpu)
        if why is None:
            eligible.append(gpu)
        else:
            outcome.readings[gpu.index] = assemble.refused(level, why)
    return eligible


def _run_workers(gpus: list[GpuSnapshot], opts: levels.QualifyOptions,
                 stop: threading.Event, outcome: Outcome, targets_dir: Path | None) -> None:
    began = time.monotonic()
    deadline = began + opts.deadline_s
    samples = sampler.Sampler([g.index for g in gpus], SAMPLE_INTERVAL_S,
                              deadline_s=opts.deadline_s + 5)
    progress = Progress()
    read_fd, write_fd = os.pipe()
    pids: dict[int, int] = {}
    with tempfile.TemporaryFile() as turn:
        for slot, gpu in enumerate(gpus):
            peers = [(o.index, str(o.pci_bus_id.get())) for o in gpus if o.index > gpu.index]

            def body(gpu: GpuSnapshot = gpu, slot: int = slot,
                     peers: list[tuple[int, str]] = peers) -> None:
                os.close(read_fd)
                with os.fdopen(write_fd, "w", buffering=1) as out:
                    child.run(out, gpu.index, str(gpu.pci_bus_id.get()), peers, opts,
                              turn.fileno(), lambda text: progress.set(slot, text))

            pids[gpu.index] = forked.fork(body)
        os.close(write_fd)
        # the stop is asked every 0.1 s: it must free the GPUs within a second
        data, finished = forked.read_until(read_fd, deadline, stop.is_set)
    seen_stop = time.monotonic()
    for pid in pids.values():
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    until = time.monotonic() + REAP_S
    endings = {index: forked.describe_ending(forked.exit_code(pid, until))
               for index, pid in pids.items()}
    if stop.is_set():
        outcome.freed_after_s = round(time.monotonic() - seen_stop, 3)
    taken = samples.stop()
    outcome.sampler_error = taken.error
    outcome.stopped = stop.is_set()
    runs = assemble.gather(_messages(data))
    for slot, gpu in enumerate(gpus):
        outcome.readings[gpu.index] = _reading(gpu, slot, runs.get(gpu.index), opts, taken,
                                               progress, outcome, finished, endings,
                                               targets_dir)
        outcome.series[gpu.index] = sampler.series(taken, gpu.index, origin=began)
        one = runs.get(gpu.index)
        if one is not None and one.load[0] is not None and one.load[1] is not None:
            outcome.windows[gpu.index] = (one.load[0] - began, one.load[1] - began)


def _reading(gpu: GpuSnapshot, slot: int, one: assemble.GpuRun | None,
             opts: levels.QualifyOptions, taken: sampler.Samples, progress: Progress,
             outcome: Outcome, finished: bool, endings: dict[int, str | None],
             targets_dir: Path | None) -> dict[str, Any]:
    one = one or assemble.GpuRun()
    ending = None
    if not one.ended:
        where = _where(progress, slot)
        if outcome.stopped:
            ending = assemble.unfinished(one, "stopped (SIGTERM/SIGINT) before the end",
                                         "stopped", where)
        elif not finished:
            ending = assemble.unfinished(
                one, f"did not finish within the {opts.deadline_s:g} s deadline", "hung",
                where)
        else:
            ending = assemble.unfinished(
                one, f"the worker {endings.get(gpu.index) or 'left without a result'}",
                "died", where)
    start, end = one.load
    load = None
    if start is not None and end is not None:
        # ECC, remaps and Xids over the whole run (an error in the memory test counts),
        # power and clocks over the load less its ramp
        # a load shortened by --seconds keeps two thirds of itself past the ramp
        ramp_s = min(levels.LEVEL_TABLE[opts.level].ramp_s, opts.burn_s / 3)
        load = sampler.summarise(taken, gpu.index, (start, end), ramp_s=ramp_s)
    found = targets_for(gpu.name.get_or(None), targets_dir)
    reading = assemble.reading(one, opts.level, opts.flip_sm,
                               found.to_reading() if found else None, load, ending)
    return reading


def _where(progress: Progress, slot: int) -> str:
    raw = bytes(progress.buf[slot * 128:(slot + 1) * 128]).split(b"\0", 1)[0]
    return raw.decode(errors="replace")


def _messages(data: bytes) -> list[dict[str, Any]]:
    """The workers' JSON lines, each parsed once; a line cut by a kill is left out."""
    out = []
    for line in data.splitlines():
        try:
            msg = json.loads(line)
        except ValueError:
            continue
        if isinstance(msg, dict):
            out.append(msg)
    return out
