"""What a qualify worker runs on its GPU, in its forked child only: the copies, the burn
(qgemm, every result verified, a mismatch located to its SM), the memory test. One JSON
line per phase started and finished (with CLOCK_MONOTONIC times, which the parent lines
up with the NVML sampler's) and per result."""

from __future__ import annotations

import contextlib
import json
import random
import time

from gpuguard.sources.qualify import kernels as k
from gpuguard.sources.qualify.plan import MEMTEST_CHUNK, QualifyOptions

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Iterator
    from typing import Any

SM_COUNT_ATTRIBUTE = 16      # CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT
MAX_EXAMPLES = 8
MT_OUT_BYTES = 8 + 24 * k.MT_KEEP


def run(out: Any, index: int, bus_id: str, peers: list[tuple[int, str]],
        opts: QualifyOptions, lock_fd: int,
        say: Callable[[str], None] = lambda call: None) -> None:
    """The whole run; every failure becomes a line, never an exception."""
    state = {"phase": "start"}

    def emit(msg: dict[str, Any]) -> None:
        out.write(json.dumps({"gpu": index, **msg}) + "\n")
        out.flush()

    @contextlib.contextmanager
    def phase(name: str) -> Iterator[None]:
        state["phase"] = name
        began = time.monotonic()
        emit({"t": "start", "phase": name, "mono": began})
        yield
        emit({"t": "phase", "phase": name, "mono": time.monotonic(),
              "ms": round((time.monotonic() - began) * 1e3, 2)})

    from gpuguard.sources import cuda_api

    def before(call: str) -> None:
        say(f"GPU {index} phase {state['phase']}: {call}")

    try:
        cu = cuda_api.Driver(before)
    except OSError as exc:
        emit({"t": "fatal", "error": f"libcuda.so.1 cannot be loaded: {exc}"})
        emit({"t": "end"})
        return
    work = Worker(cu, bus_id, peers, opts, lock_fd, emit, phase)
    try:
        work.all()
    except cuda_api.CudaError as exc:
        emit({"t": "cuda_error", "phase": state["phase"], "call": exc.call, "code": exc.code,
              "error": str(exc)})
    except Exception as exc:  # a result, never a crash of the parent
        emit({"t": "fatal", "error": f"{type(exc).__name__}: {exc} (phase {state['phase']})"})
    finally:
        with contextlib.suppress(Exception), phase("release"):
            work.release()
    emit({"t": "end"})


class Worker:
    """One GPU's run (in its worker process)."""

    def __init__(self, cu: Any, bus_id: str, peers: list[tuple[int, str]],
                 opts: QualifyOptions, lock_fd: int, emit: Callable[[dict[str, Any]], None],
                 phase: Callable[[str], Any]) -> None:
        import ctypes

        self.c = ctypes
        self.cu = cu
        self.bus_id = bus_id
        self.peers = peers
        self.opts = opts
        self.lock_fd = lock_fd
        self.emit = emit
        self.phase = phase
        self.dev = ctypes.c_int()
        self.ctx = ctypes.c_void_p()
        self.retained = False
        self.module = ctypes.c_void_p()
        self.functions: dict[str, Any] = {}
        self.device: list[ctypes.c_uint64] = []   # every device allocation, freed at the end
        self.host: list[ctypes.c_void_p] = []
        self.events: list[Any] = []
        self.sms = 0

    # -- CUDA plumbing -------------------------------------------------------------------

    def alloc(self, size: int, allow_oom: bool = False) -> int:
        ptr = self.c.c_uint64()
        code = self.cu.call("cuMemAlloc_v2", self.c.byref(ptr), self.c.c_size_t(size),
                            allow=(2,) if allow_oom else ())
        if code:
            return 0
        self.device.append(ptr)
        return int(ptr.value)

    def free(self, ptr: int) -> None:
        for held in self.device:
            if held.value == ptr:
                self.cu.call("cuMemFree_v2", self.c.c_uint64(ptr))
                self.device.remove(held)
                return

    def pinned(self, size: int) -> int:
        ptr = self.c.c_void_p()
        self.cu.call("cuMemAllocHost_v2", self.c.byref(ptr), self.c.c_size_t(size))
        self.host.append(ptr)
        return int(ptr.value or 0)

    def event(self) -> Any:
        event = self.c.c_void_p()
        self.cu.call("cuEventCreate", self.c.byref(event), self.c.c_uint(0))
        self.events.append(event)
        return event

    def launch(self, name: str, blocks: int, threads: int, *args: Any) -> None:
        c = self.c
        params = (c.c_void_p * len(args))(*(c.cast(c.byref(a), c.c_void_p) for a in args))
        self.cu.call("cuLaunchKernel", self.functions[name], c.c_uint(blocks), c.c_uint(1),
                     c.c_uint(1), c.c_uint(threads), c.c_uint(1), c.c_uint(1), c.c_uint(0),
                     None, params, None)

    def to_host(self, host: int, device: int, size: int, sync: bool = True) -> None:
        c = self.c
        if sync:
            self.cu.call("cuMemcpyDtoH_v2", c.c_void_p(host), c.c_uint64(device),
                         c.c_size_t(size))
        else:
            self.cu.call("cuMemcpyDtoHAsync_v2", c.c_void_p(host), c.c_uint64(device),
                         c.c_size_t(size), None)

    def to_device(self, device: int, data: bytes) -> None:
        self.cu.call("cuMemcpyHtoD_v2", self.c.c_uint64(device), data,
                     self.c.c_size_t(len(data)))

    def read(self, host: int, size: int) -> bytes:
        return bytes(self.c.string_at(host, size))

    # -- the run -------------------------------------------------------------------------

    def all(self) -> None:
        c, cu = self.c, self.cu
        with self.phase("init"):
            cu.call("cuInit", c.c_uint(0))
        with self.phase("context"):
            cu.call("cuDeviceGetByPCIBusId", c.byref(self.dev), self.bus_id.encode())
            cu.call("cuDevicePrimaryCtxRetain", c.byref(self.ctx), self.dev)
            self.retained = True
            cu.call("cuCtxSetCurrent", self.ctx)
            count = c.c_int()
            cu.call("cuDeviceGetAttribute", c.byref(count), c.c_int(SM_COUNT_ATTRIBUTE),
                    self.dev)
            self.sms = max(1, count.value)
        with self.phase("compile"):
            cu.call("cuModuleLoadData", c.byref(self.module), k.PTX)
            for name in ("qgemm", "mt_fill", "mt_check"):
                function = c.c_void_p()
                cu.call("cuModuleGetFunction", c.byref(function), self.module, name.encode())
                self.functions[name] = function
        # The copies first, on a cold GPU in a fresh context: measured after the burn and
        # the memory test, the H200's pinned host-to-device copy read 28 GB/s where a
        # fresh process reads 55 both ways (bench/h2d_variants.py, docs/qualify.md).
        with self.phase("bandwidth"):
            self.emit({"t": "result", "section": "bandwidth", "value": self.bandwidth()})
        if self.peers:
            with self.phase("peer"), self.turn():
                self.emit({"t": "result", "section": "peers",
                           "value": [self.pair(i, bus) for i, bus in self.peers]})
        from gpuguard.sources.qualify.burn import Burn

        burn = Burn(self)
        with self.phase("burn"):
            self.emit({"t": "result", "section": "compute", "value": burn.run()})
        if burn.suspect is not None:
            with self.phase("locate"):
                self.emit({"t": "result", "section": "located", "value": burn.locate()})
        burn.close()
        with self.phase("memtest"):
            self.emit({"t": "result", "section": "memtest", "value": self.memtest()})

    def memtest(self) -> dict[str, Any]:
        """Most of the free memory, in chunks, each pattern written then checked on the
        GPU; the free memory as the driver reports it first (bytes tested / free)."""
        c, cu = self.c, self.cu
        free, total = c.c_size_t(), c.c_size_t()
        cu.call("cuMemGetInfo_v2", c.byref(free), c.byref(total))
        budget = int(free.value * self.opts.memtest_fraction)
        if self.opts.memtest_bytes is not None:
            budget = min(budget, self.opts.memtest_bytes)
        out = (self.alloc(MT_OUT_BYTES), self.pinned(MT_OUT_BYTES))
        chunks = self.chunks(budget)
        tested = sum(size for _, size in chunks)
        began, mismatches = time.monotonic(), 0
        first: list[dict[str, str]] = []
        for kind, seed in self.opts.patterns:
            wrong, found = self.memtest_pass(chunks, kind, seed, out)
            mismatches += wrong
            first += found[:MAX_EXAMPLES - len(first)]
        seconds = time.monotonic() - began
        for ptr, _ in chunks:
            self.free(ptr)
        moved = 2 * tested * len(self.opts.patterns)
        return {"bytes_tested": tested, "free_bytes": int(free.value),
                "patterns": sorted({"address" if kind == k.PATTERN_ADDRESS else "random"
                                    for kind, _ in self.opts.patterns}),
                "passes": len(self.opts.patterns), "mismatches": mismatches,
                "seconds": round(seconds, 3),
                "gbps": round(moved / max(seconds, 1e-9) / 1e9, 1), "first": first}

    def chunks(self, budget: int) -> list[tuple[int, int]]:
        """Device memory up to `budget`, in chunks; what the driver would not give is
        left out (it shows as coverage, bytes tested / free)."""
        chunks: list[tuple[int, int]] = []
        held = 0
        while budget - held >= 8 * (1 << 20):
            size = min(MEMTEST_CHUNK, budget - held) & ~0xFFFFF
            ptr = self.alloc(size, allow_oom=True)
            if not ptr:
                break
            chunks.append((ptr, size))
            held += size
        return chunks

    def memtest_pass(self, chunks: list[tuple[int, int]], kind: int, seed: int,
                     out: tuple[int, int]) -> tuple[int, list[dict[str, str]]]:
        """One pattern over every chunk: written, then checked on the GPU; the count of
        wrong words and the first ones the GPU kept."""
        c, cu = self.c, self.cu
        result_dev, result_host = out
        cu.call("cuMemsetD32_v2", c.c_uint64(result_dev), c.c_uint(0),
                c.c_size_t(MT_OUT_BYTES // 4))
        blocks = self.sms * 8
        for name, extra in (("mt_fill", ()), ("mt_check", (c.c_uint64(result_dev),))):
            offset = 0
            for ptr, size in chunks:
                # the random pattern goes on across chunks (no two chunks alike)
                word_seed = (seed + offset) & k.MASK64 if kind else seed
                self.launch(name, blocks, 256, c.c_uint64(ptr), c.c_uint64(size // 8),
                            c.c_uint32(kind), c.c_uint64(word_seed), *extra)
                offset += size // 8
            cu.call("cuCtxSynchronize")
        self.to_host(result_host, result_dev, MT_OUT_BYTES)
        words = c.cast(result_host, c.POINTER(c.c_uint64))
        wrong = int(words[0])
        found = [{"address": f"{words[1 + 3 * j]:#x}", "expected": f"{words[2 + 3 * j]:#018x}",
                  "got": f"{words[3 + 3 * j]:#018x}"} for j in range(min(wrong, k.MT_KEEP))]
        return wrong, found

    def bandwidth(self) -> dict[str, Any]:
        """Pinned host-to-device and back (the best of three, wall time), and a
        device-to-device copy timed by events (bytes read plus written)."""
        c, cu = self.c, self.cu
        size = self.opts.copy_bytes
        device, host = self.alloc(size), self.pinned(size)
        best = {"h2d": 0.0, "d2h": 0.0}
        for _ in range(4):  # the first of each direction warms the path
            for name, call, args in (
                    ("h2d", "cuMemcpyHtoD_v2", (c.c_uint64(device), c.c_void_p(host))),
                    ("d2h", "cuMemcpyDtoH_v2", (c.c_void_p(host), c.c_uint64(device)))):
                began = time.perf_counter()
                cu.call(call, *args, c.c_size_t(size))
                best[name] = max(best[name], size / (time.perf_counter() - began))
        self.free(device)
        big = self.opts.device_copy_bytes
        a, b = self.alloc(big), self.alloc(big)
        seconds = self.timed("cuMemcpyDtoD_v2", c.c_uint64(b), c.c_uint64(a), c.c_size_t(big))
        self.free(a)
        self.free(b)
        return {"h2d_gbps": round(best["h2d"] / 1e9, 2), "d2h_gbps": round(best["d2h"] / 1e9, 2),
                "d2d_gbps": round(2 * big * 3 / seconds / 1e9, 1), "bytes": size}

    def timed(self, call: str, *args: Any) -> float:
        from gpuguard.sources.cuda_copies import timed

        return timed(self.cu, self.c, (self.event(), self.event()), call, *args)

    def turn(self) -> contextlib.AbstractContextManager[None]:
        from gpuguard.sources.cuda_copies import link_turn

        return link_turn(self.lock_fd, self.opts.deadline_s / 4, self.cu.before)

    def pair(self, index: int, bus_id: str) -> dict[str, Any]:
        from gpuguard.sources.cuda_copies import peer_copies

        mine = self.alloc(self.opts.copy_bytes)
        try:
            return {"peer": index, **peer_copies(self.cu, self.c, self.dev, self.ctx,
                                                 (self.event(), self.event()), mine,
                                                 self.opts.copy_bytes, bus_id)}
        finally:
            self.free(mine)

    def release(self) -> None:
        """Everything the run took, each step on its own: one failure frees the rest."""
        c = self.c
        steps: list[tuple[str, tuple[Any, ...]]] = [
            ("cuEventDestroy_v2", (e,)) for e in self.events]
        if self.module.value:
            steps.append(("cuModuleUnload", (self.module,)))
        steps += [("cuMemFree_v2", (c.c_uint64(p.value),)) for p in self.device if p.value]
        steps += [("cuMemFreeHost", (p,)) for p in self.host if p.value]
        if self.retained:
            steps.append(("cuDevicePrimaryCtxRelease_v2", (self.dev,)))
        from gpuguard.sources.cuda_copies import give_back

        give_back(self.cu, steps)
        self.device, self.host, self.events = [], [], []


def seeded(opts: QualifyOptions) -> random.Random:
    return random.Random(opts.seed)
