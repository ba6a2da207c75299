"""The active probe: does each GPU compute and move data (docs/active-probe.md).

Runs after the NVML sweep, whose snapshot says which GPUs may be probed (an idle GPU
only, unless forced) and where each is (its PCI bus id, which CUDA finds it by: CUDA's
device order is not NVML's). One forked worker per GPU, forked before anything loads
libcuda (CUDA state must never cross a fork), all at once; the parent never loads
libcuda. Each worker streams one JSON line per phase started, finished and measured, so
a GPU that hangs (a call that never returns) or crashes its worker leaves the other GPUs'
results and makes only its own unknown, naming the phase and the call.

Phases of a worker: init (cuInit), device, context (the primary context), alloc,
compute (a PTX kernel writes seed + i into word i, the host reads it back), pattern
(walking ones and zeros written with cuMemsetD32 and read back), pcie (host to device
and back, pinned), memory (device-to-device copy), peer (copies to each later GPU with
peer access), release. The pcie and peer phases take a lock the workers share, one GPU
at a time: GPUs behind one PCIe switch, or copying into one NVSwitch port, would
otherwise share a link and each read low.

Standard library only at the top; cuda_api (ctypes) is imported in the worker.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import tempfile
import time
from dataclasses import asdict, dataclass

from gpuguard.io.pipe import exit_code, read_until
from gpuguard.model.pci import normalise_pci
from gpuguard.sources.nvml_progress import Progress

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Iterator
    from pathlib import Path
    from typing import Any

    from gpuguard.model.snapshot import GpuSnapshot, Snapshot

MIB = 1 << 20
# The compute phase's buffer: enough words to cover many thread blocks, little to check.
COMPUTE_BYTES = 1 * MIB
# Walking ones and zeros: one 32-bit pattern per slice of the pattern buffer.
PATTERN_SLICES = 32
# Host to device and back: at most this much pinned host memory. Pinning costs about
# 0.4 ms per MiB on an H200 host and freeing it as much again (256 MiB: 150 ms of the
# first device run's 1.7 s), while 64 MiB already takes 1.2 ms per copy at Gen5 x16,
# long beside the copy's 10 us start.
PCIE_MAX_BYTES = 64 * MIB
# The pattern is compared in chunks against one chunk-sized expected block: building
# the whole expected buffer cost 80 ms per pass on a 2-core VM, the chunks under 10 ms.
CHECK_CHUNK = 1 * MIB
# Copies timed per measurement (the best of them, or their sum for event-timed copies).
REPEATS = 3
# Workers killed at a deadline and not reaped yet, by GPU bus id: (pid, when, where it
# hung). A worker in D state cannot be reaped until the kernel lets go of it; its GPU
# gets no new worker meanwhile (they would pile up, one per run), only unknown results.
KILLED: dict[str, tuple[int, float, str]] = {}
# Workers started before the NVML sweep is in (EarlyStart): at most this many GPUs.
MAX_EARLY = 64
# CUresult codes that say the GPU could not be had, not that it is broken: unknown.
CANNOT_TELL = (2, 46, 805)


@dataclass
class ProbeOptions:
    force: bool = False
    deadline_s: float = 10.0
    bandwidth_bytes: int = 256 * MIB
    pattern_bytes: int = 64 * MIB
    # A GPU whose compute processes hold more than this share of its memory, or busier
    # than this, is left alone: the probe must never disturb a serving process.
    max_memory_percent: float = 10.0
    max_utilization_percent: float = 10.0


def options(settings: dict[str, float], force: bool = False, deadline_s: float | None = None,
            buffer_mib: int | None = None, pattern_mib: int | None = None) -> ProbeOptions:
    """The probe's options: what the command line gives, else the profile's active_probe
    section (`settings`), else the defaults."""
    opts = ProbeOptions(force=force)
    opts.deadline_s = deadline_s or settings.get("deadline_s", opts.deadline_s)
    opts.bandwidth_bytes = int(buffer_mib or settings.get("buffer_mib", 256)) * MIB
    opts.pattern_bytes = int(pattern_mib or settings.get("pattern_mib", 64)) * MIB
    opts.max_memory_percent = settings.get("max_memory_percent", opts.max_memory_percent)
    opts.max_utilization_percent = settings.get("max_utilization_percent",
                                                opts.max_utilization_percent)
    return opts


def skip_reason(gpu: GpuSnapshot, opts: ProbeOptions) -> str | None:
    """Why this GPU is not probed, or None. Unreadable usage is a reason: a GPU that
    might be serving is never touched."""
    if not gpu.pci_bus_id.is_ok:
        return f"its PCI bus id, which CUDA finds it by, was not read ({gpu.pci_bus_id.describe()})"
    if gpu.mig_mode_current.get_or(False):
        return "MIG is enabled: the probe runs on whole GPUs only"
    if opts.force:
        return None
    util = gpu.utilization_gpu_percent
    if not util.is_ok:
        return f"cannot tell whether it is busy: utilization {util.describe()}"
    if util.get() > opts.max_utilization_percent:
        return (f"busy: {util.get()} % utilization > {opts.max_utilization_percent:g} % "
                "(--active=force probes anyway)")
    procs = gpu.compute_processes
    if procs.is_ok and procs.get():
        # Any compute process is a reason, whatever it holds: an embedding model or a
        # reranker serves from a few GiB, and between requests its utilization reads 0.
        named = ", ".join(f"{p.pid} {p.name or '?'}" for p in procs.get()[:3])
        return (f"in use: {len(procs.get())} compute process(es) on it ({named}) "
                "(--active=force probes anyway)")
    total = gpu.memory_total_bytes
    if not total.is_ok or not total.get():
        return f"cannot tell how much memory is in use: memory total {total.describe()}"
    # No process listed (or the list not readable, as in some containers): memory in use
    # beyond the driver's reserve stands for a process NVML does not show.
    held = _held_bytes(gpu)
    if held is None:
        return "cannot tell how much memory compute processes hold"
    share = 100.0 * held / total.get()
    if share > opts.max_memory_percent:
        return (f"in use: compute processes hold {share:.0f} % of its memory > "
                f"{opts.max_memory_percent:g} % (--active=force probes anyway)")
    return None


def _held_bytes(gpu: GpuSnapshot) -> int | None:
    procs = gpu.compute_processes
    if procs.is_ok and all(p.used_memory_bytes is not None for p in procs.get()):
        return sum(p.used_memory_bytes or 0 for p in procs.get())
    # NVML does not always say what each process holds (containers): what is used beyond
    # the driver's own reserve stands for it.
    used = gpu.memory_used_bytes
    if not used.is_ok:
        return None
    return max(0, used.get() - gpu.memory_reserved_bytes.get_or(0))


@dataclass
class _Worker:
    slot: int
    index: int
    bus_id: str
    pid: int = 0


class ActiveProbe:
    """Workers started now, one per GPU that may be probed; `finish()` waits for them
    within the deadline and puts their results into the snapshot."""

    def __init__(self, snapshot: Snapshot, opts: ProbeOptions,
                 early: EarlyStart | None = None) -> None:
        self.opts = opts
        self.started = time.monotonic()
        self.skipped: dict[int, str] = {}
        self.stuck: dict[int, str] = {}
        self.workers: list[_Worker] = []
        first_slot = len(early.waiting) if early else 0
        reap_killed()
        for gpu in snapshot.gpus:
            reason = skip_reason(gpu, opts)
            killed = KILLED.get(normalise_pci(gpu.pci_bus_id.get())) \
                if reason is None else None
            if killed is not None:
                pid, when, where = killed
                self.stuck[gpu.index] = (
                    f"its worker of {time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(when))} "
                    f"(pid {pid}, killed at the deadline in {where or 'its start'}) is still "
                    "stuck in the driver; no new one is started until it is gone")
            elif reason is None:
                self.workers.append(_Worker(first_slot + len(self.workers), gpu.index,
                                            gpu.pci_bus_id.get()))
            else:
                self.skipped[gpu.index] = reason
        self._stopped: list[int] = []
        if early is None:
            early = EarlyStart(None)
        self._progress = early.progress
        self._read_fd = early.read_fd
        _import_worker_modules()
        for worker in self.workers:
            peers = [(w.index, w.bus_id) for w in self.workers if w.index > worker.index]
            waiting = early.take(worker.bus_id)
            if waiting is not None:
                # Started before the NVML sweep was in; cuInit done or under way.
                worker.slot, worker.pid = waiting.slot, waiting.pid
                waiting.go({"index": worker.index, "peers": peers, "opts": asdict(opts)})
                continue
            def late(worker: _Worker = worker, peers: list[tuple[int, str]] = peers) -> None:
                os.close(early.read_fd)
                early.close_go_ends()
                out = os.fdopen(early.write_fd, "w", buffering=1)
                _child_main(out, self._progress, worker, peers, opts, early.lock.fileno())

            worker.pid = _fork_worker(late)
        self._stopped = early.stop_rest()
        os.close(early.write_fd)
        early.lock.close()
        if not self.workers:
            self._read_fd = -1
            os.close(early.read_fd)

    def finish(self, snapshot: Snapshot) -> None:
        messages: list[dict[str, Any]] = []
        finished = True
        if self._read_fd >= 0:
            data, finished = read_until(self._read_fd, self.started + self.opts.deadline_s)
            for line in data.splitlines():
                try:
                    messages.append(json.loads(line))
                except ValueError:
                    continue  # a line cut by the deadline
        ended = {m.get("gpu") for m in messages if m.get("t") == "end"}
        hung = {} if finished else {w.index: self._where(w) for w in self.workers
                                    if w.index not in ended}
        endings = {w.index: _ending(w.pid, finished) for w in self.workers}
        now = time.time()
        for w in self.workers:
            if w.index in hung and not _reaped(w.pid):
                KILLED[normalise_pci(w.bus_id)] = (w.pid, now, hung[w.index])
        for pid in self._stopped:  # killed when told to stop (they held no context)
            if not _reaped(pid):
                KILLED[f"stopped-{pid}"] = (pid, now, "cuInit")
        elapsed = time.monotonic() - self.started
        ran = [w.index for w in self.workers] + list(self.stuck)
        assemble(snapshot, self.opts, self.skipped, ran, messages, hung, endings, elapsed,
                 self.stuck)
        # gpuguard_source_success{source="active_probe"}: failed when a GPU it ran on
        # has a reading it could not take
        snapshot.record("active_probe", self.started,
                        [getattr(gpu, name) for gpu in snapshot.gpus if gpu.index in ran
                         for name in FIELDS])

    def _where(self, worker: _Worker) -> str:
        slot = self._progress.buf[worker.slot * 128:(worker.slot + 1) * 128]
        return bytes(slot).split(b"\0", 1)[0].decode(errors="replace")


def reap_killed() -> None:
    """Reap the workers killed on earlier runs that have ended since."""
    for key, (pid, _, _) in list(KILLED.items()):
        if _reaped(pid):
            del KILLED[key]


def _reaped(pid: int) -> bool:
    """Whether the worker is gone (reaped now, or not this process's child any more)."""
    try:
        done, _ = os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        return True
    return done != 0


# prctl from the C library, looked up before any fork: a child of a threaded daemon must
# not dlopen (another thread may have held the loader's lock at the fork).
_PRCTL: list[Any] = []
PR_SET_PDEATHSIG = 1


def _die_with_parent(parent: int) -> None:
    """In a worker just forked: the kernel kills it when its parent goes (a `check
    --active` killed by `timeout` or a Slurm prolog leaves no worker holding a context)."""
    if _PRCTL:
        with contextlib.suppress(Exception):
            _PRCTL[0](PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent:  # the parent went before prctl took effect
        os._exit(1)


def _fork_worker(body: Callable[[], None]) -> int:
    """Fork a worker that runs `body` and exits (0, or 1 when it raised: the parent
    learns the rest from its lines and its ending); its pid. The worker dies with us."""
    parent = os.getpid()
    pid = os.fork()
    if pid == 0:  # child
        code = 0
        try:
            _die_with_parent(parent)
            body()
        except BaseException:
            code = 1
        finally:
            os._exit(code)
    return pid


def _import_worker_modules() -> None:
    """What the workers import, imported before the fork: in the daemon another thread
    may hold the import lock at the fork, and a child would wait on it forever."""
    import array  # noqa: F401
    import ctypes
    import fcntl  # noqa: F401
    import struct  # noqa: F401

    from gpuguard.sources import cuda_api  # noqa: F401

    if not _PRCTL:
        with contextlib.suppress(OSError, AttributeError):
            _PRCTL.append(ctypes.CDLL(None, use_errno=True).prctl)


@dataclass
class _Waiting:
    """A worker forked early, waiting to be told which GPU it probes."""

    slot: int
    pid: int
    go_fd: int

    def go(self, message: dict[str, Any]) -> None:
        with contextlib.suppress(OSError):  # a worker that died: its ending says so
            os.write(self.go_fd, (json.dumps(message) + "\n").encode())
        os.close(self.go_fd)


class EarlyStart:
    """Workers forked while `check`'s NVML sweep runs, one per GPU the driver lists under
    <procfs>/driver/nvidia/gpus/ (named by bus id): each loads libcuda and runs cuInit,
    240-500 ms on an H200 host that touches no GPU memory and creates no context, then
    waits to be told which GPU to probe, or to stop (a GPU the sweep finds busy is never
    touched beyond cuInit). A GPU the folder does not list gets a worker forked later, as
    without an early start; `EarlyStart(None)` starts none."""

    def __init__(self, procfs: Path | None) -> None:
        self.progress = Progress()
        # lockf: the workers' turnstile; closed once every worker is forked
        self.lock = tempfile.TemporaryFile()  # noqa: SIM115
        self.read_fd, self.write_fd = os.pipe()
        self.waiting: dict[str, _Waiting] = {}
        names: list[str] = []
        if procfs is not None:
            with contextlib.suppress(OSError):
                names = sorted(os.listdir(procfs / "driver" / "nvidia" / "gpus"))[:MAX_EARLY]
        if names:
            _import_worker_modules()
        for name in names:
            try:
                bus_id = normalise_pci(name)
            except (IndexError, ValueError):
                continue
            slot = len(self.waiting)
            go_read, go_write = os.pipe()
            def run_early(go_read: int = go_read, go_write: int = go_write, slot: int = slot,
                          name: str = name) -> None:
                os.close(self.read_fd)
                os.close(go_write)
                self.close_go_ends()
                _early_child(self.write_fd, go_read, self.progress, slot, name,
                             self.lock.fileno())

            pid = _fork_worker(run_early)
            os.close(go_read)
            self.waiting[bus_id] = _Waiting(slot, pid, go_write)

    def take(self, bus_id: str) -> _Waiting | None:
        try:
            return self.waiting.pop(normalise_pci(bus_id), None)
        except (IndexError, ValueError):
            return None

    def close_go_ends(self) -> None:
        """In a child: the other workers' go pipes are not its to hold open."""
        for waiting in self.waiting.values():
            with contextlib.suppress(OSError):
                os.close(waiting.go_fd)

    def stop_rest(self) -> list[int]:
        """Stop the workers no GPU needs; their pids. Killed, not only told (their go pipe
        closes): one still in a slow cuInit would hold the result pipe open, and the
        probe would wait for it until its deadline. They hold no context to release."""
        pids = []
        for waiting in self.waiting.values():
            os.close(waiting.go_fd)
            with contextlib.suppress(ProcessLookupError):
                os.kill(waiting.pid, signal.SIGKILL)
            pids.append(waiting.pid)
        self.waiting.clear()
        return pids

    def abandon(self) -> None:
        """`check` gave up before the sweep was in: stop every worker, reap what has gone."""
        for pid in self.stop_rest():
            _ending(pid, finished=False)
        for fd in (self.read_fd, self.write_fd):
            with contextlib.suppress(OSError):
                os.close(fd)
        self.lock.close()


def _early_child(write_fd: int, go_fd: int, progress: Progress, slot: int, name: str,
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
    worker = _Worker(slot, int(message["index"]), name)
    peers = [(int(index), str(bus)) for index, bus in message["peers"]]
    out = os.fdopen(write_fd, "w", buffering=1)
    _child_main(out, progress, worker, peers, ProbeOptions(**message["opts"]), lock_fd,
                carried_ms={"init": init_ms})


def _ending(pid: int, finished: bool) -> str | None:
    """How a worker ended: None when it exited by itself; otherwise the signal it died of.
    A worker still running (the deadline passed) is killed and not waited for: one in D
    state cannot be reaped until the kernel lets go of it."""
    if not finished:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    code = exit_code(pid, time.monotonic() + (0.5 if finished else 0.0))
    if code is None or code == 0:
        return None
    if code > 0:
        return f"exited with code {code}"
    try:
        return f"died of {signal.Signals(-code).name}"
    except ValueError:
        return f"died of signal {-code}"


# The snapshot fields the probe fills for each GPU (gpuguard/model/snapshot.py).
FIELDS = ("probe_compute", "probe_pattern", "probe_pcie", "probe_memory", "probe_peers")


def assemble(snapshot: Snapshot, opts: ProbeOptions, skipped: dict[int, str],
             ran: list[int], messages: list[dict[str, Any]], hung: dict[int, str],
             endings: dict[int, str | None], elapsed_s: float,
             stuck: dict[int, str] | None = None) -> None:
    """The workers' lines as readings: a value for what was measured; for what was not,
    an error naming why (the phase that hung, the CUDA error, the worker's death)."""
    from gpuguard.model.snapshot import Reading

    by_gpu: dict[int, list[dict[str, Any]]] = {index: [] for index in ran}
    for msg in messages:
        if isinstance(msg, dict) and msg.get("gpu") in by_gpu:
            by_gpu[msg["gpu"]].append(msg)
    pairs: dict[tuple[int, int], dict[str, Any]] = {}
    for gpu in snapshot.gpus:
        if gpu.index in skipped:
            gpu.probe_skipped = Reading.ok(skipped[gpu.index])
            for name in FIELDS:
                setattr(gpu, name, Reading.not_supported(skipped[gpu.index]))
            continue
        lines = by_gpu.get(gpu.index, [])
        values: dict[str, Any] = {}
        phases: dict[str, float] = {}
        failure: str | None = None
        cuda_code: int | None = None
        ended = False
        for msg in lines:
            kind = msg.get("t")
            if kind == "phase" and isinstance(msg.get("ms"), int | float):
                phases[str(msg.get("phase"))] = float(msg["ms"])
            elif kind == "result" and msg.get("field") in FIELDS:
                values[msg["field"]] = msg.get("value")
            elif kind == "pair":
                pairs[(gpu.index, int(msg.get("peer", -1)))] = msg
            elif kind == "cuda_error":
                failure = f"{msg.get('error')} (phase {msg.get('phase')})"
                cuda_code = msg.get("code") if isinstance(msg.get("code"), int) else None
            elif kind == "fatal":
                failure = str(msg.get("error"))
            elif kind == "end":
                ended = True
        if gpu.index in (stuck or {}):
            why = (stuck or {})[gpu.index]
        elif gpu.index in hung:
            why = (f"the active probe did not finish within its {opts.deadline_s:g} s "
                   f"deadline: {hung[gpu.index] or 'worker start'}")
        elif not ended and endings.get(gpu.index):
            why = (f"the active probe's worker {endings[gpu.index]} in "
                   f"{_last_phase(lines)}")
        elif failure is not None:
            why = failure
        elif not ended:
            why = "the active probe's worker left without a result"
        else:
            why = "not measured"
        if "probe_compute" not in values and failure is not None and cuda_code is not None \
                and cuda_code not in CANNOT_TELL and gpu.index not in hung:
            # A CUDA error before or in the kernel is the answer: this GPU cannot compute.
            values["probe_compute"] = {"error": failure, "mismatches": None, "words": None}
        for name in FIELDS:
            if name == "probe_peers":
                continue
            if name in values:
                value = values[name]
                if name == "probe_compute" and isinstance(value, dict):
                    value = {**value, "phases_ms": phases, "elapsed_s": round(elapsed_s, 3)}
                setattr(gpu, name, Reading.ok(value))
            else:
                setattr(gpu, name, Reading.failed(why if name == "probe_compute"
                                                  else f"not measured: {why}"))
        gpu.probe_skipped = Reading.ok("")
    _peer_readings(snapshot, ran, pairs, hung, endings)


def _last_phase(lines: list[dict[str, Any]]) -> str:
    started = [m.get("phase") for m in lines if m.get("t") == "start"]
    return f"phase {started[-1]}" if started else "its start"


def _peer_readings(snapshot: Snapshot, ran: list[int], pairs: dict[tuple[int, int],
                   dict[str, Any]], hung: dict[int, str], endings: dict[int, str | None]
                   ) -> None:
    """Each pair's copies on both GPUs' probe_peers (a slow pair may be either end's
    fault); a pair the lower GPU did not reach is an entry with the reason."""
    from gpuguard.model.snapshot import Reading

    for gpu in snapshot.gpus:
        if gpu.index not in ran:
            continue
        entries: list[dict[str, Any]] = []
        for other in ran:
            if other == gpu.index:
                continue
            low, high = min(gpu.index, other), max(gpu.index, other)
            msg = pairs.get((low, high))
            if msg is None:
                reason = f"did not finish: {hung[low]}" if low in hung else \
                    (endings.get(low) or "stopped before it")
                entries.append({"peer": other, "access": None,
                                "error": f"not measured: GPU {low}'s worker {reason}"})
                continue
            forward, backward = msg.get("gbps"), msg.get("reverse_gbps")
            mine, theirs = (forward, backward) if gpu.index == low else (backward, forward)
            entry = {"peer": other, "access": msg.get("access"), "gbps": mine,
                     "reverse_gbps": theirs}
            if msg.get("error"):
                entry["error"] = msg["error"]
            entries.append(entry)
        gpu.probe_peers = Reading.ok(entries)


# --- the forked worker: runs only in the child -------------------------------------


def _child_main(out: Any, progress: Progress, worker: _Worker, peers: list[tuple[int, str]],
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

    def __init__(self, cu: Any, worker: _Worker, peers: list[tuple[int, str]],
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

    @contextlib.contextmanager
    def turn(self) -> Iterator[None]:
        """One GPU at a time on the shared links. A GPU that hangs holding the turn must
        not make the others unknown: after a quarter of the deadline a worker measures
        without it (the hung GPU moves no data, so the measurement is still alone)."""
        import fcntl

        self.cu.before("waiting for its turn on the shared PCIe/NVLink links")
        end = time.monotonic() + self.opts.deadline_s / 4
        held = False
        while not held and time.monotonic() < end:
            try:
                fcntl.lockf(self.lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                held = True
            except OSError:
                time.sleep(0.002)
        try:
            yield
        finally:
            if held:
                fcntl.lockf(self.lock_fd, fcntl.LOCK_UN)

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
        """Seconds for REPEATS copies, timed by CUDA events on the stream (a copy between
        device buffers returns before it is done)."""
        c, cu = self.c, self.cu
        cu.call(call, *args)  # warm up
        start, stop = self.events
        cu.call("cuEventRecord", start, None)
        for _ in range(REPEATS):
            cu.call(call, *args)
        cu.call("cuEventRecord", stop, None)
        cu.call("cuEventSynchronize", stop)
        ms = c.c_float()
        cu.call("cuEventElapsedTime", c.byref(ms), start, stop)
        return float(max(ms.value, 1e-3)) / 1e3

    def memory(self) -> float:
        c = self.c
        size = self.opts.bandwidth_bytes
        seconds = self.timed("cuMemcpyDtoD_v2", c.c_uint64(self.device_b.value),
                             c.c_uint64(self.device_a.value), c.c_size_t(size))
        # Bytes read plus bytes written, as HBM bandwidth is quoted.
        return round(2 * size * REPEATS / seconds / 1e9, 1)

    def pair(self, bus_id: str) -> dict[str, Any]:
        c, cu = self.c, self.cu
        size = self.opts.bandwidth_bytes
        peer_dev, can = c.c_int(), c.c_int()
        cu.call("cuDeviceGetByPCIBusId", c.byref(peer_dev), bus_id.encode())
        cu.call("cuDeviceCanAccessPeer", c.byref(can), self.dev, peer_dev)
        if not can.value:
            return {"access": False}
        peer_ctx, peer_buf = c.c_void_p(), c.c_uint64()
        cu.call("cuDevicePrimaryCtxRetain", c.byref(peer_ctx), peer_dev)
        try:
            cu.call("cuCtxSetCurrent", peer_ctx)
            cu.call("cuMemAlloc_v2", c.byref(peer_buf), c.c_size_t(size))
            cu.call("cuCtxSetCurrent", self.ctx)
            cu.call("cuCtxEnablePeerAccess", peer_ctx, c.c_uint(0), allow=(704,))
            mine = c.c_uint64(self.device_a.value)
            forward = self.timed("cuMemcpyPeer", peer_buf, peer_ctx, mine, self.ctx,
                                 c.c_size_t(size))
            backward = self.timed("cuMemcpyPeer", mine, self.ctx, peer_buf, peer_ctx,
                                  c.c_size_t(size))
            return {"access": True, "gbps": round(size * REPEATS / forward / 1e9, 1),
                    "reverse_gbps": round(size * REPEATS / backward / 1e9, 1)}
        finally:
            with contextlib.suppress(Exception):
                cu.call("cuCtxDisablePeerAccess", peer_ctx)
            if peer_buf.value:
                with contextlib.suppress(Exception):
                    cu.call("cuMemFree_v2", peer_buf)
            with contextlib.suppress(Exception):
                cu.call("cuDevicePrimaryCtxRelease_v2", peer_dev)
            with contextlib.suppress(Exception):
                cu.call("cuCtxSetCurrent", self.ctx)

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
        for call, args in steps:
            with contextlib.suppress(Exception):
                cu.call(call, *args)


def _word_mismatches(got: bytes, expected: bytes) -> int:
    from array import array

    read, want = array("I"), array("I")
    read.frombytes(got)
    want.frombytes(expected)
    return sum(1 for a, b in zip(read, want, strict=True) if a != b)
