"""Sources fill a snapshot: live NVML, or a recorded file (snapshot JSON, nvidia-smi XML)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Paths:
    """Root paths, injectable as node_exporter does, so every source runs on fixture trees."""

    sysfs: Path = Path("/sys")
    procfs: Path = Path("/proc")
    rootfs: Path = Path("/")
