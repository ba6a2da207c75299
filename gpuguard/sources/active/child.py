"""What an active-probe worker runs, in its forked child only: loads libcuda, runs the
phases on its GPU (init, device, context, alloc, compute, pattern, pcie, memory, peer,
release) and streams one JSON line per phase started, finished and measured."""

from __future__ import annotations

import contextlib
import json
import os
import time

from gpuguard.sources.active.plan import (
    CHECK_CHUNK,
    COMPUTE_BYTES,
    PATTERN_SLICES,
    PCIE_MAX_BYTES,
    REPEATS,
    ProbeOptions,
    ProbeWorker,
)
from gpuguard.sources.nvml_progress import Progress

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Iterator
    from typing import Any


def run_early(write_fd: int, go_fd: int, progress: Progress, slot: int, name: str,
                 lock_fd: int) -> None:
    from gpuguard.sources import cuda_api

    progress.set(slot, f"GPU at {name} phase init: cuInit (started before the NVML sweep)")
    began = time.perf_counter()
    # An error is not reported here: the run calls cuInit again, which returns it again.
    with contextlib.suppress(Exception):
        cuda_api.Driver(lambda call: None).call("cuInit", 0)
    init_ms = (time.perf_counter() - began) * 1e3
    with os.fdopen(go_fd, "rb") as go:
        line = go.readline(1 << 16)
    if not line:
        return  # told to stop: no context was created, nothing to release
    message = json.loads(line)
    worker = ProbeWorker(slot, int(message["index"]), name)
    peers = [(int(index), str(bus)) for index, bus in message["peers"]]
    out = os.fdopen(write_fd, "w", buffering=1)
    run(out, progress, worker, peers, ProbeOptions(**message["opts"]), lock_fd,
                carried_ms={"init": init_ms})


def run(out: Any, progress: Progress, worker: ProbeWorker, peers: list[tuple[int, str]],
                opts: ProbeOptions, lock_fd: int,
                carried_ms: dict[str, float] | None = None) -> None:
    state = {"phase": "start"}

    def emit(msg: dict[str, Any]) -> None:
        out.write(json.dumps({"gpu": worker.index, **msg}) + "\n")

    def before(call: str) -> None:
        progress.set(worker.slot, f"GPU {worker.index} phase {state['phase']}: {call}")

    @contextlib.contextmanager
    def phase(name: str) -> Iterator[None]:
        state["phase"] = name
        before("")
        emit({"t": "start", "phase": name})
        began = time.perf_counter()
        yield
        # an early worker's cuInit ran before it knew its GPU: counted in its init phase
        ms = (time.perf_counter() - began) * 1e3 + (carried_ms or {}).get(name, 0.0)
        emit({"t": "phase", "phase": name, "ms": round(ms, 2)})

    from gpuguard.sources import cuda_api

    before("dlopen libcuda.so.1")
    try:
        cu = cuda_api.Driver(before)
    except OSError as exc:
        emit({"t": "fatal", "error": f"libcuda.so.1 cannot be loaded: {exc}"})
        emit({"t": "end"})
        return
    run = _Run(cu, worker, peers, opts, lock_fd, emit, phase)
    try:
        run.all()
    except cuda_api.CudaError as exc:
        emit({"t": "cuda_error", "phase": state["phase"], "call": exc.call, "code": exc.code,
              "error": str(exc)})
    except Exception as exc:  # a result, never a crash of the parent
        emit({"t": "fatal", "error": f"{type(exc).__name__}: {exc} (phase {state['phase']})"})
    finally:
        with contextlib.suppress(Exception), phase("release"):
            run.release()
    emit({"t": "end"})
    out.close()


class _Run:
    """One GPU's phases (in its worker)."""

    def __init__(self, cu: Any, worker: ProbeWorker, peers: list[tuple[int, str]],
                 opts: ProbeOptions, lock_fd: int, emit: Callable[[dict[str, Any]], None],
                 phase: Callable[[str], Any]) -> None:
        import ctypes

        self.c = ctypes
        self.cu = cu
        self.worker = worker
        self.peers = peers
        self.opts = opts
        self.lock_fd = lock_fd
        self.emit = emit
        self.phase = phase
        self.dev = ctypes.c_int()
        self.ctx = ctypes.c_void_p()
        self.retained = False
        self.module = ctypes.c_void_p()
        self.device_a = ctypes.c_uint64()
        self.device_b = ctypes.c_uint64()
        self.host = ctypes.c_void_p()
        self.events: list[Any] = []
        self.size_a = max(opts.bandwidth_bytes, opts.pattern_bytes, COMPUTE_BYTES)
        self.pcie_bytes = min(opts.bandwidth_bytes, PCIE_MAX_BYTES)
        self.size_host = max(self.pcie_bytes, opts.pattern_bytes, COMPUTE_BYTES)

    def result(self, field_name: str, value: Any) -> None:
        self.emit({"t": "result", "field": field_name, "value": value})

    def all(self) -> None:
        c, cu = self.c, self.cu
        with self.phase("init"):
            cu.call("cuInit", c.c_uint(0))
        with self.phase("device"):
            cu.call("cuDeviceGetByPCIBusId", c.byref(self.dev),
                    self.worker.bus_id.encode())
        with self.phase("context"):
            cu.call("cuDevicePrimaryCtxRetain", c.byref(self.ctx), self.dev)
            self.retained = True
            cu.call("cuCtxSetCurrent", self.ctx)
        with self.phase("alloc"):
            cu.call("cuMemAlloc_v2", c.byref(self.device_a), c.c_size_t(self.size_a))
            cu.call("cuMemAlloc_v2", c.byref(self.device_b),
                    c.c_size_t(self.opts.bandwidth_bytes))
            cu.call("cuMemAllocHost_v2", c.byref(self.host), c.c_size_t(self.size_host))
            for _ in range(2):
                event = c.c_void_p()
                cu.call("cuEventCreate", c.byref(event), c.c_uint(0))
                self.events.append(event)
        with self.phase("compute"):
            self.result("probe_compute", self.compute())
        with self.phase("pattern"):
            self.result("probe_pattern", self.pattern())
        with self.phase("pcie"), self.turn():
            self.result("probe_pcie", self.pcie())
        with self.phase("memory"):
            self.result("probe_memory", self.memory())
        if self.peers:
            with self.phase("peer"), self.turn():
                for index, bus_id in self.peers:
                    self.emit({"t": "pair", "peer": index, **self.pair(bus_id)})

    def turn(self) -> contextlib.AbstractContextManager[None]:
        from gpuguard.sources.cuda_copies import link_turn

        return link_turn(self.lock_fd, self.opts.deadline_s / 4, self.cu.before)

    def fetch(self, size: int) -> bytes:
        c = self.c
        self.cu.call("cuMemcpyDtoH_v2", self.host, c.c_uint64(self.device_a.value),
                     c.c_size_t(size))
        return bytes(c.string_at(self.host.value, size))

    def compute(self) -> dict[str, Any]:
        from array import array

        from gpuguard.sources.cuda_api import FILL_PTX

        c, cu = self.c, self.cu
        words = COMPUTE_BYTES // 4
        seed = (os.getpid() * 2654435761 + time.time_ns()) & 0x3FFFFFFF
        # A sentinel first: a kernel that does not run leaves it, never an old pattern.
        cu.call("cuMemsetD32_v2", c.c_uint64(self.device_a.value), c.c_uint(0xDEADBEEF),
                c.c_size_t(words))
        function = c.c_void_p()
        cu.call("cuModuleLoadData", c.byref(self.module), FILL_PTX)
        cu.call("cuModuleGetFunction", c.byref(function), self.module, b"fill")
        pointer, count, offset = c.c_uint64(self.device_a.value), c.c_uint32(words), \
            c.c_uint32(seed)
        params = (c.c_void_p * 3)(*(c.cast(c.byref(v), c.c_void_p)
                                    for v in (pointer, count, offset)))
        cu.call("cuLaunchKernel", function, c.c_uint((words + 255) // 256), c.c_uint(1),
                c.c_uint(1), c.c_uint(256), c.c_uint(1), c.c_uint(1), c.c_uint(0), None,
                params, None)
        cu.call("cuCtxSynchronize")
        got = self.fetch(COMPUTE_BYTES)
        expected = array("I", range(seed, seed + words))
        mismatches = 0
        if got != expected.tobytes():
            read = array("I")
            read.frombytes(got)
            mismatches = sum(1 for a, b in zip(read, expected, strict=True) if a != b)
        return {"error": None, "mismatches": mismatches, "words": words}

    def pattern(self) -> dict[str, Any]:
        import struct

        c, cu = self.c, self.cu
        size = self.opts.pattern_bytes - self.opts.pattern_bytes % (4 * PATTERN_SLICES)
        slice_bytes = size // PATTERN_SLICES
        mismatches = 0
        for invert in (0, 0xFFFFFFFF):
            values = [(1 << k) ^ invert for k in range(PATTERN_SLICES)]
            for k, value in enumerate(values):
                cu.call("cuMemsetD32_v2", c.c_uint64(self.device_a.value + k * slice_bytes),
                        c.c_uint(value), c.c_size_t(slice_bytes // 4))
            cu.call("cuMemcpyDtoH_v2", self.host, c.c_uint64(self.device_a.value),
                    c.c_size_t(size))
            for k, value in enumerate(values):
                block = struct.pack("<I", value) * (min(slice_bytes, CHECK_CHUNK) // 4)
                for offset in range(0, slice_bytes, len(block)):
                    length = min(len(block), slice_bytes - offset)
                    got = c.string_at(int(self.host.value or 0) + k * slice_bytes + offset,
                                      length)
                    if got != block[:length]:
                        mismatches += _word_mismatches(got, block[:length])
        return {"error": None, "mismatches": mismatches, "bytes": size * 2}

    def pcie(self) -> dict[str, Any]:
        c, cu = self.c, self.cu
        size = self.pcie_bytes
        args = (c.c_uint64(self.device_a.value), self.host, c.c_size_t(size))
        best = {"h2d": 0.0, "d2h": 0.0}
        # The first copy of each direction warms the path (page tables, link power state).
        for _ in range(REPEATS + 1):
            for direction, call, order in (("h2d", "cuMemcpyHtoD_v2", (0, 1, 2)),
                                           ("d2h", "cuMemcpyDtoH_v2", (1, 0, 2))):
                began = time.perf_counter()
                cu.call(call, *(args[i] for i in order))
                best[direction] = max(best[direction], size / (time.perf_counter() - began))
        return {"h2d_gbps": round(best["h2d"] / 1e9, 2), "d2h_gbps": round(best["d2h"] / 1e9, 2),
                "bytes": size}

    def timed(self, call: str, *args: Any) -> float:
        from gpuguard.sources.cuda_copies import timed

        return timed(self.cu, self.c, (self.events[0], self.events[1]), call, *args)

    def memory(self) -> float:
        c = self.c
        size = self.opts.bandwidth_bytes
        seconds = self.timed("cuMemcpyDtoD_v2", c.c_uint64(self.device_b.value),
                             c.c_uint64(self.device_a.value), c.c_size_t(size))
        # Bytes read plus bytes written, as HBM bandwidth is quoted.
        return round(2 * size * REPEATS / seconds / 1e9, 1)

    def pair(self, bus_id: str) -> dict[str, Any]:
        from gpuguard.sources.cuda_copies import peer_copies

        return peer_copies(self.cu, self.c, self.dev, self.ctx,
                           (self.events[0], self.events[1]), int(self.device_a.value or 0),
                           self.opts.bandwidth_bytes, bus_id)

    def release(self) -> None:
        """Everything the run took, each step on its own: one failure frees the rest."""
        c, cu = self.c, self.cu
        steps: list[tuple[str, tuple[Any, ...]]] = [
            ("cuEventDestroy_v2", (e,)) for e in self.events]
        if self.module.value:
            steps.append(("cuModuleUnload", (self.module,)))
        for buf in (self.device_a, self.device_b):
            if buf.value:
                steps.append(("cuMemFree_v2", (c.c_uint64(buf.value),)))
        if self.host.value:
            steps.append(("cuMemFreeHost", (self.host,)))
        if self.retained:
            steps.append(("cuDevicePrimaryCtxRelease_v2", (self.dev,)))
        from gpuguard.sources.cuda_copies import give_back

        give_back(cu, steps)


def _word_mismatches(got: bytes, expected: bytes) -> int:
    from array import array

    read, want = array("I"), array("I")
    read.frombytes(got)
    want.frombytes(expected)
    return sum(1 for a, b in zip(read, want, strict=True) if a != b)
