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

This module imports only the standard library at the top: it is imported before
the fork, on the critical path of `gpuguard check` (docs/benchmarks.md). The worker
writes readings in the snapshot's JSON form (a value, or {"state": ...}).

The parent waits until the deadline, then gives up on the child (SIGKILL, no wait:
a process in D state cannot be reaped until the kernel lets go of it).
"""

from __future__ import annotations

import contextlib
import json
import mmap
import os
import signal
import threading
import time

from gpuguard.sources.pipe import read_until

# No `typing` or `pathlib` at run time: both cost milliseconds before the fork.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

    from gpuguard.snapshot import Snapshot

_SLOT_SIZE = 128
_MAX_SLOTS = 1 + 64

RECOVERY_ACTIONS = {
    0: "none",
    1: "gpu_reset",
    2: "node_reboot",
    3: "drain_p2p",
    4: "drain_and_reset",
    5: "recover_imex_domain",
    6: "bus_reset",
    7: "system_reboot",
}


class Progress:
    """One slot per worker thread (slot 0: host calls, slot i+1: GPU i) in shared memory:
    anonymous for a forked worker, a file for one spawned by the daemon."""

    def __init__(self, path: str | None = None) -> None:
        size = _SLOT_SIZE * _MAX_SLOTS
        if path is None:
            self.buf = mmap.mmap(-1, size)
        else:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
            try:
                os.ftruncate(fd, size)
                self.buf = mmap.mmap(fd, size)
            finally:
                os.close(fd)

    def set(self, slot: int, text: str) -> None:
        if slot >= _MAX_SLOTS:
            return
        raw = text.encode()[: _SLOT_SIZE - 1]
        start = slot * _SLOT_SIZE
        self.buf[start : start + len(raw) + 1] = raw + b"\0"

    def active(self) -> list[str]:
        calls = []
        for slot in range(_MAX_SLOTS):
            start = slot * _SLOT_SIZE
            raw = bytes(self.buf[start : start + _SLOT_SIZE]).split(b"\0", 1)[0]
            if raw:
                calls.append(raw.decode(errors="replace"))
        return calls


class NvmlProbe:
    """A sweep started in a child process; `result()` collects it within the deadline."""

    def __init__(self, procfs: str, deadline_s: float) -> None:
        self.deadline_s = deadline_s
        self.started = time.monotonic()
        self._progress = Progress()
        read_fd, write_fd = os.pipe()
        pid = os.fork()
        if pid == 0:  # child
            os.close(read_fd)
            code = 0
            try:
                out = os.fdopen(write_fd, "w", buffering=1)
                _child_main(out, self._progress, procfs)
            except BaseException:
                code = 1  # the parent reports a worker that left without a result
            finally:
                os._exit(code)
        os.close(write_fd)
        self.pid = pid
        self._read_fd = read_fd

    def result(self) -> Snapshot:
        messages, finished = self._drain()
        elapsed = time.monotonic() - self.started
        snapshot = assemble(messages)
        snapshot.nvml.deadline_s = self.deadline_s
        snapshot.nvml.elapsed_s = round(elapsed, 4)
        if not finished:
            snapshot.nvml.hung_call = "; ".join(self._progress.active()) or "NVML worker start"
            _abandon(self.pid)
        else:
            _reap(self.pid)
        fill_unanswered(snapshot)
        snapshot.record_nvml()
        return snapshot

    def _drain(self) -> tuple[list[dict[str, Any]], bool]:
        data, finished = read_until(self._read_fd, self.started + self.deadline_s)
        messages = []
        for line in data.splitlines():
            try:
                messages.append(json.loads(line))
            except ValueError:
                continue  # a line cut by the deadline
        if finished and not any(m.get("t") in ("done", "init_error", "fatal") for m in messages):
            messages.append({"t": "fatal", "error": "NVML worker exited without a result"})
        return messages, finished


def deadline_for(timeout: float) -> float:
    """The NVML worker's share of `--timeout`: the rest is for judging and printing."""
    return max(0.1, timeout - min(1.0, timeout * 0.1))


_early: tuple[NvmlProbe, str, float] | None = None


def start_early(procfs: str, deadline_s: float) -> None:
    """Fork the worker before the CLI framework loads (see gpuguard/entry.py)."""
    global _early
    _early = (NvmlProbe(procfs, deadline_s), procfs, deadline_s)


def probe(procfs: str, deadline_s: float) -> NvmlProbe:
    """The early worker if it was started with these settings, else a new one."""
    global _early
    early, _early = _early, None
    if early is not None:
        started, early_procfs, early_deadline = early
        if early_procfs == procfs and early_deadline == deadline_s:
            return started
        _abandon(started.pid)
    return NvmlProbe(procfs, deadline_s)


def _abandon(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, os.WNOHANG)
    except (ProcessLookupError, ChildProcessError):
        pass


def _reap(pid: int) -> None:
    # The worker closes its pipe before nvmlShutdown, so it may still be running;
    # it exits on its own and init reaps it if we are gone first.
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)


def assemble(messages: list[dict[str, Any]]) -> Snapshot:
    import socket

    from gpuguard.snapshot import GpuSnapshot, HostInfo, NvmlStatus, Snapshot, from_json

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
        elif kind == "init_error":
            snapshot.nvml.init_error = msg.get("error")
            snapshot.nvml.init_error_kind = msg.get("kind")
        elif kind == "fatal":
            snapshot.nvml.sweep_error = f"{msg.get('kind', 'error')}: {msg.get('error')}"
    snapshot.gpus.sort(key=lambda g: g.index)  # worker threads finish in any order
    return snapshot


def fill_unanswered(snapshot: Snapshot, known: list[Any] | None = None) -> None:
    """GPUs that NVML counted (or that `known`, the last sweep's GPUs, had) but did not
    answer for, because a call hung or the sweep stopped, are listed with every reading an
    error naming why: their rules are unknown, never missing from the results."""
    from gpuguard.snapshot import GPU_READING_FIELDS, GpuSnapshot, Reading

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
        gpu.__post_init__()
        snapshot.gpus.append(gpu)
    snapshot.gpus.sort(key=lambda g: g.index)


# --- the child side: everything below runs only in the forked worker ---------------


def _line_writer(out: Any) -> Callable[[dict[str, Any]], None]:
    """One JSON line per message, whole, from any of the per-GPU threads."""
    lock = threading.Lock()

    def emit(obj: dict[str, Any]) -> None:
        line = json.dumps(obj) + "\n"
        with lock:
            out.write(line)
            out.flush()

    return emit


def _child_main(out: Any, progress: Progress, procfs: str) -> None:
    progress.set(0, "import pynvml")
    import pynvml

    emit = _line_writer(out)
    progress.set(0, "nvmlInit")
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        emit({"t": "init_error", "kind": type(exc).__name__, "error": str(exc)})
        return
    try:
        _sweep(pynvml, emit, progress, procfs)
        emit({"t": "done"})
    except Exception as exc:  # a result, never a crash of the parent
        emit({"t": "fatal", "kind": type(exc).__name__, "error": str(exc)})
    # Hand the result over before shutting NVML down: the parent stops waiting at EOF.
    out.close()
    with contextlib.suppress(pynvml.NVMLError):
        pynvml.nvmlShutdown()


def _reader(nv: Any, progress: Progress, slot: int,
            lost: list[bool] | None = None) -> Callable[..., Any]:
    """A call wrapper that turns NVML errors into readings; `lost[0]` becomes True when a
    call answers NVML_ERROR_GPU_IS_LOST (the GPU fell off the bus): a fact, not unknown."""
    def read(call: str, fn: Callable[[], Any], where: str = "") -> Any:
        progress.set(slot, call + where)
        try:
            return fn()
        except nv.NVMLError_NotSupported:
            return {"state": "not_supported"}
        except (nv.NVMLError_FunctionNotFound, nv.NVMLLibraryMismatchError):
            return {"state": "not_supported", "error": "not in this driver's NVML"}
        except nv.NVMLError as exc:
            if lost is not None and getattr(exc, "value", None) == nv.NVML_ERROR_GPU_IS_LOST:
                lost[0] = True
            return {"state": "error", "error": f"{call}: {exc}"}

    return read


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _sweep(nv: Any, emit: Callable[[dict[str, Any]], None], progress: Progress,
           procfs: str) -> None:
    read = _reader(nv, progress, 0)
    count = read("nvmlDeviceGetCount", nv.nvmlDeviceGetCount)
    emit(
        {
            "t": "host",
            "driver_version": read(
                "nvmlSystemGetDriverVersion", lambda: _text(nv.nvmlSystemGetDriverVersion())
            ),
            "nvml_version": read(
                "nvmlSystemGetNVMLVersion", lambda: _text(nv.nvmlSystemGetNVMLVersion())
            ),
            "cuda_driver_version": read(
                "nvmlSystemGetCudaDriverVersion",
                lambda: _cuda_version(nv.nvmlSystemGetCudaDriverVersion()),
            ),
            "gpu_count": count,
        }
    )
    progress.set(0, "")
    if not isinstance(count, int):
        return
    # One thread per GPU: NVML is thread-safe and most of a call's time is spent
    # waiting on the GPU, so an 8-GPU host costs about what one GPU costs.
    threads = [
        threading.Thread(target=_sweep_gpu, args=(nv, emit, progress, procfs, index), daemon=True)
        for index in range(count)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


def _sweep_gpu(nv: Any, emit: Callable[[dict[str, Any]], None], progress: Progress,
               procfs: str, index: int) -> None:
    slot = index + 1
    lost = [False]
    read = _reader(nv, progress, slot, lost)
    where = f" (GPU {index})"
    progress.set(slot, "nvmlDeviceGetHandleByIndex" + where)
    try:
        handle = nv.nvmlDeviceGetHandleByIndex(index)
    except nv.NVMLError as exc:
        failed = {"state": "error", "error": f"nvmlDeviceGetHandleByIndex: {exc}"}
        emit({"t": "gpu", "index": index, "uuid": failed, "pci_bus_id": failed,
              "gpu_lost": getattr(exc, "value", None) == nv.NVML_ERROR_GPU_IS_LOST})
    else:
        readings = _read_gpu(nv, handle, where, read, _text, procfs)
        emit({"t": "gpu", "index": index, **readings, "gpu_lost": lost[0]})
    progress.set(slot, "")


def _cuda_version(raw: int) -> str:
    return f"{raw // 1000}.{(raw % 1000) // 10}"


def _read_gpu(
    nv: Any,
    h: Any,
    where: str,
    read: Callable[..., Any],
    text: Callable[[Any], str],
    procfs: str,
) -> dict[str, Any]:
    g: dict[str, Any] = {}

    def dev(name: str, call: str, *args: Any, convert: Callable[[Any], Any] = lambda v: v) -> Any:
        fn = getattr(nv, call)
        g[name] = read(call, lambda: convert(fn(h, *args)), where)
        return g[name]

    def split(value: Any, names: tuple[str, ...],
              converts: tuple[Callable[[Any], Any], ...]) -> None:
        # One NVML call that returns several fields: an error applies to each of them.
        for i, name in enumerate(names):
            g[name] = converts[i](value[i]) if isinstance(value, list) else value

    dev("uuid", "nvmlDeviceGetUUID", convert=text)
    dev("name", "nvmlDeviceGetName", convert=text)
    dev("serial", "nvmlDeviceGetSerial", convert=text)
    dev("pci_bus_id", "nvmlDeviceGetPciInfo", convert=lambda info: text(info.busId))
    dev("vbios_version", "nvmlDeviceGetVbiosVersion", convert=text)
    dev("inforom_image_version", "nvmlDeviceGetInforomImageVersion", convert=text)
    dev("persistence_mode", "nvmlDeviceGetPersistenceMode", convert=bool)
    split(read("nvmlDeviceGetMigMode", lambda: list(nv.nvmlDeviceGetMigMode(h)), where),
          ("mig_mode_current", "mig_mode_pending"), (bool, bool))
    split(read("nvmlDeviceGetEccMode", lambda: list(nv.nvmlDeviceGetEccMode(h)), where),
          ("ecc_mode_current", "ecc_mode_pending"), (bool, bool))

    kinds = (("corrected", nv.NVML_MEMORY_ERROR_TYPE_CORRECTED),
             ("uncorrected", nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED))
    counters = (("volatile", nv.NVML_VOLATILE_ECC), ("aggregate", nv.NVML_AGGREGATE_ECC))
    locations = (("dram", nv.NVML_MEMORY_LOCATION_DRAM), ("sram", nv.NVML_MEMORY_LOCATION_SRAM))
    for counter_name, counter in counters:
        for kind_name, kind in kinds:
            dev(f"ecc_{counter_name}_{kind_name}", "nvmlDeviceGetTotalEccErrors", kind, counter,
                convert=int)
            for loc_name, loc in locations:
                dev(f"ecc_{counter_name}_{loc_name}_{kind_name}",
                    "nvmlDeviceGetMemoryErrorCounter", kind, counter, loc, convert=int)

    dev("retired_pages_sbe", "nvmlDeviceGetRetiredPages",
        nv.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS, convert=len)
    dev("retired_pages_dbe", "nvmlDeviceGetRetiredPages",
        nv.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR, convert=len)
    dev("retired_pages_pending", "nvmlDeviceGetRetiredPagesPendingStatus", convert=bool)
    split(read("nvmlDeviceGetRemappedRows", lambda: list(nv.nvmlDeviceGetRemappedRows(h)), where),
          ("remapped_rows_correctable", "remapped_rows_uncorrectable",
           "remapped_rows_pending", "remapped_rows_failure"), (int, int, bool, bool))

    dev("pcie_link_gen_current", "nvmlDeviceGetCurrPcieLinkGeneration")
    dev("pcie_link_gen_max", "nvmlDeviceGetMaxPcieLinkGeneration")
    dev("pcie_link_width_current", "nvmlDeviceGetCurrPcieLinkWidth")
    dev("pcie_link_width_max", "nvmlDeviceGetMaxPcieLinkWidth")
    dev("pcie_replay_counter", "nvmlDeviceGetPcieReplayCounter")

    dev("temperature_c", "nvmlDeviceGetTemperature", nv.NVML_TEMPERATURE_GPU)
    if hasattr(nv, "nvmlDeviceGetMarginTemperature"):
        dev("temperature_tlimit_margin_c", "nvmlDeviceGetMarginTemperature")
    else:
        g["temperature_tlimit_margin_c"] = {"state": "not_supported",
                                            "error": "needs nvidia-ml-py 12.550 or newer"}
    dev("temperature_slowdown_c", "nvmlDeviceGetTemperatureThreshold",
        nv.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN)
    dev("temperature_shutdown_c", "nvmlDeviceGetTemperatureThreshold",
        nv.NVML_TEMPERATURE_THRESHOLD_SHUTDOWN)
    dev("temperature_gpu_max_c", "nvmlDeviceGetTemperatureThreshold",
        nv.NVML_TEMPERATURE_THRESHOLD_GPU_MAX)

    def watts(milliwatts: int) -> float:
        return milliwatts / 1000.0

    dev("power_draw_w", "nvmlDeviceGetPowerUsage", convert=watts)
    dev("power_limit_enforced_w", "nvmlDeviceGetEnforcedPowerLimit", convert=watts)
    dev("power_limit_default_w", "nvmlDeviceGetPowerManagementDefaultLimit", convert=watts)

    # The "throttle" name is the pre-12.x spelling of the same call.
    reasons = "nvmlDeviceGetCurrentClocksEventReasons"
    if not hasattr(nv, reasons):
        reasons = "nvmlDeviceGetCurrentClocksThrottleReasons"
    dev("clock_event_reasons", reasons, convert=int)
    dev("clock_sm_mhz", "nvmlDeviceGetClockInfo", nv.NVML_CLOCK_SM)
    dev("clock_mem_mhz", "nvmlDeviceGetClockInfo", nv.NVML_CLOCK_MEM)
    dev("clock_sm_max_mhz", "nvmlDeviceGetMaxClockInfo", nv.NVML_CLOCK_SM)
    dev("clock_mem_max_mhz", "nvmlDeviceGetMaxClockInfo", nv.NVML_CLOCK_MEM)

    util = read("nvmlDeviceGetUtilizationRates",
                lambda: _util(nv.nvmlDeviceGetUtilizationRates(h)), where)
    g["utilization_gpu_percent"] = util.get("gpu", util)
    g["utilization_memory_percent"] = util.get("memory", util)

    mem = read("nvmlDeviceGetMemoryInfo", lambda: _memory(nv, h), where)
    for key in ("total", "used", "reserved"):
        g[f"memory_{key}_bytes"] = mem.get(key, mem) if "state" not in mem else mem

    g["compute_processes"] = read(
        "nvmlDeviceGetComputeRunningProcesses",
        lambda: _processes(nv.nvmlDeviceGetComputeRunningProcesses(h), procfs),
        where,
    )
    g["recovery_action"] = read("nvmlDeviceGetFieldValues", lambda: _recovery_action(nv, h), where)
    return g


def _util(raw: Any) -> dict[str, int]:
    return {"gpu": int(raw.gpu), "memory": int(raw.memory)}


def _memory(nv: Any, h: Any) -> dict[str, Any]:
    try:
        info = nv.nvmlDeviceGetMemoryInfo(h, version=nv.nvmlMemory_v2)
        return {"total": int(info.total), "used": int(info.used), "reserved": int(info.reserved)}
    except nv.NVMLError_FunctionNotFound:
        # Before v2 "used" includes the driver's reservation, which we cannot tell apart.
        info = nv.nvmlDeviceGetMemoryInfo(h)
        return {"total": int(info.total), "used": int(info.used),
                "reserved": {"state": "not_supported", "error": "needs nvmlDeviceGetMemoryInfo_v2"}}


def _processes(raw: list[Any], procfs: str) -> list[dict[str, Any]]:
    out = []
    for proc in raw:
        try:
            with open(os.path.join(procfs, str(proc.pid), "comm")) as comm:
                name: str | None = comm.read().strip()
        except OSError:
            name = None  # exited since NVML listed it: not a fault
        used = proc.usedGpuMemory
        out.append({"pid": int(proc.pid), "used_memory_bytes": None if used is None else int(used),
                    "name": name})
    return out


def _recovery_action(nv: Any, h: Any) -> str:
    field_id = getattr(nv, "NVML_FI_DEV_GET_GPU_RECOVERY_ACTION", None)
    if field_id is None:
        raise nv.NVMLError(nv.NVML_ERROR_NOT_SUPPORTED)
    value = nv.nvmlDeviceGetFieldValues(h, [field_id])[0]
    if value.nvmlReturn != nv.NVML_SUCCESS:
        raise nv.NVMLError(value.nvmlReturn)
    code = int(value.value.uiVal)
    return RECOVERY_ACTIONS.get(code, f"unknown({code})")


# --- the daemon's persistent worker (python -m gpuguard.sources.nvml_worker) ----------


def serve(commands: Any, out: Any, progress_path: str, procfs: str,
          xid_events: bool = True) -> None:
    """Answer `sweep` lines with the same JSON lines as the forked worker, ended by
    {"t": "end"}; keep NVML initialised between sweeps; retry nvmlInit while it fails
    (the driver may be loaded later). With xid_events, a thread waits for NVML Xid
    events and writes them as {"t": "xid_event", ...} lines as they happen."""
    progress = Progress(progress_path)
    progress.set(0, "import pynvml")
    import pynvml

    emit = _line_writer(out)
    initialised = False
    for command in commands:
        command = command.strip()
        if command == "quit":
            break
        if command != "sweep":
            emit({"t": "fatal", "kind": "BadCommand", "error": command[:80]})
            emit({"t": "end"})
            continue
        if not initialised:
            progress.set(0, "nvmlInit")
            try:
                pynvml.nvmlInit()
                initialised = True
            except pynvml.NVMLError as exc:
                emit({"t": "init_error", "kind": type(exc).__name__, "error": str(exc)})
            progress.set(0, "")
            if initialised and xid_events:
                threading.Thread(target=_xid_events, args=(pynvml, emit), daemon=True).start()
        if initialised:
            try:
                _sweep(pynvml, emit, progress, procfs)
                emit({"t": "done"})
            except Exception as exc:
                emit({"t": "fatal", "kind": type(exc).__name__, "error": str(exc)})
        emit({"t": "end"})
    if initialised:
        with contextlib.suppress(pynvml.NVMLError):
            pynvml.nvmlShutdown()


def _xid_events(nv: Any, emit: Callable[[dict[str, Any]], None]) -> None:
    """Xids as the driver raises them (nvmlEventSetWait), beside the kernel log."""
    try:
        event_set = nv.nvmlEventSetCreate()
        for index in range(nv.nvmlDeviceGetCount()):
            handle = nv.nvmlDeviceGetHandleByIndex(index)
            with contextlib.suppress(nv.NVMLError):
                nv.nvmlDeviceRegisterEvents(handle, nv.nvmlEventTypeXidCriticalError, event_set)
    except (nv.NVMLError, AttributeError) as exc:
        emit({"t": "xid_events_unavailable", "error": f"{type(exc).__name__}: {exc}"})
        return
    while True:
        try:
            data = nv.nvmlEventSetWait(event_set, 5000)
        except nv.NVMLError_Timeout:
            continue
        except nv.NVMLError as exc:
            emit({"t": "xid_events_unavailable", "error": f"{type(exc).__name__}: {exc}"})
            return
        try:
            pci = _text(nv.nvmlDeviceGetPciInfo(data.device).busId)
        except nv.NVMLError:
            pci = None
        emit({"t": "xid_event", "xid": int(data.eventData), "pci": pci, "time": time.time()})
