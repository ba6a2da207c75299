"""The daemon's NVML source: a persistent worker process, each sweep under a deadline.

Forking a threaded daemon is unsafe, and starting Python and NVML every cycle costs
more CPU than the whole cycle budget, so one worker (gpuguard.sources.nvml_worker)
keeps NVML initialised and answers `sweep` requests. When a sweep passes its deadline
the call in flight is named from the shared progress file, the worker is killed and
left behind; while it has not exited (a process in D state cannot), no new worker is
started, so a wedged GPU costs one stuck process, not one per cycle. Once it is gone
the next cycle starts a fresh worker: the daemon recovers on its own.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from typing import Any

import structlog

from gpuguard.model.snapshot import Snapshot
from gpuguard.sources import nvml
from gpuguard.sources.nvml_progress import Progress

log = structlog.get_logger("gpuguard.nvml")


class _Worker:
    def __init__(self, progress_path: str, procfs: str,
                 on_xid: Callable[[dict[str, Any]], None], inforom_every_s: float,
                 sysfs: str | None = None) -> None:
        self.messages: queue.Queue[dict[str, Any]] = queue.Queue()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "gpuguard.sources.nvml_worker", progress_path, procfs,
             f"--inforom-every={inforom_every_s:g}",
             *([f"--sysfs={sysfs}"] if sysfs is not None else [])],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1,
            start_new_session=True,  # a ^C to the daemon is the daemon's to handle
        )
        self._on_xid = on_xid
        threading.Thread(target=self._read, name="nvml-worker-reader", daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            try:
                msg = json.loads(line)
            except ValueError:
                continue
            kind = msg.get("t")
            if kind == "xid_event":
                self._on_xid(msg)
            elif kind == "xid_events_unavailable":
                log.info("nvml_xid_events_unavailable", error=msg.get("error"))
            else:
                self.messages.put(msg)
        self.messages.put({"t": "eof"})

    def alive(self) -> bool:
        return self.proc.poll() is None

    def send(self, command: str) -> bool:
        """One command line to the worker (sources/nvml_worker.py); False when its pipe
        is gone (the worker exited)."""
        try:
            assert self.proc.stdin is not None
            self.proc.stdin.write(command + "\n")
            self.proc.stdin.flush()
        except OSError:  # BrokenPipeError among them
            return False
        return True

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)


class NvmlSampler:
    def __init__(self, procfs: str, on_xid: Callable[[dict[str, Any]], None],
                 inforom_every_s: float = 60.0, sysfs: str | None = None) -> None:
        self.procfs = procfs
        self.sysfs = sysfs  # the PCI bus, for the by-PCI lookups (sources/nvml_bus.py)
        self.inforom_every_s = inforom_every_s  # the slow interval (sources/nvml_inforom.py)
        self.on_xid = on_xid
        fd, self.progress_path = tempfile.mkstemp(prefix="gpuguard-nvml-progress-")
        os.close(fd)
        self._progress = Progress(self.progress_path)
        self._worker: _Worker | None = None
        self._stuck: _Worker | None = None
        self._stuck_call: str | None = None
        self._stuck_since: float | None = None

    def sweep(self, deadline_s: float) -> Snapshot:
        started = time.monotonic()
        if self._stuck is not None:
            if self._stuck.alive():
                return self._hung(deadline_s, started, still=True)
            log.info("nvml_worker_released", call=self._stuck_call)
            self._stuck = None
        if self._worker is None or not self._worker.alive():
            self._progress.buf[:] = bytes(len(self._progress.buf))
            self._worker = _Worker(self.progress_path, self.procfs, self.on_xid,
                                   self.inforom_every_s, self.sysfs)
        worker = self._worker
        if not worker.send("sweep"):
            self._worker = None
            snap = Snapshot()
            snap.nvml.sweep_error = "the NVML worker exited before the sweep"
            return snap

        messages: list[dict[str, Any]] = []
        end = started + deadline_s
        while True:
            remaining = end - time.monotonic()
            if remaining <= 0:
                self._stuck_call = "; ".join(self._progress.active()) or "NVML worker start"
                self._stuck_since = time.time()
                worker.kill()
                self._stuck, self._worker = worker, None
                log.error("nvml_call_hung", call=self._stuck_call, deadline_s=deadline_s)
                return self._hung(deadline_s, started, still=False, messages=messages)
            try:
                msg = worker.messages.get(timeout=remaining)
            except queue.Empty:
                continue
            if msg["t"] == "end":
                break
            if msg["t"] == "eof":
                # The worker died mid-sweep (a signal inside an NVML call, most likely):
                # a result naming the call; the next cycle starts a fresh worker.
                self._worker = None
                calls = self._progress.active()
                try:
                    code: int | None = worker.proc.wait(timeout=max(0.1, end - time.monotonic()))
                except subprocess.TimeoutExpired:
                    code = None
                messages.append(nvml.died(calls, code))
                log.error("nvml_worker_died", exit_code=code, calls=calls)
                break
            messages.append(msg)
        snap = nvml.assemble(messages)
        snap.nvml.deadline_s = deadline_s
        snap.nvml.elapsed_s = round(time.monotonic() - started, 4)
        snap.record_nvml()
        return snap

    def _hung(self, deadline_s: float, started: float, still: bool,
              messages: list[dict[str, Any]] | None = None) -> Snapshot:
        """What the sweep gave before the deadline (the GPUs that answered), marked hung."""
        snap = nvml.assemble(messages or [])
        call = self._stuck_call or "?"
        if still:
            call = f"{call} (still not returned since {time.ctime(self._stuck_since or 0)})"
        snap.nvml.hung_call = call
        snap.nvml.deadline_s = deadline_s
        snap.nvml.elapsed_s = round(time.monotonic() - started, 4)
        snap.record_nvml()
        return snap

    def forget(self) -> None:
        """Have the worker drop what it keeps between sweeps (P2P status, InfoROM
        validity: sources/nvml_worker.py), so that the next sweep reads them anew; no
        answer comes. A worker that is not running keeps nothing."""
        worker = self._worker
        if worker is None or not worker.alive():
            return
        if not worker.send("forget"):
            self._worker = None  # the next sweep starts a fresh one, keeping nothing

    def close(self) -> None:
        worker, self._worker = self._worker, None
        if worker is not None and worker.alive():
            try:
                if worker.send("quit"):
                    worker.proc.wait(timeout=2)
                else:
                    worker.kill()
            except subprocess.TimeoutExpired:
                worker.kill()
        if self._stuck is not None:
            self._stuck.kill()
        with contextlib.suppress(OSError):
            os.unlink(self.progress_path)
