"""Root paths, injectable as node_exporter does, so every source runs on fixture trees."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

# Defaults of the configuration files, here so that reading them costs no YAML import.
DEFAULT_PROFILE = Path("/etc/gpuguard/profile.yaml")
DEFAULT_USER_RULES_DIR = Path("/etc/gpuguard/rules.d")
DEFAULT_CONFIG = Path("/etc/gpuguard/gpuguard.yaml")


def or_default(path: Path | None, default: Path) -> Path | None:
    """The file given, else the default one where it exists, else None."""
    if path is not None:
        return path
    return default if default.exists() else None


def rules_dirs_or_default(dirs: list[Path] | tuple[Path, ...]) -> list[Path]:
    if dirs:
        return list(dirs)
    return [DEFAULT_USER_RULES_DIR] if DEFAULT_USER_RULES_DIR.is_dir() else []


@dataclass(frozen=True)
class Paths:
    sysfs: Path = Path("/sys")
    procfs: Path = Path("/proc")
    rootfs: Path = Path("/")
