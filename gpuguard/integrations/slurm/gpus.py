"""Which GPUs a Slurm job holds, as NVML GPUs (docs/slurm.md#the-jobs-gpus).

- `SLURM_JOB_GPUS` (what Slurm gives a prolog and epilog) holds GRES indexes: with
  gres.conf's `File=/dev/nvidia[0-7]` (or AutoDetect), the device minor number of each
  GPU, which is not NVML's index (NVML numbers by PCI bus; minors follow the driver's probe
  order; nvidia-smi shows both). Each is mapped by the minor number the driver lists in
  `<procfs>/driver/nvidia/gpus/<bus>/information` ("Device Minor:"); one that maps to no
  GPU is unknown, never assumed to be the NVML index of the same number.
- `CUDA_VISIBLE_DEVICES` (a step's view, when SLURM_JOB_GPUS is not set): a GPU UUID (or
  a unique prefix of one, as CUDA takes it) by UUID; a plain number as NVML's index; a
  MIG instance (`MIG-...`) or anything else is unknown: gpuguard does not know its parent.

Unknown is said and not probed; the prolog passes (it cannot tell), never "no GPU".
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from gpuguard.io.bounded import BoundedReadError, read_text

if TYPE_CHECKING:
    from gpuguard.model.snapshot import Snapshot

INFO_MAX = 16 * 1024


@dataclass
class JobGpus:
    indexes: list[int] = field(default_factory=list)  # NVML indexes, sorted
    unknown: list[str] = field(default_factory=list)  # each: what and why
    given: str = ""  # the variable and its value ("" when the job has no GPU)


def device_minor(procfs: Path, bus_id: str) -> int | None:
    """The driver's minor number of the GPU at this bus id (None: not listed)."""
    name = bus_id[-12:].lower()  # NVML's 00000000:18:00.0 is the driver's 0000:18:00.0
    try:
        text = read_text(procfs / "driver" / "nvidia" / "gpus" / name / "information",
                         INFO_MAX, 2.0)
    except (OSError, BoundedReadError):
        return None
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "Device Minor" and value.strip().isdigit():
            return int(value.strip())
    return None


def _by_minor(items: list[str], snapshot: Snapshot, procfs: Path | None,
              found: JobGpus) -> None:
    minors: dict[int, int] = {}
    for gpu in snapshot.gpus:
        bus = gpu.pci_bus_id.get_or(None)
        minor = device_minor(procfs, bus) if procfs is not None and bus else None
        if minor is not None:
            minors[minor] = gpu.index
    for item in items:
        if item.isdigit() and int(item) in minors:
            found.indexes.append(minors[int(item)])
        else:
            found.unknown.append(f"GRES GPU {item!r}: no GPU with that device minor "
                                 "(procfs driver/nvidia/gpus/*/information)")


def _by_cuda_name(items: list[str], snapshot: Snapshot, found: JobGpus) -> None:
    uuids = {gpu.index: (gpu.uuid.get_or(None) or "").lower() for gpu in snapshot.gpus}
    for item in items:
        if item.isdigit() and int(item) in uuids:
            found.indexes.append(int(item))
            continue
        lowered = item.lower()
        match = [i for i, u in uuids.items() if lowered.startswith("gpu-") and u
                 and u.startswith(lowered)]
        if len(match) == 1:
            found.indexes.append(match[0])
        elif lowered.startswith("mig-"):
            found.unknown.append(f"{item}: a MIG instance (its GPU is not known here)")
        else:
            found.unknown.append(f"{item}: no GPU of this host by that index or UUID")


def job_gpus(env: dict[str, str], snapshot: Snapshot, procfs: Path | None) -> JobGpus:
    """The job's GPUs (see the module's doc)."""
    found = JobGpus()
    for name in ("SLURM_JOB_GPUS", "CUDA_VISIBLE_DEVICES"):
        text = (env.get(name) or "").strip()
        items = [p.strip() for p in text.split(",") if p.strip()]
        if not items or items == ["NoDevFiles"]:
            continue
        found.given = f"{name}={text[:200]}"
        if name == "SLURM_JOB_GPUS":
            _by_minor(items, snapshot, procfs, found)
        else:
            _by_cuda_name(items, snapshot, found)
        break
    found.indexes = sorted(set(found.indexes))
    return found
