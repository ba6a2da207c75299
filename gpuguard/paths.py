"""Root paths, injectable as node_exporter does, so every source runs on fixture trees."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Paths:
    sysfs: Path = Path("/sys")
    procfs: Path = Path("/proc")
    rootfs: Path = Path("/")
