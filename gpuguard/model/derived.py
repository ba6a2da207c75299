"""Facts derived from a GPU's readings that more than one layer uses: computed here, once,
so that a check, the daemon's samples and the metrics never disagree (and no renderer
reaches into a check for them)."""

from __future__ import annotations

from typing import Any

from gpuguard.model.snapshot import GpuSnapshot, Process, Snapshot


def links_up(gpu: GpuSnapshot) -> int | None:
    """Links up on a GPU with a readable NVLink list; None otherwise."""
    if not gpu.nvlink_links.is_ok:
        return None
    return sum(1 for link in gpu.nvlink_links.get() if link["up"])


def expected_links(gpu: GpuSnapshot, snapshot: Snapshot, per_gpu: int | None
                   ) -> tuple[int, str]:
    """How many links should be up, and where that number comes from: the profile's
    `per_gpu`, or the most links up among this GPU's peers of the same model (itself
    included). The one place that decides it: nvlink.state and the metric use it."""
    if per_gpu is not None:
        return per_gpu, "the profile's nvlink_links_per_gpu"
    model = gpu.name.get_or(None)
    counts = [n for peer in snapshot.gpus
              if peer.name.get_or(None) == model and (n := links_up(peer)) is not None]
    peers = len(counts) - 1
    if peers <= 0:
        return max(counts, default=0), "no peer of the same model to compare with"
    return max(counts), f"the most up among its {peers} peer(s) of the same model"


NVLINK_COUNTERS = ("replay", "recovery", "crc_flit", "crc_data")


def nvlink_totals(gpu: GpuSnapshot) -> dict[str, int | None]:
    """Each NVLink error counter summed over the GPU's links: None where the GPU has no
    NVLink reading or no link gave that counter. The one sum history and metrics use."""
    if not gpu.nvlink_links.is_ok:
        return dict.fromkeys(NVLINK_COUNTERS)
    totals: dict[str, int | None] = {}
    for name in NVLINK_COUNTERS:
        values = [link[name] for link in gpu.nvlink_links.get() if link.get(name) is not None]
        totals[name] = sum(values) if values else None
    return totals


def aer_total(devices: list[dict[str, Any]], kind: str) -> int:
    """One kind of AER counts (correctable, nonfatal, fatal), summed over the GPU and the
    bridges above it."""
    return sum((device.get(kind) or {}).get("TOTAL", 0) for device in devices)


def held_by(gpu: GpuSnapshot, pids: set[int]) -> list[Process]:
    """The GPU's compute processes that belong to the service (NVML reports host PIDs)."""
    return [p for p in gpu.compute_processes.get() if p.pid in pids]


def missing_gpu_name(gpu: dict[str, Any]) -> str:
    """How a GPU that went missing is named: in gpu.count's message and in the names an
    ack of it covers (assess/gpus_seen.py)."""
    return f"GPU {gpu.get('index')} ({gpu.get('uuid') or 'no UUID'}, " \
           f"{gpu.get('pci_bus_id') or 'no bus id'})"
