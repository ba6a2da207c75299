"""What the active probe will do: its options, which GPUs it may touch (an idle GPU
only, unless forced) and the sizes of its buffers."""

from __future__ import annotations

from dataclasses import dataclass

TYPE_CHECKING = False
if TYPE_CHECKING:
    from gpuguard.model.snapshot import GpuSnapshot

MIB = 1 << 20
# The compute phase's buffer: enough words to cover many thread blocks, little to check.
COMPUTE_BYTES = 1 * MIB
# Walking ones and zeros: one 32-bit pattern per slice of the pattern buffer.
PATTERN_SLICES = 32
# Host to device and back: at most this much pinned host memory. Pinning costs about
# 0.4 ms per MiB on an H200 host and freeing it as much again (256 MiB: 150 ms of the
# first device run's 1.7 s), while 64 MiB already takes 1.2 ms per copy at Gen5 x16,
# long beside the copy's 10 us start.
PCIE_MAX_BYTES = 64 * MIB
# The pattern is compared in chunks against one chunk-sized expected block: building
# the whole expected buffer cost 80 ms per pass on a 2-core VM, the chunks under 10 ms.
CHECK_CHUNK = 1 * MIB
# Copies timed per measurement (the best of them, or their sum for event-timed copies).
REPEATS = 3
# Workers started before the NVML sweep is in (EarlyStart): at most this many GPUs.
MAX_EARLY = 64
# CUresult codes that say the GPU could not be had, not that it is broken: unknown.
CANNOT_TELL = (2, 46, 805)
# The lock that keeps one probe per host at a time, in the state dir (host_lock.py).
LOCK_FILE = "active-probe.lock"
# The rules the probe's readings feed: a failback needs each of them ok on every GPU of
# the service (skipped only where there is nothing to judge: no peer to copy with).
PROBE_RULES = ("gpu.compute", "memory.pattern", "memory.bandwidth", "pcie.bandwidth",
               "nvlink.bandwidth")
# The snapshot fields the probe fills for each GPU (gpuguard/model/snapshot.py).
FIELDS = ("probe_compute", "probe_pattern", "probe_pcie", "probe_memory", "probe_peers")


@dataclass
class ProbeOptions:
    force: bool = False
    deadline_s: float = 10.0
    bandwidth_bytes: int = 256 * MIB
    pattern_bytes: int = 64 * MIB
    # A GPU whose compute processes hold more than this share of its memory, or busier
    # than this, is left alone: the probe must never disturb a serving process.
    max_memory_percent: float = 10.0
    max_utilization_percent: float = 10.0
    # One probe per host at a time (host_lock.py): the lock file in the state dir
    lock_path: str | None = None


def options(settings: dict[str, float], force: bool = False, deadline_s: float | None = None,
            buffer_mib: int | None = None, pattern_mib: int | None = None) -> ProbeOptions:
    """The probe's options: what the command line gives, else the profile's active_probe
    section (`settings`), else the defaults."""
    opts = ProbeOptions(force=force)
    opts.deadline_s = deadline_s or settings.get("deadline_s", opts.deadline_s)
    opts.bandwidth_bytes = int(buffer_mib or settings.get("buffer_mib", 256)) * MIB
    opts.pattern_bytes = int(pattern_mib or settings.get("pattern_mib", 64)) * MIB
    opts.max_memory_percent = settings.get("max_memory_percent", opts.max_memory_percent)
    opts.max_utilization_percent = settings.get("max_utilization_percent",
                                                opts.max_utilization_percent)
    return opts


def skip_reason(gpu: GpuSnapshot, opts: ProbeOptions) -> str | None:
    """Why this GPU is not probed, or None. Unreadable usage is a reason: a GPU that
    might be serving is never touched."""
    if not gpu.pci_bus_id.is_ok:
        return f"its PCI bus id, which CUDA finds it by, was not read ({gpu.pci_bus_id.describe()})"
    if gpu.mig_mode_current.get_or(False):
        return "MIG is enabled: the probe runs on whole GPUs only"
    if opts.force:
        return None
    util = gpu.utilization_gpu_percent
    if not util.is_ok:
        return f"cannot tell whether it is busy: utilization {util.describe()}"
    if util.get() > opts.max_utilization_percent:
        return (f"busy: {util.get()} % utilization > {opts.max_utilization_percent:g} % "
                "(--active=force probes anyway)")
    procs = gpu.compute_processes
    if procs.is_ok and procs.get():
        # Any compute process is a reason, whatever it holds: an embedding model or a
        # reranker serves from a few GiB, and between requests its utilization reads 0.
        named = ", ".join(f"{p.pid} {p.name or '?'}" for p in procs.get()[:3])
        return (f"in use: {len(procs.get())} compute process(es) on it ({named}) "
                "(--active=force probes anyway)")
    total = gpu.memory_total_bytes
    if not total.is_ok or not total.get():
        return f"cannot tell how much memory is in use: memory total {total.describe()}"
    # No process listed (or the list not readable, as in some containers): memory in use
    # beyond the driver's reserve stands for a process NVML does not show.
    held = _held_bytes(gpu)
    if held is None:
        return "cannot tell how much memory compute processes hold"
    share = 100.0 * held / total.get()
    if share > opts.max_memory_percent:
        return (f"in use: compute processes hold {share:.0f} % of its memory > "
                f"{opts.max_memory_percent:g} % (--active=force probes anyway)")
    return None


def _held_bytes(gpu: GpuSnapshot) -> int | None:
    procs = gpu.compute_processes
    if procs.is_ok and all(p.used_memory_bytes is not None for p in procs.get()):
        return sum(p.used_memory_bytes or 0 for p in procs.get())
    # NVML does not always say what each process holds (containers): what is used beyond
    # the driver's own reserve stands for it.
    used = gpu.memory_used_bytes
    if not used.is_ok:
        return None
    return max(0, used.get() - gpu.memory_reserved_bytes.get_or(0))


@dataclass
class ProbeWorker:
    """One GPU's worker: its slot on the progress board, the GPU and its pid."""

    slot: int
    index: int
    bus_id: str
    pid: int = 0
