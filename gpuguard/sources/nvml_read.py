"""Reading NVML: one sweep of every reading the rules use, written as JSON lines (the
snapshot's own JSON form). Runs only inside a worker process: the forked one of
`gpuguard check` (sources/nvml.py) or the daemon's persistent one (sources/nvml_worker.py),
never in the process that judges, so a call that hangs or crashes costs only the worker.
"""

from __future__ import annotations

import json
import os
import threading

from gpuguard.model.cuda_compat import NVML_BRANDS
from gpuguard.sources import nvml_bus, nvml_fake, nvml_multi
from gpuguard.sources.nvml_inforom import InforomValidity
from gpuguard.sources.nvml_p2p_kept import P2PKept, SweepPairs
from gpuguard.sources.nvml_progress import Progress

TYPE_CHECKING = False  # typing only for the checker: 5-7 ms of the worker's path
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

RECOVERY_ACTIONS = {0: "none", 1: "gpu_reset", 2: "node_reboot", 3: "drain_p2p",
                    4: "drain_and_reset", 5: "recover_imex_domain", 6: "bus_reset",
                    7: "system_reboot"}


def line_writer(out: Any) -> Callable[[dict[str, Any]], None]:
    """One JSON line per message, whole, from any of the per-GPU threads."""
    lock = threading.Lock()

    def emit(obj: dict[str, Any]) -> None:
        line = json.dumps(obj) + "\n"
        with lock:
            out.write(line)
            out.flush()

    return emit


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


def text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def sweep(nv: Any, emit: Callable[[dict[str, Any]], None], progress: Progress,
          procfs: str, link_counters: bool = True, inforom: InforomValidity | None = None,
          p2p_kept: P2PKept | None = None, sysfs: str | None = None) -> None:
    """Every reading of every GPU. Without `link_counters` the NVLink error counters are
    left out (None): `gpuguard check` never judges them, and they are most of an NVLink
    GPU's sweep (2-3 ms a call on an H200, four per link). `inforom`: the daemon's
    worker keeps each board's InfoROM validity for a slow interval (nvml_inforom.py);
    `p2p_kept`: and each pair's P2P status while its wiring holds (nvml_p2p_kept.py);
    `sysfs`: the bus's GPUs the list lacks are asked for by bus id (nvml_bus.py)."""
    emit = listing = nvml_bus.Listing(emit)
    read = _reader(nv, progress, 0)
    fake = nvml_fake.fake_library(nv)
    if fake is not None:
        emit(fake)
    count = read("nvmlDeviceGetCount", nv.nvmlDeviceGetCount)
    emit(
        {
            "t": "host",
            "driver_version": read(
                "nvmlSystemGetDriverVersion", lambda: text(nv.nvmlSystemGetDriverVersion())
            ),
            "nvml_version": read(
                "nvmlSystemGetNVMLVersion", lambda: text(nv.nvmlSystemGetNVMLVersion())
            ),
            "cuda_driver_version": read(
                "nvmlSystemGetCudaDriverVersion",
                lambda: cuda_version(nv.nvmlSystemGetCudaDriverVersion()),
            ),
            "gpu_count": count,
        }
    )
    progress.set(0, "")
    if not isinstance(count, int):
        return
    # One thread per GPU: NVML is thread-safe and most of a call's time is spent
    # waiting on the GPU, so an 8-GPU host costs about what one GPU costs.
    handles = nvml_multi.PeerHandles()  # each GPU's handle asked once a sweep, not once a peer
    pairs = p2p_kept.sweep(count) if p2p_kept is not None else None
    threads = [
        threading.Thread(target=_sweep_gpu,
                         args=(nv, emit, progress, procfs, index, count, link_counters,
                               inforom, (handles, pairs)),
                         daemon=True)
        for index in range(count)
    ]
    for thread in threads:
        thread.start()
    bus = nvml_bus.on_the_bus(sysfs, procfs)  # while the GPUs answer
    for thread in threads:
        thread.join()
    nvml_bus.look_up(nv, listing, progress, bus)


def _sweep_gpu(nv: Any, emit: Callable[[dict[str, Any]], None], progress: Progress,
               procfs: str, index: int, count: int, link_counters: bool,
               inforom: InforomValidity | None,
               peers: tuple[nvml_multi.PeerHandles, SweepPairs | None]) -> None:
    handles, pairs = peers
    slot = index + 1
    lost = [False]
    read = _reader(nv, progress, slot, lost)
    where = f" (GPU {index})"
    progress.set(slot, "nvmlDeviceGetHandleByIndex" + where)
    try:
        handle = nv.nvmlDeviceGetHandleByIndex(index)
    except nv.NVMLError as exc:
        failed = {"state": "error", "error": f"nvmlDeviceGetHandleByIndex: {exc}"}
        # a GPU NVML counts but cannot give a handle for (nvidia-smi's "Unable to determine
        # the device handle for GPU ...: Unknown Error"): gpu.lost names the error (issue
        # 36, item 3); not supported is no such answer
        refused = None if isinstance(exc, nv.NVMLError_NotSupported) else \
            f"nvmlDeviceGetHandleByIndex: {exc}"
        emit({"t": "gpu", "index": index, "uuid": failed, "pci_bus_id": failed,
              "gpu_lost": getattr(exc, "value", None) == nv.NVML_ERROR_GPU_IS_LOST,
              **({"handle_error": refused} if refused is not None else {})})
        if pairs is not None:
            pairs.settled(index)  # no wiring of it this sweep: its peers stop waiting
    else:
        handles.keep(index, handle)
        readings = _read_gpu(nv, handle, where, read, text, procfs, inforom)
        readings.update(_read_multi_gpu(nv, handle, where, read, index, count, link_counters,
                                        handles, (readings["uuid"], pairs)))
        emit({"t": "gpu", "index": index, **readings, "gpu_lost": lost[0]})
    progress.set(slot, "")


def _inforom_valid(nv: Any, h: Any) -> bool:
    """nvmlDeviceValidateInforom: the InfoROM's checksum holds (False: NVML says it is
    corrupted, a fact rather than a failed read)."""
    try:
        nv.nvmlDeviceValidateInforom(h)
    except nv.NVMLError as exc:
        if getattr(exc, "value", None) == nv.NVML_ERROR_CORRUPTED_INFOROM:
            return False
        raise
    return True


def _inforom_objects(nv: Any, h: Any) -> dict[str, Any]:
    """Each InfoROM object's version (OEM, ECC, power; one the board lacks is left out),
    and the objects whose read says the InfoROM is corrupted."""
    objects: dict[str, str] = {}
    corrupted: list[str] = []
    for name in ("oem", "ecc", "power"):
        try:
            objects[name] = text(nv.nvmlDeviceGetInforomVersion(
                h, getattr(nv, f"NVML_INFOROM_{name.upper()}")))
        except (nv.NVMLError_NotSupported, nv.NVMLError_FunctionNotFound):
            continue
        except nv.NVMLError as exc:
            if getattr(exc, "value", None) != nv.NVML_ERROR_CORRUPTED_INFOROM:
                raise
            corrupted.append(name)
    return {"objects": objects, "corrupted": corrupted}


def inforom(valid: Any, objects: Any) -> Any:
    """The `inforom` reading from its two calls: an error of either is the reading's; the
    validation not supported here is valid None."""
    for part in (valid, objects):
        if isinstance(part, dict) and part.get("state") == "error":
            return part
    if not isinstance(objects, dict) or "objects" not in objects:
        objects = {"objects": {}, "corrupted": []}
    return {"valid": valid if isinstance(valid, bool) else None, **objects}


def clock_event_reasons_call(nv: Any) -> str:
    """The binding's name of the clock event reasons call (also the qualify sampler's): the
    "throttle" name is the pre-12.x spelling of the same call."""
    reasons = "nvmlDeviceGetCurrentClocksEventReasons"
    return reasons if hasattr(nv, reasons) else "nvmlDeviceGetCurrentClocksThrottleReasons"


def cuda_version(raw: int) -> str:
    return f"{raw // 1000}.{(raw % 1000) // 10}"


def _read_gpu(
    nv: Any,
    h: Any,
    where: str,
    read: Callable[..., Any],
    text: Callable[[Any], str],
    procfs: str,
    inforom_kept: InforomValidity | None = None,
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
    dev("brand", "nvmlDeviceGetBrand", convert=lambda b: NVML_BRANDS.get(int(b), "unknown"))
    dev("compute_capability", "nvmlDeviceGetCudaComputeCapability",
        convert=lambda cc: f"{int(cc[0])}.{int(cc[1])}")
    dev("serial", "nvmlDeviceGetSerial", convert=text)
    dev("pci_bus_id", "nvmlDeviceGetPciInfo", convert=lambda info: text(info.busId))
    dev("vbios_version", "nvmlDeviceGetVbiosVersion", convert=text)
    dev("inforom_image_version", "nvmlDeviceGetInforomImageVersion", convert=text)
    def validate() -> Any:
        return read("nvmlDeviceValidateInforom", lambda: _inforom_valid(nv, h), where)

    g["inforom"] = inforom(
        inforom_kept.read(g["uuid"], validate) if inforom_kept is not None else validate(),
        read("nvmlDeviceGetInforomVersion", lambda: _inforom_objects(nv, h), where))
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

    dev("clock_event_reasons", clock_event_reasons_call(nv), convert=int)
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
        lambda: processes(nv.nvmlDeviceGetComputeRunningProcesses(h), procfs),
        where,
    )
    g["recovery_action"] = read("nvmlDeviceGetFieldValues", lambda: _recovery_action(nv, h), where)
    return g


def _read_multi_gpu(nv: Any, h: Any, where: str, read: Callable[..., Any], index: int,
                    count: int, link_counters: bool,
                    handles: nvml_multi.PeerHandles | None = None,
                    kept: tuple[Any, SweepPairs | None] = (None, None)) -> dict[str, Any]:
    """The readings of issue 11: NVLink, fabric, P2P, HBM temperature, application
    clocks, GSP firmware (see sources/nvml_multi.py for how each call is passed).
    `kept`: the UUID and the daemon's kept pairs (nvml_p2p_kept.py); P2P is read last (its
    key keeps its place), after the GPU's wiring is published, to give peers time."""
    g: dict[str, Any] = {
        "nvlink_links": nvml_multi.nvlink_links(nv, h, read, where, link_counters),
        **nvml_multi.fabric(nv, h, read, where),
        "p2p_status": None,
        "memory_temperature_c": read(
            "nvmlDeviceGetFieldValues",
            lambda: nvml_multi.field_value(nv, h, "NVML_FI_DEV_MEMORY_TEMP"),
            f"{where[:-1]}, NVML_FI_DEV_MEMORY_TEMP)"),
    }
    mem_max = nvml_multi.constant(nv, "NVML_TEMPERATURE_THRESHOLD_MEM_MAX", 2)
    g["memory_temperature_max_c"] = read(
        "nvmlDeviceGetTemperatureThreshold",
        lambda: int(nv.nvmlDeviceGetTemperatureThreshold(h, mem_max)), where)
    for name, call in (("clock_{}_app_mhz", "nvmlDeviceGetApplicationsClock"),
                       ("clock_{}_app_default_mhz", "nvmlDeviceGetDefaultApplicationsClock")):
        for domain, clock in (("sm", nv.NVML_CLOCK_SM), ("mem", nv.NVML_CLOCK_MEM)):
            fn = getattr(nv, call)
            g[name.format(domain)] = read(
                call, lambda fn=fn, clock=clock: int(fn(h, clock)), where)

    def gsp_version() -> str:
        version = text(nv.nvmlDeviceGetGspFirmwareVersion(h))
        if not version:  # GSP firmware not in use: nothing to name
            raise nv.NVMLError(nv.NVML_ERROR_NOT_SUPPORTED)
        return version

    g["gsp_firmware_version"] = read("nvmlDeviceGetGspFirmwareVersion", gsp_version, where)
    uuid, pairs = kept
    if pairs is not None:
        pairs.publish(index, uuid, g)
    g["p2p_status"] = nvml_multi.p2p_status(nv, h, read, index, count, handles, pairs)
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


def processes(raw: list[Any], procfs: str) -> list[dict[str, Any]]:
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
