"""NVML source: one sweep of every reading the rules use, run under a hard deadline.

A wedged GPU makes NVML block forever inside the kernel (D state). A ctypes call
cannot be interrupted from Python, and a thread stuck in the kernel keeps the whole
process from exiting, so the sweep runs in a forked child:

- the child imports pynvml (the parent never does, so the parent's own start-up,
  rule loading included, overlaps with the child's import and sweep),
- it streams one JSON line for the host and one per GPU through a pipe, so GPUs
  that answered are kept even when a later call hangs,
- before every call it writes the call's name into a shared anonymous mmap, which
  costs no syscall, so the parent can name the call that hung.

This module imports only light standard modules at the top (not json, which pulls in re:
~5 ms on an H200 host): it is imported before
the fork, on the critical path of `gpuguard check` (docs/benchmarks.md). The worker
writes readings in the snapshot's JSON form (a value, or {"state": ...}).

The parent waits until the deadline, then gives up on the child (SIGKILL, no wait:
a process in D state cannot be reaped until the kernel lets go of it).
"""

from __future__ import annotations

import os
import signal
import time

from gpuguard.io import forked
from gpuguard.sources.nvml_progress import Progress

# No `typing` or `pathlib` at run time: both cost milliseconds before the fork.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from gpuguard.model.snapshot import Snapshot




class NvmlSweep:
    """A sweep started in a forked worker (gpuguard/io/forked.py); `result()` collects it
    within the deadline."""

    def __init__(self, procfs: str, deadline_s: float, link_counters: bool = True,
                 keep: tuple[str, str, str] | None = None, sysfs: str | None = None) -> None:
        self.deadline_s = deadline_s
        self.started = time.monotonic()
        self._progress = Progress()
        # on exception the worker exits 1: the parent reports a worker without a result
        self.worker = forked.Worker(
            lambda out: _child_main(out, self._progress, procfs, link_counters, keep, sysfs))
        self.pid = self.worker.pid

    def result(self) -> Snapshot:
        messages, finished = self._drain()
        if finished and not any(m.get("t") in ("done", "init_error", "fatal") for m in messages):
            # The pipe closed without a result: the worker died, most likely of a signal
            # inside an NVML call (a driver bug). Name the call from the progress board.
            messages.append(died(self._progress.active(),
                                 self.worker.exit_code(self.started + self.deadline_s)))
        elif finished:
            # It closes its pipe before nvmlShutdown, so it may still be running: it exits
            # on its own, and init reaps it if we are gone first.
            self.worker.reap()
        elapsed = time.monotonic() - self.started
        done_at = next((m.get("at") for m in messages if m.get("t") == "done"), None)
        # when the worker's answer was ready, from its fork (None: no answer); `elapsed`
        # is when the parent collected it, which is later when the parent was the slower
        LAST_ANSWER["answered_s"] = done_at - self.started \
            if isinstance(done_at, float) else None
        snapshot = assemble(messages)
        snapshot.nvml.deadline_s = self.deadline_s
        snapshot.nvml.elapsed_s = round(elapsed, 4)
        if not finished:
            snapshot.nvml.hung_call = "; ".join(self._progress.active()) or "NVML worker start"
            self.worker.kill()
        fill_unanswered(snapshot)
        snapshot.record_nvml()
        return snapshot

    def abandon(self) -> None:
        """Stop waiting: the worker is killed (no worker is left behind)."""
        self.worker.kill()

    def _drain(self) -> tuple[list[dict[str, Any]], bool]:
        import json  # after the fork: json pulls in re, ~5 ms before it otherwise

        data = self.worker.read(self.started + self.deadline_s)
        messages = []
        for line in data.splitlines():
            try:
                messages.append(json.loads(line))
            except ValueError:
                continue  # a line cut by the deadline
        return messages, self.worker.finished


def died(calls: list[str], code: int | None) -> dict[str, Any]:
    """The sweep's result when its worker left without one: a "fatal" message naming how
    it ended (the signal, when one killed it) and the NVML calls it was in."""
    if code is None:
        how = "exited without a result"
    elif code < 0:
        try:
            how = f"died of {signal.Signals(-code).name}"
        except ValueError:
            how = f"died of signal {-code}"
    else:
        how = f"exited with code {code} without a result"
    where = f" in {'; '.join(calls)}" if calls else ""
    return {"t": "fatal", "kind": "WorkerDied", "error": f"the NVML worker {how}{where}"}


def deadline_for(timeout: float) -> float:
    """The NVML worker's share of `--timeout`: the rest is for judging and printing."""
    return max(0.1, timeout - min(1.0, timeout * 0.1))


_early: tuple[NvmlSweep, tuple[object, ...]] | None = None
# when the last collected sweep's worker had its answer ready, from its fork, for `check`'s
# GPUGUARD_TIMING line (cli/check.py)
LAST_ANSWER: dict[str, float | None] = {"answered_s": None}


def start_early(procfs: str, deadline_s: float,
                keep: tuple[str, str, str] | None = None, sysfs: str | None = None) -> None:
    """Fork `gpuguard check`'s worker before the CLI framework loads (gpuguard/cli/entry.py);
    without the NVLink error counters (check reports them never; they cost 2-3 ms a call,
    72 calls per NVLink GPU on an H200). `keep`: where the InfoROM's validity is kept
    (sources/nvml_inforom_kept.py), or None to validate every time. `sysfs`: where the
    worker reads the PCI bus to ask NVML by bus id for a GPU it does not list (nvml_bus.py)."""
    global _early
    _early = (NvmlSweep(procfs, deadline_s, link_counters=False, keep=keep, sysfs=sysfs),
              (procfs, deadline_s, keep, sysfs))


def keep_place(state_dir: str | None, kmsg: str, boot_id_file: str,
               ) -> tuple[str, str, str] | None:
    """Where `check` keeps the InfoROM's validity, in the form the early start and the
    collection compare (normalised: both spellings of one path are one place); None
    without a state dir (nothing is kept)."""
    if state_dir is None:
        return None
    return (os.path.normpath(state_dir), os.path.normpath(kmsg),
            os.path.normpath(boot_id_file))


def abandon_early() -> None:
    """Stop the early worker, if one runs (check stopped before it used it)."""
    global _early
    early, _early = _early, None
    if early is not None:
        early[0].abandon()


def start_sweep(procfs: str, deadline_s: float, link_counters: bool = True,
                keep: tuple[str, str, str] | None = None,
                sysfs: str | None = None) -> NvmlSweep:
    """The early worker if it was started with these settings, else a new one."""
    global _early
    early, _early = _early, None
    if early is not None:
        started, settings = early
        if settings == (procfs, deadline_s, keep, sysfs) and not link_counters:
            return started
        started.abandon()
    return NvmlSweep(procfs, deadline_s, link_counters, keep, sysfs)


def assemble(messages: list[dict[str, Any]]) -> Snapshot:
    import socket

    from gpuguard.model.snapshot import GpuSnapshot, HostInfo, NvmlStatus, Snapshot, from_json

    snapshot = Snapshot(
        host=HostInfo(hostname=socket.gethostname(), collected_at=time.time(), source="nvml"),
        nvml=NvmlStatus(),
    )
    for msg in messages:
        kind = msg.pop("t")
        # The worker writes the snapshot's own JSON form.
        if kind == "host":
            snapshot.host = from_json(HostInfo, {**msg, "hostname": snapshot.host.hostname,
                                                 "collected_at": snapshot.host.collected_at,
                                                 "source": "nvml"})
        elif kind == "gpu":
            snapshot.gpus.append(from_json(GpuSnapshot, msg))
        elif kind == "bus":  # NVML asked by bus id (sources/nvml_bus.py), after "host"
            snapshot.host.pci_handles = from_json(HostInfo, {
                "hostname": "", "collected_at": 0, **msg}).pci_handles
        elif kind == "init_error":
            snapshot.nvml.init_error = msg.get("error")
            snapshot.nvml.init_error_kind = msg.get("kind")
        elif kind == "fake":  # the tests' fake NVML (sources/nvml_fake.py)
            snapshot.nvml.fake_library = str(msg.get("library"))
            snapshot.nvml.fake_settings = str(msg.get("settings", ""))
        elif kind == "fatal":
            snapshot.nvml.sweep_error = f"{msg.get('kind', 'error')}: {msg.get('error')}"
    snapshot.gpus.sort(key=lambda g: g.index)  # worker threads finish in any order
    return snapshot


def fill_unanswered(snapshot: Snapshot, known: list[Any] | None = None) -> None:
    """GPUs that NVML counted (or that `known`, the last sweep's GPUs, had) but did not
    answer for, because a call hung or the sweep stopped, are listed with every reading an
    error naming why: their rules are unknown, never missing from the results."""
    from gpuguard.model.snapshot import GPU_READING_FIELDS, GpuSnapshot, Reading

    nvml = snapshot.nvml
    if nvml.hung_call is not None:
        why = f"NVML did not answer: {nvml.hung_call} passed its {nvml.deadline_s:g} s deadline"
    elif nvml.sweep_error is not None:
        why = f"the NVML sweep stopped early: {nvml.sweep_error}"
    else:
        return
    have = {gpu.index for gpu in snapshot.gpus}
    count = snapshot.host.gpu_count.get_or(None)
    wanted = {gpu.index: gpu for gpu in known or []}
    for index in range(count if isinstance(count, int) else 0):
        wanted.setdefault(index, None)
    for index in sorted(set(wanted) - have):
        like = wanted[index]
        gpu = GpuSnapshot(index=index)
        for name in GPU_READING_FIELDS:
            if like is not None and name in ("uuid", "pci_bus_id", "name", "serial") \
                    and getattr(like, name).is_ok:
                setattr(gpu, name, getattr(like, name))  # who it is; not how it is
            else:
                setattr(gpu, name, Reading.failed(why))
        snapshot.gpus.append(gpu)
    snapshot.gpus.sort(key=lambda g: g.index)


# --- the forked worker: runs only in the child -------------------------------------


def _child_main(out: Any, progress: Progress, procfs: str, link_counters: bool,
                keep: tuple[str, str, str] | None = None, sysfs: str | None = None) -> None:
    # First the InfoROM validation (70 ms on an H200), through ctypes in a process of its
    # own, so that it overlaps pynvml's import and the rest of the sweep (nvml_early.py).
    from gpuguard.sources.nvml_early import EarlyInforom, WithEarlyInforom

    early = EarlyInforom(progress, keep=keep)
    progress.set(0, "import pynvml")
    from gpuguard.sources.pynvml_import import import_pynvml

    pynvml = import_pynvml()  # without ctypes.util's 17 ms (pynvml_import.py)
    from gpuguard.sources import nvml_read

    emit = nvml_read.line_writer(out)
    progress.set(0, "nvmlInit")
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        emit({"t": "init_error", "kind": type(exc).__name__, "error": str(exc)})
        return
    try:
        nvml_read.sweep(WithEarlyInforom(pynvml, early), emit, progress, procfs,
                        link_counters, sysfs=sysfs)
        # its own clock (CLOCK_MONOTONIC is one clock for every process): when the answer
        # was ready, which the parent's collection time cannot show (GPUGUARD_TIMING)
        emit({"t": "done", "at": time.monotonic()})
    except Exception as exc:  # a result, never a crash of the parent
        emit({"t": "fatal", "kind": type(exc).__name__, "error": str(exc)})
    # Hand the result over before shutting NVML down: the parent stops waiting at EOF.
    out.close()
    import contextlib

    with contextlib.suppress(pynvml.NVMLError):
        pynvml.nvmlShutdown()
