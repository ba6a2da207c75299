"""dcgm-exporter's series, for the dashboards and alert rules a fleet already runs (issue 33):
`gpuguard daemon --metrics-compat dcgm` (or the profile's `metrics_compat: dcgm`).

Names, types, help texts, units and labels are dcgm-exporter's, as its counters file and
collectors define them at DCGM_EXPORTER_COMMIT (the release 4.5.3-4.8.2); every value is
one gpuguard already read into the snapshot the gpuguard_* series are built from, and the
health status is the verdict's, not judged again. docs/metrics.md has the field-by-field
table (what differs, what is missing).

Rendered as text here, not through prometheus_client: its counters are exposed as
`<name>_total`, and dcgm-exporter's counters (DCGM_FI_DEV_PCIE_REPLAY_COUNTER, ...) have no
such suffix. Imported only when compat is on (gpuguard/daemon/metrics.py).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from gpuguard.model.derived import nvlink_totals
from gpuguard.model.results import Result, Status
from gpuguard.model.snapshot import GpuSnapshot, Snapshot

# NVIDIA/dcgm-exporter at the release these series follow: "DCGM-Exporter 4.5.3-4.8.2"
# (#656). The next commit, d5e5f51 (#655, not released), renames the label `Hostname` to
# `hostname`; the Grafana dashboard and the counters file are the same at both.
DCGM_EXPORTER_COMMIT = "691c927"
MIB = 1 << 20


@dataclass(frozen=True)
class Field:
    """One dcgm-exporter field: its name, Prometheus type and help text as its counters
    file writes them (`where`: the line at DCGM_EXPORTER_COMMIT), and how to get its value
    from one GPU's readings (None: not read, no series, as dcgm-exporter skips a blank)."""

    name: str
    kind: str
    help: str
    where: str
    value: Callable[[GpuSnapshot], float | None]


def _reading(attr: str, scale: Callable[[Any], float] = float) -> Callable[[GpuSnapshot],
                                                                           float | None]:
    def get(gpu: GpuSnapshot) -> float | None:
        reading = getattr(gpu, attr)
        if reading.is_ok and isinstance(reading.value, bool | int | float):
            return scale(reading.value)
        return None
    return get


def _mib(value: Any) -> float:
    return float(int(value) // MIB)


def _fb_free(gpu: GpuSnapshot) -> float | None:
    """NVML's v2 memory info, as DCGM reads it: total = free + used + reserved."""
    if not (gpu.memory_total_bytes.is_ok and gpu.memory_used_bytes.is_ok):
        return None
    reserved = gpu.memory_reserved_bytes.get() if gpu.memory_reserved_bytes.is_ok else 0
    return _mib(max(gpu.memory_total_bytes.get() - gpu.memory_used_bytes.get() - reserved, 0))


def _nvlink(counter: str) -> Callable[[GpuSnapshot], float | None]:
    def get(gpu: GpuSnapshot) -> float | None:
        total = nvlink_totals(gpu)[counter]
        return None if total is None else float(total)
    return get


CSV = "etc/default-counters.csv"
# (commented) marks a line the counters file ships commented out: a field dcgm-exporter
# defines and a fleet turns on by uncommenting it; gpuguard exports it since it reads it.
FIELDS: tuple[Field, ...] = (
    Field("DCGM_FI_DEV_SM_CLOCK", "gauge", "SM clock frequency (in MHz).", f"{CSV}:6",
          _reading("clock_sm_mhz")),
    Field("DCGM_FI_DEV_MEM_CLOCK", "gauge", "Memory clock frequency (in MHz).", f"{CSV}:7",
          _reading("clock_mem_mhz")),
    Field("DCGM_FI_DEV_MEMORY_TEMP", "gauge", "Memory temperature (in C).", f"{CSV}:10",
          _reading("memory_temperature_c")),
    Field("DCGM_FI_DEV_GPU_TEMP", "gauge", "GPU temperature (in C).", f"{CSV}:11",
          _reading("temperature_c")),
    Field("DCGM_FI_DEV_POWER_USAGE", "gauge", "Power draw (in W).", f"{CSV}:14",
          _reading("power_draw_w")),
    Field("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "counter", "Total number of PCIe retries.",
          f"{CSV}:20", _reading("pcie_replay_counter")),
    Field("DCGM_FI_DEV_GPU_UTIL", "gauge", "GPU utilization (in %).", f"{CSV}:23",
          _reading("utilization_gpu_percent")),
    Field("DCGM_FI_DEV_MEM_COPY_UTIL", "gauge", "Memory utilization (in %).", f"{CSV}:24",
          _reading("utilization_memory_percent")),
    Field("DCGM_FI_DEV_FB_FREE", "gauge", "Framebuffer memory free (in MiB).", f"{CSV}:45",
          _fb_free),
    Field("DCGM_FI_DEV_FB_USED", "gauge", "Framebuffer memory used (in MiB).", f"{CSV}:46",
          _reading("memory_used_bytes", _mib)),
    Field("DCGM_FI_DEV_FB_RESERVED", "gauge", "Framebuffer memory reserved (in MiB).",
          f"{CSV}:47", _reading("memory_reserved_bytes", _mib)),
    Field("DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", "counter",
          "Total number of single-bit volatile ECC errors.", f"{CSV}:50 (commented)",
          _reading("ecc_volatile_corrected")),
    Field("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "counter",
          "Total number of double-bit volatile ECC errors.", f"{CSV}:51 (commented)",
          _reading("ecc_volatile_uncorrected")),
    Field("DCGM_FI_DEV_ECC_SBE_AGG_TOTAL", "counter",
          "Total number of single-bit persistent ECC errors.", f"{CSV}:52 (commented)",
          _reading("ecc_aggregate_corrected")),
    Field("DCGM_FI_DEV_ECC_DBE_AGG_TOTAL", "counter",
          "Total number of double-bit persistent ECC errors.", f"{CSV}:53 (commented)",
          _reading("ecc_aggregate_uncorrected")),
    Field("DCGM_FI_DEV_RETIRED_SBE", "counter",
          "Total number of retired pages due to single-bit errors.", f"{CSV}:56 (commented)",
          _reading("retired_pages_sbe")),
    Field("DCGM_FI_DEV_RETIRED_DBE", "counter",
          "Total number of retired pages due to double-bit errors.", f"{CSV}:57 (commented)",
          _reading("retired_pages_dbe")),
    Field("DCGM_FI_DEV_RETIRED_PENDING", "counter",
          "Total number of pages pending retirement.", f"{CSV}:58 (commented)",
          _reading("retired_pages_pending")),
    Field("DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL", "counter",
          "Total number of NVLink flow-control CRC errors.", f"{CSV}:61 (commented)",
          _nvlink("crc_flit")),
    Field("DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL", "counter",
          "Total number of NVLink data CRC errors.", f"{CSV}:62 (commented)",
          _nvlink("crc_data")),
    Field("DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL", "counter",
          "Total number of NVLink retries.", f"{CSV}:63 (commented)", _nvlink("replay")),
    Field("DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL", "counter",
          "Total number of NVLink recovery errors.", f"{CSV}:64 (commented)",
          _nvlink("recovery")),
    Field("DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", "counter",
          "Number of remapped rows for uncorrectable errors", f"{CSV}:72",
          _reading("remapped_rows_uncorrectable")),
    Field("DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", "counter",
          "Number of remapped rows for correctable errors", f"{CSV}:73",
          _reading("remapped_rows_correctable")),
    Field("DCGM_FI_DEV_ROW_REMAP_FAILURE", "gauge", "Whether remapping of rows has failed",
          f"{CSV}:74", _reading("remapped_rows_failure")),
    # not a line of the counters file: the DCGM field (NVML's clocks event reasons bit
    # mask) that internal/pkg/collector/clock_events_collector.go:102 watches for
    # DCGM_EXP_CLOCK_EVENTS_COUNT; a fleet adds it to its counters file by this name
    Field("DCGM_FI_DEV_CLOCKS_EVENT_REASONS", "gauge",
          "Current clock event reasons (bitmask of NVML's clocks event reasons).",
          "internal/pkg/collector/clock_events_collector.go:102",
          _reading("clock_event_reasons")),
)

XID_ERRORS = Field("DCGM_FI_DEV_XID_ERRORS", "gauge",
                   "Value of the last XID error encountered.", f"{CSV}:29", lambda _: None)
# DCGM_EXP_GPU_HEALTH_STATUS (etc/default-counters.csv:41, commented; its collector:
# internal/pkg/collector/gpu_health_collector.go): one series per GPU and health watch,
# the value DCGM's dcgmHealthWatchResult_t (0 pass, 10 warn, 20 fail), labels health_watch
# and health_error_code (DCGM_FR_OK while it passes). Declared a counter by the file.
HEALTH = Field("DCGM_EXP_GPU_HEALTH_STATUS", "counter", "DCGM reported health status",
               f"{CSV}:41 (commented)", lambda _: None)
HEALTH_VALUE = {Status.OK: 0, Status.WARNING: 10, Status.CRITICAL: 20}

# gpuguard's rules by the DCGM health watch that covers the same fault, with the DCGM_FR
# code DCGM would name (gpu_health_collector.go's list); a failing rule without a code of
# its own names DCGM_FR_UNKNOWN. The watches PMU, MCU and SM, which gpuguard does not
# judge, have no series (dcgm-exporter's PASS there would be a claim nothing checked).
HEALTH_WATCH: dict[str, tuple[str, str]] = {
    "pcie.replays": ("PCIE", "DCGM_FR_PCIE_REPLAY_THRESHOLD_VIOLATION"),
    "pcie.link_gen": ("PCIE", "DCGM_FR_PCIE_GENERATION"),
    "pcie.link_width": ("PCIE", "DCGM_FR_PCIE_WIDTH"),
    "pcie.aer": ("PCIE", "DCGM_FR_UNKNOWN"),
    "pcie.bandwidth": ("PCIE", "DCGM_FR_LOW_BANDWIDTH"),
    "nvlink.state": ("NVLINK", "DCGM_FR_GPU_EXPECTED_NVLINKS_UP"),
    "nvlink.errors": ("NVLINK", "DCGM_FR_NVLINK_ERROR_THRESHOLD"),
    "nvlink.bandwidth": ("NVLINK", "DCGM_FR_LOW_BANDWIDTH"),
    "p2p.status": ("NVLINK", "DCGM_FR_BROKEN_P2P_NVLINK_MEMORY_DEVICE"),
    "fabric.state": ("NVLINK", "DCGM_FR_FABRIC_PROBE_STATE"),
    "ecc.uncorrected": ("MEM", "DCGM_FR_VOLATILE_DBE_DETECTED"),
    "ecc.corrected": ("MEM", "DCGM_FR_VOLATILE_SBE_DETECTED"),
    "ecc.mode": ("MEM", "DCGM_FR_ECC_DISABLED"),
    "memory.retired_pages": ("MEM", "DCGM_FR_PENDING_PAGE_RETIREMENTS"),
    "memory.row_remap": ("MEM", "DCGM_FR_ROW_REMAP_FAILURE"),
    "memory.pattern": ("MEM", "DCGM_FR_FAULTY_MEMORY"),
    "memory.bandwidth": ("MEM", "DCGM_FR_MEMORY_BANDWIDTH"),
    "thermal.margin": ("THERMAL", "DCGM_FR_TEMP_VIOLATION"),
    "memory.temperature": ("THERMAL", "DCGM_FR_TEMP_VIOLATION"),
    "clocks.sw_thermal": ("THERMAL", "DCGM_FR_CLOCK_THROTTLE_THERMAL"),
    "clocks.hw_slowdown": ("THERMAL", "DCGM_FR_CLOCK_THROTTLE_THERMAL"),
    "power.limit": ("POWER", "DCGM_FR_ENFORCED_POWER_LIMIT"),
    "clocks.power_cap": ("POWER", "DCGM_FR_CLOCK_THROTTLE_POWER"),
    "gsp.firmware": ("DRIVER", "DCGM_FR_UNKNOWN"),
    "persistence.mode": ("DRIVER", "DCGM_FR_PERSISTENCE_MODE"),
    "gpu.inforom": ("INFOROM", "DCGM_FR_CORRUPT_INFOROM"),
    # the GPU-wide faults DCGM reports under DCGM_HEALTH_WATCH_ALL (Xid 79, 95, ...)
    "xid.recent": ("ALL", "DCGM_FR_XID_ERROR"),
    "gpu.lost": ("ALL", "DCGM_FR_FALLEN_OFF_BUS"),
    "recovery.action": ("ALL", "DCGM_FR_UNKNOWN"),
}
# dcgm-exporter's err_msg for code 0 and for a code its table does not hold
# (internal/pkg/collector/xid_errors.go, gpu_collector.go:35)
NO_ERROR, UNKNOWN_ERROR = "No Error", "Unknown Error"


def gpu_labels(gpu: GpuSnapshot, snapshot: Snapshot) -> list[tuple[str, str]]:
    """dcgm-exporter's labels of a GPU series, in its order (render_metrics.go's
    gpuMetricsFormat): gpu, UUID, pci_bus_id, device, modelName, Hostname, then the label
    fields of the counters file (DCGM_FI_DRIVER_VERSION, etc/default-counters.csv:77)."""
    labels = [("gpu", str(gpu.index)), ("UUID", gpu.uuid.get_or("")),
              ("pci_bus_id", gpu.pci_bus_id.get_or("")), ("device", f"nvidia{gpu.index}"),
              ("modelName", gpu.name.get_or(""))]
    if snapshot.host.hostname:
        labels.append(("Hostname", snapshot.host.hostname))
    if snapshot.host.driver_version.is_ok:
        labels.append(("DCGM_FI_DRIVER_VERSION", snapshot.host.driver_version.get()))
    return labels


def render(snapshot: Snapshot, results: Iterable[Result],
           last_xids: Mapping[tuple[str, ...], int],
           xid_meaning: Callable[[int], str | None]) -> str:
    """The text of every compat family: `last_xids` holds the last Xid's code of each GPU
    (by its gpuguard labels: gpu, uuid, pci_bus_id), `xid_meaning` a code's text."""
    per_gpu = [(gpu, gpu_labels(gpu, snapshot)) for gpu in snapshot.gpus]
    out: list[str] = []
    for field in FIELDS:
        samples = [(labels, value) for gpu, labels in per_gpu
                   if (value := field.value(gpu)) is not None]
        _family(out, field, samples)
    xids = []
    for gpu, labels in per_gpu:
        code = last_xids.get(tuple(gpu.identity().labels()), 0)
        text = NO_ERROR if code == 0 else (xid_meaning(code) or UNKNOWN_ERROR)
        xids.append(([*labels, ("err_code", str(code)), ("err_msg", text)], float(code)))
    _family(out, XID_ERRORS, xids)
    _family(out, HEALTH, health_samples(per_gpu, results))
    return "".join(out)


def health_samples(per_gpu: list[tuple[GpuSnapshot, list[tuple[str, str]]]],
                   results: Iterable[Result]) -> list[tuple[list[tuple[str, str]], float]]:
    """Per GPU and watch, the worst of the verdict's results of the rules under it (a
    skipped or unknown result says nothing: a watch with only those has no series)."""
    worst: dict[tuple[tuple[str, ...], str], tuple[int, str]] = {}
    for result in results:
        covered = HEALTH_WATCH.get(result.rule)
        if result.gpu is None or covered is None or result.status not in HEALTH_VALUE:
            continue
        value = HEALTH_VALUE[result.status]
        key = (tuple(result.gpu.labels()), covered[0])
        code = covered[1] if value else "DCGM_FR_OK"
        if key not in worst or value > worst[key][0]:
            worst[key] = (value, code)
    samples = []
    for gpu, labels in per_gpu:
        mine = tuple(gpu.identity().labels())
        for (owner, watch), (value, code) in sorted(worst.items()):
            if owner == mine:
                samples.append(([*labels, ("health_watch", watch),
                                 ("health_error_code", code)], float(value)))
    return samples


def _family(out: list[str], field: Field,
            samples: list[tuple[list[tuple[str, str]], float]]) -> None:
    if not samples:
        return
    out.append(f"# HELP {field.name} {field.help}\n# TYPE {field.name} {field.kind}\n")
    for labels, value in samples:
        text = ",".join(f'{name}="{_escape(v)}"' for name, v in labels)
        number = str(int(value)) if value.is_integer() else repr(value)
        out.append(f"{field.name}{{{text}}} {number}\n")


def _escape(value: str) -> str:
    return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r'\"')
