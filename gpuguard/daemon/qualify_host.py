"""The daemon's side of `failback_probe: qualify` (supervisor/qualify_gate.py): the host a
qualification runs on is the daemon's own, so qualify gets the daemon's host options
(--path.*, --kmsg-file, --profile, --rules; --state-dir is detached.launch's), and the
gate sees the GPUs of the daemon's last NVML sweep: who each one is (UUID and serial,
what the qualify events name) and whether qualify would take it now."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from gpuguard.daemon.settings import DaemonConfig
from gpuguard.model.snapshot import Snapshot
from gpuguard.supervisor.qualify_gate import GpuNow, QualifyHost


def qualify_host_of(cfg: DaemonConfig, state_dir: Path | None, boot_id: str | None,
                    procfs: str, current: Callable[[], tuple[Any, Snapshot | None]]
                    ) -> QualifyHost | None:
    """None where nothing can be qualified: a replayed --input (its GPUs are not this
    host's) or no state dir. `procfs` is the root host_paths looked up; `current` is
    Daemon.current (the rules, the last sweep)."""
    if cfg.input_path is not None or state_dir is None:
        return None
    inputs = cfg.inputs
    args: list[str] = []
    for flag, value in (("--path.sysfs", inputs.sysfs), ("--path.procfs", inputs.procfs),
                        ("--path.rootfs", inputs.rootfs), ("--kmsg-file", inputs.kmsg_file),
                        ("--profile", inputs.profile_path)):
        if value is not None:
            args += [flag, str(value)]
    for folder in inputs.rules_dirs:
        args += ["--rules", str(folder)]
    return QualifyHost(state_dir=state_dir, procfs=Path(procfs),
                       boot_id=boot_id, args=tuple(args),
                       gpus=lambda: gpus_now(current()[1]))


def gpus_now(snapshot: Snapshot | None) -> list[GpuNow]:
    """Each GPU of the sweep, and why qualify would refuse it now (a compute process on
    it, use that cannot be told, MIG): the gate starts no run on a GPU that serves."""
    if snapshot is None:
        return []
    from gpuguard.sources.qualify.plan import refusal

    return [GpuNow(g.index, g.uuid.get_or(None), g.serial.get_or(None), refusal(g))
            for g in snapshot.gpus]
