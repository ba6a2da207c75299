"""Root paths, injectable as node_exporter does, so every source runs on fixture trees."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

# Defaults of the configuration files, here so that reading them costs no YAML import.
DEFAULT_PROFILE = Path("/etc/gpuguard/profile.yaml")
DEFAULT_USER_RULES_DIR = Path("/etc/gpuguard/rules.d")
DEFAULT_CONFIG = Path("/etc/gpuguard/gpuguard.yaml")


@dataclass(frozen=True)
class Paths:
    sysfs: Path = Path("/sys")
    procfs: Path = Path("/proc")
    rootfs: Path = Path("/")
