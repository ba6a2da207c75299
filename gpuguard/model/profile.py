"""The host profile as gpuguard holds it: what this machine should look like (loaded
from YAML by gpuguard.config.profile, which documents the file)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass
class Profile:
    path: Path | None = None
    gpu_count: int | None = None
    driver_min_version: str | None = None
    cuda_min_version: str | None = None
    vbios_allowed: dict[str, list[str]] = field(default_factory=dict)
    ecc_expected: bool | None = None
    # Seconds of kernel log in which an Xid counts; None: since boot.
    xid_window_s: float | None = None
    docker_required: bool = False
    # Links up on every GPU with NVLink; None: the most up among its peers of one model.
    nvlink_links_per_gpu: int | None = None
    p2p_require_nvlink: bool = False
    # The MIG mode every GPU must be in; None: any, as long as none is pending.
    mig_expected: bool | None = None
    # devices.uvm: nvidia-uvm loaded with its node even while no CUDA process runs (containers
    # cannot load it themselves); devices.peermem: GPUDirect RDMA through nvidia-peermem.
    uvm_required: bool = False
    gpudirect_rdma: bool = False
    status_page: bool = False  # the daemon's page at /, on a loopback listener
    # `dcgm`: the daemon also exports dcgm-exporter's series (gpuguard/outputs/metrics_dcgm)
    metrics_compat: str | None = None
    # host.disk: paths whose filesystems must keep free space (beside Docker's data root).
    disk_paths: list[Path] = field(default_factory=list)
    # active_probe: settings given (deadline_s, buffer_mib, pattern_mib, max_memory_percent,
    # max_utilization_percent) and GB/s floors by GPU model: {"pcie"|"memory"|"nvlink": x}
    probe_settings: dict[str, float] = field(default_factory=dict)
    probe_floors_gbps: dict[str, dict[str, float]] = field(default_factory=dict)
    # as written (each key knows its line): gpuguard.config.ruleset applies them, naming the line
    # (a gpuguard.config.yamlfile.Mapping; typed loosely so that the model stays below
    # the config layer, which is its only reader)
    rule_overrides: Any = None
