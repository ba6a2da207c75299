"""Read an `nvidia-smi -q -x` dump into a snapshot, for offline triage of bug reports.

Handles the DTDs of current drivers (v11 to v13): element names moved between them
(clocks_throttle_reasons became clocks_event_reasons, power_readings became
gpu_power_readings, absolute temperature thresholds became T.Limit-relative ones),
so each value is looked up under every name it has had. nvidia-smi prints `N/A`
or `[Not Supported]` for what a GPU does not offer: those are not_supported readings.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from collections.abc import Callable
from typing import Any, TypeVar

from gpuguard.model import clock_events
from gpuguard.model.snapshot import GpuSnapshot, HostInfo, NvmlStatus, Process, Reading, Snapshot

T = TypeVar("T")

_NOT_SUPPORTED = {"n/a", "[n/a]", "not supported", "[not supported]", "not available"}
_ERRORS = ("unknown error", "[unknown error]", "gpu is lost", "[gpu is lost]", "error")
_MIB = 1024 * 1024



class XmlDumpError(ValueError):
    pass


def parse(text: str, origin: str = "<input>") -> Snapshot:
    try:
        root = ET.fromstring(text)
    except ET.ParseError as exc:
        line, col = exc.position
        raise XmlDumpError(f"{origin}:{line}:{col}: not well-formed XML: {exc}") from exc
    if root.tag != "nvidia_smi_log":
        raise XmlDumpError(f"{origin}: root element is <{root.tag}>, not <nvidia_smi_log>")

    gpus = [_gpu(i, node) for i, node in enumerate(root.findall("gpu"))]
    host = HostInfo(
        hostname="",
        collected_at=0.0,
        source="nvidia-smi-xml",
        driver_version=_reading(root, ["driver_version"], str),
        cuda_driver_version=_reading(root, ["cuda_version"], str),
        nvml_version=Reading.not_supported("not in nvidia-smi -q -x output"),
        gpu_count=_reading(root, ["attached_gpus"], int),
    )
    return Snapshot(host=host, nvml=NvmlStatus(), gpus=gpus)


def _text(node: ET.Element, paths: list[str]) -> str | None:
    for path in paths:
        found = node.find(path)
        if found is not None and found.text is not None:
            return found.text.strip()
    return None


def _reading(node: ET.Element, paths: list[str], convert: Callable[[str], T]) -> Reading[T]:
    raw = _text(node, paths)
    if raw is None:
        return Reading()
    lowered = raw.lower()
    if lowered in _NOT_SUPPORTED:
        return Reading.not_supported()
    if lowered in _ERRORS:
        return Reading.failed(f"nvidia-smi reported {raw!r} for {paths[0]}")
    try:
        return Reading.ok(convert(raw))
    except ValueError:
        return Reading.failed(f"cannot read {raw!r} for {paths[0]}")


def _number(raw: str) -> float:
    match = re.match(r"^\s*(-?[0-9]+(?:\.[0-9]+)?)", raw)
    if not match:
        raise ValueError(raw)
    return float(match.group(1))


def _int(raw: str) -> int:
    return int(_number(raw))


def _mib_bytes(raw: str) -> int:
    return int(_number(raw) * _MIB)


def _enabled(raw: str) -> bool:
    lowered = raw.lower()
    if lowered in ("enabled", "yes", "active", "on"):
        return True
    if lowered in ("disabled", "no", "not active", "off"):
        return False
    raise ValueError(raw)


def _brand(raw: str) -> str:
    from gpuguard.model.cuda_compat import brand_of_smi

    word = brand_of_smi(raw)
    if word is None:  # a brand this gpuguard does not know: never judged as another
        raise ValueError(raw)
    return word


def _action(raw: str) -> str:
    return raw.strip().lower().replace(" ", "_")


def _inforom(g: ET.Element) -> Reading[dict[str, Any]]:
    """The InfoROM object versions nvidia-smi printed (its XML has no validation: `valid`
    stays None); an object it calls corrupted is named so."""
    if g.find("inforom_version") is None:
        return Reading()
    objects: dict[str, str] = {}
    corrupted: list[str] = []
    for name, tag in (("oem", "oem_object"), ("ecc", "ecc_object"), ("power", "pwr_object")):
        raw = _text(g, [f"inforom_version/{tag}"])
        if raw is None or raw.lower() in _NOT_SUPPORTED:
            continue
        if "corrupt" in raw.lower():
            corrupted.append(name)
        else:
            objects[name] = raw
    return Reading.ok({"valid": None, "objects": objects, "corrupted": corrupted})


def _gpu(index: int, g: ET.Element) -> GpuSnapshot:
    gpu = GpuSnapshot(index=index)
    gpu.uuid = _reading(g, ["uuid"], str)
    gpu.name = _reading(g, ["product_name"], str)
    gpu.brand = _reading(g, ["product_brand"], _brand)
    gpu.serial = _reading(g, ["serial"], str)
    gpu.pci_bus_id = _reading(g, ["pci/pci_bus_id"], str)
    if not gpu.pci_bus_id.is_ok and g.get("id"):
        gpu.pci_bus_id = Reading.ok(g.get("id", ""))
    gpu.vbios_version = _reading(g, ["vbios_version"], str)
    gpu.inforom_image_version = _reading(g, ["inforom_version/img_version"], str)
    gpu.inforom = _inforom(g)
    gpu.persistence_mode = _reading(g, ["persistence_mode"], _enabled)
    gpu.mig_mode_current = _reading(g, ["mig_mode/current_mig"], _enabled)
    gpu.mig_mode_pending = _reading(g, ["mig_mode/pending_mig"], _enabled)
    gpu.ecc_mode_current = _reading(g, ["ecc_mode/current_ecc"], _enabled)
    gpu.ecc_mode_pending = _reading(g, ["ecc_mode/pending_ecc"], _enabled)
    _ecc(gpu, g)

    gpu.retired_pages_sbe = _reading(
        g, ["retired_pages/multiple_single_bit_retirement/retired_count"], _int)
    gpu.retired_pages_dbe = _reading(g, ["retired_pages/double_bit_retirement/retired_count"], _int)
    gpu.retired_pages_pending = _reading(g, ["retired_pages/pending_retirement"], _enabled)
    gpu.remapped_rows_correctable = _reading(g, ["remapped_rows/remapped_row_corr"], _int)
    gpu.remapped_rows_uncorrectable = _reading(g, ["remapped_rows/remapped_row_unc"], _int)
    gpu.remapped_rows_pending = _reading(g, ["remapped_rows/remapped_row_pending"], _enabled)
    gpu.remapped_rows_failure = _reading(g, ["remapped_rows/remapped_row_failure"], _enabled)

    link = "pci/pci_gpu_link_info/"
    gpu.pcie_link_gen_current = _reading(g, [link + "pcie_gen/current_link_gen"], _int)
    gpu.pcie_link_gen_max = _reading(g, [link + "pcie_gen/max_link_gen"], _int)
    gpu.pcie_link_width_current = _reading(g, [link + "link_widths/current_link_width"], _int)
    gpu.pcie_link_width_max = _reading(g, [link + "link_widths/max_link_width"], _int)
    gpu.pcie_replay_counter = _reading(g, ["pci/replay_counter"], _int)

    _temperatures(gpu, g)

    power = ["gpu_power_readings/", "power_readings/"]
    # nvmlDeviceGetPowerUsage averages over one second on Ampere and newer: match it, so a
    # replayed dump judges what a live check would (instant draw swings past the limit).
    draw = ("average_power_draw", "power_draw", "instant_power_draw")
    gpu.power_draw_w = _reading(g, [p + k for p in power for k in draw], _number)
    gpu.power_limit_enforced_w = _reading(
        g, [p + k for p in power for k in ("current_power_limit", "enforced_power_limit")], _number)
    gpu.power_limit_default_w = _reading(g, [p + "default_power_limit" for p in power], _number)

    gpu.clock_event_reasons = _clock_event_reasons(g)
    gpu.clock_sm_mhz = _reading(g, ["clocks/sm_clock"], _int)
    gpu.clock_mem_mhz = _reading(g, ["clocks/mem_clock"], _int)
    gpu.clock_sm_max_mhz = _reading(g, ["max_clocks/sm_clock"], _int)
    gpu.clock_mem_max_mhz = _reading(g, ["max_clocks/mem_clock"], _int)

    gpu.utilization_gpu_percent = _reading(g, ["utilization/gpu_util"], _int)
    gpu.utilization_memory_percent = _reading(g, ["utilization/memory_util"], _int)
    gpu.memory_total_bytes = _reading(g, ["fb_memory_usage/total"], _mib_bytes)
    gpu.memory_used_bytes = _reading(g, ["fb_memory_usage/used"], _mib_bytes)
    gpu.memory_reserved_bytes = _reading(g, ["fb_memory_usage/reserved"], _mib_bytes)
    gpu.compute_processes = _processes(g)
    gpu.recovery_action = _reading(g, ["gpu_recovery_action"], _action)
    _multi_gpu(gpu, g)
    return gpu


def _fabric_state(raw: str) -> str:
    state = raw.strip().lower().replace(" ", "_")
    if state not in ("not_started", "in_progress", "completed"):
        raise ValueError(raw)
    return state


def _multi_gpu(gpu: GpuSnapshot, g: ET.Element) -> None:
    """Issue 11's readings that the dump has: fabric, application clocks, HBM
    temperature, GSP firmware (MIG modes are read above). Per-link NVLink state and
    counters and P2P status are not in `nvidia-smi -q -x`: they stay absent."""
    gpu.fabric_state = _reading(g, ["fabric/state"], _fabric_state)
    gpu.fabric_status = _reading(g, ["fabric/status"], str)
    gpu.fabric_clique_id = _reading(g, ["fabric/cliqueId", "fabric/clique_id"], int)
    # nvidia-smi names the SM/graphics domain "graphics_clock" here; on datacenter GPUs
    # they are one clock (1980 MHz on the H200, as NVML_CLOCK_SM reads it).
    for node, suffix in (("applications_clocks", "app_mhz"),
                         ("default_applications_clocks", "app_default_mhz")):
        setattr(gpu, f"clock_sm_{suffix}", _reading(g, [f"{node}/graphics_clock"], _int))
        setattr(gpu, f"clock_mem_{suffix}", _reading(g, [f"{node}/mem_clock"], _int))
    gpu.memory_temperature_c = _reading(g, ["temperature/memory_temp"], _int)
    # Older DTDs give the absolute memory maximum; v13 only its distance to T.Limit
    # (gpu_temp_max_mem_tlimit_threshold), from which no absolute value follows.
    gpu.memory_temperature_max_c = _reading(g, ["temperature/gpu_temp_max_mem_threshold"], _int)
    gpu.gsp_firmware_version = _reading(g, ["gsp_firmware_version"], str)


def _ecc(gpu: GpuSnapshot, g: ET.Element) -> None:
    for counter in ("volatile", "aggregate"):
        base = f"ecc_errors/{counter}/"
        sram_c = _reading(g, [base + "sram_correctable", base + "single_bit/sram"], _int)
        sram_u = _sum(
            _reading(g, [base + "sram_uncorrectable_parity"], _int),
            _reading(g, [base + "sram_uncorrectable_secded"], _int),
        )
        if sram_u.state == "absent":
            sram_u = _reading(g, [base + "sram_uncorrectable", base + "double_bit/sram"], _int)
        dram_c = _reading(g, [base + "dram_correctable", base + "single_bit/device_memory"], _int)
        dram_u = _reading(g, [base + "dram_uncorrectable", base + "double_bit/device_memory"], _int)
        total_c = _reading(g, [base + "single_bit/total"], _int)
        total_u = _reading(g, [base + "double_bit/total"], _int)
        if total_c.state == "absent":
            total_c = _sum(sram_c, dram_c)
        if total_u.state == "absent":
            total_u = _sum(sram_u, dram_u)
        setattr(gpu, f"ecc_{counter}_corrected", total_c)
        setattr(gpu, f"ecc_{counter}_uncorrected", total_u)
        setattr(gpu, f"ecc_{counter}_sram_corrected", sram_c)
        setattr(gpu, f"ecc_{counter}_sram_uncorrected", sram_u)
        setattr(gpu, f"ecc_{counter}_dram_corrected", dram_c)
        setattr(gpu, f"ecc_{counter}_dram_uncorrected", dram_u)


def _sum(*readings: Reading[int]) -> Reading[int]:
    ok = [r for r in readings if r.is_ok]
    if ok:
        return Reading.ok(sum(r.get() for r in ok))
    for r in readings:
        if r.state != "absent":
            return r
    return Reading()


def _temperatures(gpu: GpuSnapshot, g: ET.Element) -> None:
    gpu.temperature_c = _reading(g, ["temperature/gpu_temp"], _int)
    # Older DTDs give absolute thresholds. v13 gives them relative to T.Limit instead,
    # and T.Limit is measured on another, hotter sensor than gpu_temp: temperature plus
    # margin is no fixed limit (on one H200 it read 87 C idle and 81 C under load), so
    # no absolute threshold is derived from a v13 dump; the margin is kept as it is.
    gpu.temperature_slowdown_c = _reading(g, ["temperature/gpu_temp_slow_threshold"], _int)
    gpu.temperature_shutdown_c = _reading(g, ["temperature/gpu_temp_max_threshold"], _int)
    gpu.temperature_gpu_max_c = _reading(g, ["temperature/gpu_temp_max_gpu_threshold"], _int)
    gpu.temperature_tlimit_margin_c = _reading(g, ["temperature/gpu_temp_tlimit"], _int)


def _clock_event_reasons(g: ET.Element) -> Reading[int]:
    for section, prefix in (("clocks_event_reasons", "clocks_event_reason_"),
                            ("clocks_throttle_reasons", "clocks_throttle_reason_")):
        node = g.find(section)
        if node is None:
            continue
        mask = 0
        seen = False
        for child in node:
            name = child.tag.removeprefix(prefix)
            bit = clock_events.BITS.get(name)
            value = (child.text or "").strip().lower()
            if bit is None or value in _NOT_SUPPORTED:
                continue
            seen = True
            if value == "active":
                mask |= bit
        return Reading.ok(mask) if seen else Reading.not_supported()
    return Reading()


def _processes(g: ET.Element) -> Reading[list[Process]]:
    node = g.find("processes")
    if node is None:
        return Reading()
    procs: list[Process] = []
    for info in node.findall("process_info"):
        if (_text(info, ["type"]) or "C").upper() not in ("C", "C+G", "M", "M+C"):
            continue
        pid_text = _text(info, ["pid"])
        if pid_text is None or not pid_text.isdigit():
            continue
        used: Any = _reading(info, ["used_memory"], _mib_bytes)
        procs.append(Process(pid=int(pid_text), used_memory_bytes=used.value,
                             name=_text(info, ["process_name"])))
    return Reading.ok(procs)
