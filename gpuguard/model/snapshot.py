"""The host snapshot: everything the rules may look at, and how each value was got (each
a `Reading`, gpuguard/model/reading.py: a value, not supported, or an error)."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any, TypeVar

from gpuguard.model import qualify_reading, readings
from gpuguard.model.identity import GpuId
from gpuguard.model.nvml_status import NvmlStatus as NvmlStatus
from gpuguard.model.nvml_status import nvml_status
from gpuguard.model.pci import normalise_pci

# Reading and Unavailable belong to the snapshot's vocabulary: importable from here too
from gpuguard.model.reading import Reading as Reading
from gpuguard.model.reading import Unavailable as Unavailable
from gpuguard.model.reading import Validated, reading_field

SCHEMA_VERSION = 1
SNAPSHOT_KIND = "gpuguard-snapshot"

@dataclass
class Process:
    pid: int
    used_memory_bytes: int | None
    # None when the process exited between NVML listing it and us reading /proc.
    name: str | None = None


@dataclass
class GpuSnapshot(Validated):
    index: int
    uuid: Reading[str] = reading_field(readings.text)
    name: Reading[str] = reading_field(readings.text)
    serial: Reading[str] = reading_field(readings.text)
    pci_bus_id: Reading[str] = reading_field(readings.text)
    vbios_version: Reading[str] = reading_field(readings.text)
    inforom_image_version: Reading[str] = reading_field(readings.text)
    # nvmlDeviceValidateInforom and the InfoROM object versions (shape: readings.inforom)
    inforom: Reading[dict[str, Any]] = reading_field(readings.inforom)
    persistence_mode: Reading[bool] = reading_field(readings.flag)
    mig_mode_current: Reading[bool] = reading_field(readings.flag)
    mig_mode_pending: Reading[bool] = reading_field(readings.flag)

    ecc_mode_current: Reading[bool] = reading_field(readings.flag)
    ecc_mode_pending: Reading[bool] = reading_field(readings.flag)
    ecc_volatile_corrected: Reading[int] = reading_field(readings.COUNT)
    ecc_volatile_uncorrected: Reading[int] = reading_field(readings.COUNT)
    ecc_aggregate_corrected: Reading[int] = reading_field(readings.COUNT)
    ecc_aggregate_uncorrected: Reading[int] = reading_field(readings.COUNT)
    ecc_volatile_dram_corrected: Reading[int] = reading_field(readings.COUNT)
    ecc_volatile_dram_uncorrected: Reading[int] = reading_field(readings.COUNT)
    ecc_volatile_sram_corrected: Reading[int] = reading_field(readings.COUNT)
    ecc_volatile_sram_uncorrected: Reading[int] = reading_field(readings.COUNT)
    ecc_aggregate_dram_corrected: Reading[int] = reading_field(readings.COUNT)
    ecc_aggregate_dram_uncorrected: Reading[int] = reading_field(readings.COUNT)
    ecc_aggregate_sram_corrected: Reading[int] = reading_field(readings.COUNT)
    ecc_aggregate_sram_uncorrected: Reading[int] = reading_field(readings.COUNT)

    retired_pages_sbe: Reading[int] = reading_field(readings.COUNT)
    retired_pages_dbe: Reading[int] = reading_field(readings.COUNT)
    retired_pages_pending: Reading[bool] = reading_field(readings.flag)
    remapped_rows_correctable: Reading[int] = reading_field(readings.COUNT)
    remapped_rows_uncorrectable: Reading[int] = reading_field(readings.COUNT)
    remapped_rows_pending: Reading[bool] = reading_field(readings.flag)
    remapped_rows_failure: Reading[bool] = reading_field(readings.flag)

    pcie_link_gen_current: Reading[int] = reading_field(readings.whole(1, 64))
    pcie_link_gen_max: Reading[int] = reading_field(readings.whole(1, 64))
    pcie_link_width_current: Reading[int] = reading_field(readings.whole(0, 64))
    pcie_link_width_max: Reading[int] = reading_field(readings.whole(1, 64))
    pcie_replay_counter: Reading[int] = reading_field(readings.COUNT)

    temperature_c: Reading[int] = reading_field(readings.CELSIUS)
    # Degrees left before T.Limit, the driver's own limit on its hottest sensor: it governs
    # throttling on current GPUs and is not temperature_c's distance to any threshold.
    temperature_tlimit_margin_c: Reading[int] = reading_field(readings.CELSIUS)
    temperature_slowdown_c: Reading[int] = reading_field(readings.CELSIUS)
    temperature_shutdown_c: Reading[int] = reading_field(readings.CELSIUS)
    temperature_gpu_max_c: Reading[int] = reading_field(readings.CELSIUS)

    power_draw_w: Reading[float] = reading_field(readings.WATTS)
    power_limit_enforced_w: Reading[float] = reading_field(readings.WATTS)
    power_limit_default_w: Reading[float] = reading_field(readings.WATTS)

    clock_event_reasons: Reading[int] = reading_field(readings.whole(0, 2**64 - 1))
    clock_sm_mhz: Reading[int] = reading_field(readings.MHZ)
    clock_mem_mhz: Reading[int] = reading_field(readings.MHZ)
    clock_sm_max_mhz: Reading[int] = reading_field(readings.MHZ)
    clock_mem_max_mhz: Reading[int] = reading_field(readings.MHZ)

    utilization_gpu_percent: Reading[int] = reading_field(readings.PERCENT)
    utilization_memory_percent: Reading[int] = reading_field(readings.PERCENT)
    memory_total_bytes: Reading[int] = reading_field(readings.COUNT)
    memory_used_bytes: Reading[int] = reading_field(readings.COUNT)
    # Memory the driver keeps for itself; NVML's v1 "used" counts it, nvidia-smi does not.
    memory_reserved_bytes: Reading[int] = reading_field(readings.COUNT)
    compute_processes: Reading[list[Process]] = reading_field(readings.processes)

    recovery_action: Reading[str] = reading_field(readings.text)

    # From sysfs: AER counters of the GPU and of each bridge above it up to the root port,
    # [{"address", "role": gpu|bridge|root_port, "correctable"|"fatal"|"nonfatal": {name: n}}].
    pcie_aer: Reading[list[dict[str, Any]]] = reading_field(readings.aer)

    # True when NVML answered "GPU is lost" for this GPU: it fell off the bus (as Xid 79).
    gpu_lost: Reading[bool] = reading_field(readings.flag)
    # the error nvmlDeviceGetHandleByIndex answered for this GPU (not "not supported"):
    # NVML counts it but cannot reach it (sources/nvml_read.py; gpu.lost)
    handle_error: Reading[str] = reading_field(readings.text)

    # Multi-GPU hosts (issue 11). NVLink, one entry per link: {"link": n, "up": bool,
    # "version": int|None, "remote_pci": str|None, "replay": int|None, "recovery": int|None,
    # "crc_flit": int|None, "crc_data": int|None}; not supported on a GPU without NVLink.
    nvlink_links: Reading[list[dict[str, Any]]] = reading_field(readings.nvlink_links)
    # GPU fabric (NVSwitch systems): state not_started | in_progress | completed; the
    # status NVML gives once completed ("Success" or the error); the clique id.
    fabric_state: Reading[str] = reading_field(readings.fabric_state)
    fabric_status: Reading[str] = reading_field(readings.text)
    fabric_clique_id: Reading[int] = reading_field(readings.whole(0, 2**32))
    # Peer-to-peer with every other GPU: {"peer": index, "read", "write", "nvlink",
    # "atomics": ok | chipset_not_supported | gpu_not_supported | topology_not_supported |
    # disabled_by_regkey | not_supported | unknown}.
    p2p_status: Reading[list[dict[str, Any]]] = reading_field(readings.p2p)
    # HBM temperature and the memory's maximum (NVML_FI_DEV_MEMORY_TEMP, THRESHOLD_MEM_MAX).
    memory_temperature_c: Reading[int] = reading_field(readings.CELSIUS)
    memory_temperature_max_c: Reading[int] = reading_field(readings.CELSIUS)
    # Application clocks in force and their defaults.
    clock_sm_app_mhz: Reading[int] = reading_field(readings.whole(0, 100_000))
    clock_mem_app_mhz: Reading[int] = reading_field(readings.whole(0, 100_000))
    clock_sm_app_default_mhz: Reading[int] = reading_field(readings.whole(0, 100_000))
    clock_mem_app_default_mhz: Reading[int] = reading_field(readings.whole(0, 100_000))
    gsp_firmware_version: Reading[str] = reading_field(readings.text)
    # What NVIDIA_REQUIRE_CUDA's brand= and arch= compare (image.cuda): cuda_compat's word
    brand: Reading[str] = reading_field(readings.text)
    compute_capability: Reading[str] = reading_field(readings.text)  # "9.0"

    # The active probe (gpuguard check --active, sources/active/; absent when it
    # did not run). probe_skipped: why it left this GPU alone ("" when it probed it).
    probe_skipped: Reading[str] = reading_field(readings.text)
    # {"error": text|None, "mismatches": n|None, "words": n|None, "phases_ms": {...},
    #  "elapsed_s": s}: the kernel's pattern read back, or the CUDA error that stopped it.
    probe_compute: Reading[dict[str, Any]] = reading_field(readings.probe_check)
    # {"error": text|None, "mismatches": n, "bytes": n}: walking ones and zeros read back.
    probe_pattern: Reading[dict[str, Any]] = reading_field(readings.probe_check)
    # {"h2d_gbps": GB/s, "d2h_gbps": GB/s, "bytes": n}: pinned copies, best of three.
    probe_pcie: Reading[dict[str, Any]] = reading_field(readings.probe_pcie)
    # Device-to-device copy, bytes read plus written, GB/s.
    probe_memory: Reading[float] = reading_field(readings.number(0, 1e6))
    # Peer copies with every other probed GPU: [{"peer": i, "access": bool|None,
    # "gbps": to it, "reverse_gbps": from it, "error"?: text}].
    probe_peers: Reading[list[dict[str, Any]]] = reading_field(readings.probe_peers)
    # `gpuguard qualify` (issue 29; absent when it did not run on this GPU: every qualify.*
    # rule is skipped): the level, a refusal, the drill, the error that stopped the run, the
    # model's targets, and the sections compute, memtest, bandwidth, peers and load, each
    # left out when not measured. The shape: gpuguard/model/qualify_reading.py.
    qualify: Reading[dict[str, Any]] = reading_field(qualify_reading.qualify)

    def identity(self) -> GpuId:
        """Which GPU this is (gpuguard.model.identity), from the readings that answered."""
        return GpuId(index=self.index,
                     uuid=self.uuid.value if self.uuid.is_ok else None,
                     pci_bus_id=self.pci_bus_id.value if self.pci_bus_id.is_ok else None,
                     serial=self.serial.value if self.serial.is_ok else None)

    def __post_init__(self) -> None:
        if isinstance(self.index, bool) or not isinstance(self.index, int) or \
                not 0 <= self.index < 1024:
            raise ValueError(f"GPU index must be a whole number 0..1023, not {self.index!r}")


@dataclass
class HostInfo(Validated):
    hostname: str = ""
    collected_at: float = 0.0
    # Which source produced the snapshot: nvml, nvidia-smi-xml, or a replayed snapshot's own.
    source: str = ""
    driver_version: Reading[str] = reading_field(readings.text)
    cuda_driver_version: Reading[str] = reading_field(readings.text)
    nvml_version: Reading[str] = reading_field(readings.text)
    gpu_count: Reading[int] = reading_field(readings.whole(0, 1024))

    # Kernel log summary (sources/kmsg.py: Xids, SXids, OOM kills, GSP lines, driver loads).
    kernel_log: Reading[dict[str, Any]] = reading_field(readings.kernel_log)
    # sources/gpu_devices.py: stuck processes, nvidia-uvm/peermem, RDMA (readings.gpu_devices)
    gpu_devices: Reading[dict[str, Any]] = reading_field(readings.gpu_devices)
    # procfs: the "NVRM version" of the loaded kernel module and which nvidia modules are loaded.
    kernel_module_version: Reading[str] = reading_field(readings.text)
    kernel_modules: Reading[list[str]] = reading_field(readings.text_list)
    # rootfs: /dev/nvidia* nodes present; sysfs: UEFI Secure Boot on.
    device_nodes: Reading[list[str]] = reading_field(readings.text_list)
    secure_boot: Reading[bool] = reading_field(readings.flag)
    # sysfs: the NVIDIA GPU functions on the PCI bus, whatever NVML lists (sources/pci_gpus.py):
    # [{"address", "class", "device", "driver" (the driver bound, or null)}]
    pci_gpus: Reading[list[dict[str, Any]]] = reading_field(readings.pci_gpus)
    # NVML asked by bus id for each of them bound to nvidia that its list lacks (the NVML
    # worker, sources/nvml_bus.py): [{"address", "state": found | not_found |
    # not_supported | error, "error"}]; absent when none was asked
    pci_handles: Reading[list[dict[str, Any]]] = reading_field(readings.mapping_list)
    persistenced_running: Reading[bool] = reading_field(readings.flag)
    # Container toolkit (sources/toolkit.py): CDI specs, nvidia-container-cli, nvidia-ctk, docker.
    cdi_specs: Reading[list[dict[str, Any]]] = reading_field(readings.mapping_list)
    container_cli: Reading[dict[str, Any]] = reading_field(readings.mapping)
    ctk_version: Reading[str] = reading_field(readings.text)
    docker: Reading[dict[str, Any]] = reading_field(readings.mapping)
    probe_image: Reading[dict[str, Any]] = reading_field(readings.mapping)
    # procfs: an nvidia-fabricmanager process runs on this host (issue 11).
    fabricmanager_running: Reading[bool] = reading_field(readings.flag)
    # Host resources (issue 14; the daemon, `check --host-resources`), from psutil:
    # {"total_bytes", "available_bytes", "swap_total_bytes", "swap_used_bytes"}.
    host_memory: Reading[dict[str, Any]] = reading_field(readings.host_memory)
    # statvfs of Docker's data root and the profile's disk_paths, one entry per path:
    # {"path", "role": docker|profile, "total_bytes", "free_bytes", "inodes_total",
    # "inodes_free"}, or {"path", "role", "error"} for a path that could not be read.
    disk_space: Reading[list[dict[str, Any]]] = reading_field(readings.disk_space)
    # The supervised services (daemon only, gpuguard/daemon/services.py): name -> {pids,
    # processes, rss_bytes, samples, headroom, answered_at (its first answer: the warm-up
    # starts there), inference {ok, timed_out, latency_s, ...}, ...} or {error}; absent when none
    # is configured (the service.* rules are skipped).
    services: Reading[dict[str, Any]] = reading_field(readings.mapping)
    # The GPUs the daemon saw since boot that this sweep does not list (daemon only,
    # gpuguard/assess/gpus_seen.py): [{"uuid", "pci_bus_id", "index", "name"}]; absent in
    # `check` and when NVML did not answer (which GPUs are there cannot be told then).
    gpus_missing: Reading[list[dict[str, Any]]] = reading_field(readings.mapping_list)
    # The images and Python environments image.cuda judges (sources/workloads.py)
    workloads: Reading[list[dict[str, Any]]] = reading_field(readings.mapping_list)

    def __post_init__(self) -> None:
        if not isinstance(self.hostname, str) or not isinstance(self.source, str):
            raise ValueError("hostname and source must be text")
        if isinstance(self.collected_at, bool) or \
                not isinstance(self.collected_at, int | float) or \
                not math.isfinite(self.collected_at):
            raise ValueError(f"collected_at must be a time, not {self.collected_at!r}")


@dataclass
class SourceRun:
    """How one source did in this snapshot: gpuguard_source_success{source} and
    gpuguard_source_duration_seconds{source}. Success: it answered in time and none of its
    readings is an error (not supported is not a failure)."""

    success: bool
    duration_s: float
    error: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {"success": self.success, "duration_s": round(self.duration_s, 4),
                "error": self.error}


@dataclass
class Snapshot:
    host: HostInfo = field(default_factory=HostInfo)
    nvml: NvmlStatus = field(default_factory=NvmlStatus)
    gpus: list[GpuSnapshot] = field(default_factory=list)
    schema: int = SCHEMA_VERSION
    sources: dict[str, SourceRun] = field(default_factory=dict)

    def gpu_ids(self) -> dict[int, GpuId]:
        """Each GPU's identity by index."""
        return {g.index: g.identity() for g in self.gpus}

    def gpu_at(self, bus_id: str | None) -> GpuSnapshot | None:
        """The GPU at this PCI address (in any of the forms the kernel log and NVML write
        it), if the snapshot has one."""
        if not bus_id:
            return None
        wanted = normalise_pci(bus_id)
        return next((g for g in self.gpus if g.pci_bus_id.is_ok
                     and normalise_pci(g.pci_bus_id.get()) == wanted), None)

    def record(self, source: str, started: float, readings: Any = (),
               error: str | None = None) -> None:
        """Note how `source` did: its time since `started` (monotonic) and whether any of
        `readings` is an error; `error` says it failed outright."""
        import time

        failed = [r for r in readings if isinstance(r, Reading) and r.state == "error"]
        if error is None and failed:
            error = failed[0].error
        self.sources[source] = SourceRun(error is None, time.monotonic() - started, error)

    def record_nvml(self) -> None:
        """How the NVML sweep went, as a source: it failed when NVML did not start, a call
        hung or the sweep stopped early."""
        nvml = self.nvml
        error = nvml.init_error or (f"hung in {nvml.hung_call}" if nvml.hung_call else None) \
            or nvml.sweep_error
        self.sources["nvml"] = SourceRun(error is None, nvml.elapsed_s or 0.0, error)

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": SNAPSHOT_KIND,
            "schema": self.schema,
            "host": _dataclass_to_json(self.host),
            "nvml": dataclasses.asdict(self.nvml),
            "gpus": [_dataclass_to_json(g) for g in self.gpus],
            "sources": {name: run.to_json() for name, run in sorted(self.sources.items())},
        }

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> Snapshot:
        if raw.get("kind") != SNAPSHOT_KIND:
            raise ValueError(f"not a gpuguard snapshot (kind is {raw.get('kind')!r})")
        schema = raw.get("schema")
        if schema != SCHEMA_VERSION:
            raise ValueError(
                f"snapshot schema {schema!r} is not supported "
                f"(this gpuguard reads {SCHEMA_VERSION})"
            )
        if not isinstance(raw.get("gpus", []), list):
            raise ValueError("gpus must be a list")
        host = from_json(HostInfo, raw.get("host", {}))
        nvml = nvml_status(raw.get("nvml", {}))
        gpus = [from_json(GpuSnapshot, g) for g in raw.get("gpus", [])]
        sources = raw.get("sources", {})
        if not isinstance(sources, dict) or not all(
                isinstance(v, dict) and isinstance(v.get("success"), bool) and
                isinstance(v.get("duration_s"), int | float) and
                isinstance(v.get("error"), str | None) for v in sources.values()):
            raise ValueError("sources must map a source to {success, duration_s, error}")
        # How the recorded host's sources did stays in the file: `sources` of a replay says
        # how this run's reads went (the input file, the roots named beside it).
        return cls(host=host, nvml=nvml, gpus=gpus, schema=schema)


GPU_READING_FIELDS: tuple[str, ...] = tuple(
    f.name for f in dataclasses.fields(GpuSnapshot) if f.name != "index"
)
HOST_READING_FIELDS: tuple[str, ...] = tuple(
    f.name
    for f in dataclasses.fields(HostInfo)
    if f.name not in ("hostname", "collected_at", "source")
)


def _dataclass_to_json(obj: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        if isinstance(value, Reading):
            if f.name == "compute_processes" and value.is_ok:
                out[f.name] = [dataclasses.asdict(p) for p in value.value or []]
            else:
                out[f.name] = value.to_json()
        else:
            out[f.name] = value
    return out


_T = TypeVar("_T")


def _processes(raw: Any) -> Reading[Any]:
    wrong = readings.processes(raw)
    if wrong is not None:
        return Reading.failed(f"invalid compute_processes ({wrong})")
    return Reading.ok([Process(pid=p["pid"], used_memory_bytes=p.get("used_memory_bytes"),
                               name=p["name"] if isinstance(p.get("name"), str) else None)
                       for p in raw])


def from_json(cls: type[_T], raw: dict[str, Any]) -> _T:
    """A HostInfo or GpuSnapshot from its JSON form (a saved snapshot, or a worker's line)."""
    if not isinstance(raw, dict):
        raise ValueError(f"a {cls.__name__} must be a mapping, not {type(raw).__name__}")
    known = {f.name: f for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    unknown = sorted(set(raw) - set(known))
    if unknown:
        raise ValueError(f"unknown {cls.__name__} fields: {', '.join(unknown)}")
    kwargs: dict[str, Any] = {}
    for name, raw_value in raw.items():
        if name in ("index", "hostname", "collected_at", "source"):
            kwargs[name] = raw_value
            continue
        reading = Reading.from_json(raw_value)
        if name == "compute_processes" and reading.is_ok:
            reading = _processes(reading.value)
        kwargs[name] = reading
    return cls(**kwargs)
