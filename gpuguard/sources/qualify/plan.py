"""What a qualify run does at each level, and the options its workers get."""

from __future__ import annotations

from dataclasses import dataclass, field

from gpuguard.sources.qualify.kernels import MASK64, PATTERN_ADDRESS, PATTERN_RANDOM

TYPE_CHECKING = False
if TYPE_CHECKING:
    from gpuguard.model.snapshot import GpuSnapshot

GIB = 1 << 30
MIB = 1 << 20
LEVELS = ("quick", "standard", "long")
# A slice: the longest one kernel launch may take. A stopping run waits for the launch
# in flight, so this bounds how fast SIGTERM frees the GPU (issue 29: within 1 s).
SLICE_S = 0.04
# The memory test allocates this share of the free memory it is told of (the rest is the
# driver's: the memory test's own buffers, the context, the allocator's rounding).
MEMTEST_FRACTION = 0.94
MEMTEST_CHUNK = 1 * GIB
# A GPU this busy, or with this share of its memory held by processes NVML does not list,
# is in use (the active probe's thresholds: docs/active-probe.md).
BUSY_PERCENT = 10
BUSY_MEMORY_SHARE = 0.10


@dataclass(frozen=True)
class Level:
    """What one level runs: `burn_s` of full tensor-core load (every result verified),
    the memory test's patterns over `memtest_bytes` (None: ~94 % of the free memory),
    then the copies. `ramp_s`: the start of the burn left out of power and clocks."""

    name: str
    burn_s: float
    ramp_s: float
    memtest_rounds: int
    memtest_bytes: int | None
    deadline_s: float

    def describe(self, burn_s: float | None = None) -> str:
        memory = ("most of the free memory" if self.memtest_bytes is None
                  else f"{self.memtest_bytes >> 20} MiB")
        load = self.burn_s if burn_s is None else burn_s
        return (f"{load:g} s of bf16 tensor-core load with every result verified, "
                f"a memory test of {memory} ({2 + 2 * self.memtest_rounds} patterns), "
                "host/device/peer copies")


LEVEL_TABLE = {
    # about today's probe: seconds, a taste of each part
    "quick": Level("quick", burn_s=3.0, ramp_s=1.0, memtest_rounds=1,
                   memtest_bytes=1 * GIB, deadline_s=60.0),
    # the return-to-service gate: under a minute on an H200
    "standard": Level("standard", burn_s=35.0, ramp_s=3.0, memtest_rounds=2,
                      memtest_bytes=None, deadline_s=120.0),
    # before an RMA is closed, after a repair: minutes of heat
    "long": Level("long", burn_s=420.0, ramp_s=5.0, memtest_rounds=8,
                  memtest_bytes=None, deadline_s=600.0),
}


def patterns(rounds: int, seed: int) -> list[tuple[int, int]]:
    """(kind, seed) per memory-test pass: address-in-address and its complement, then
    `2 * rounds` seeded random patterns (their seeds derived from the run's)."""
    out = [(PATTERN_ADDRESS, 0), (PATTERN_ADDRESS, MASK64)]
    for k in range(2 * rounds):
        out.append((PATTERN_RANDOM, (seed * 0x2545F4914F6CDD1D + k * 0x9E3779B9) & MASK64))
    return out


@dataclass
class QualifyOptions:
    """Everything a worker needs (sent to it as JSON)."""

    level: str = "standard"
    burn_s: float = 35.0
    slice_s: float = SLICE_S
    blocks_per_sm: int = 4
    memtest_bytes: int | None = None
    memtest_fraction: float = MEMTEST_FRACTION
    patterns: list[tuple[int, int]] = field(default_factory=list)
    copy_bytes: int = 256 * MIB
    device_copy_bytes: int = 1 * GIB
    flip_sm: int | None = None
    seed: int = 1
    deadline_s: float = 120.0


def options(level: str, seed: int, burn_s: float | None = None,
            flip_sm: int | None = None) -> QualifyOptions:
    spec = LEVEL_TABLE[level]
    return QualifyOptions(level=level, burn_s=spec.burn_s if burn_s is None else burn_s,
                          memtest_bytes=spec.memtest_bytes,
                          patterns=patterns(spec.memtest_rounds, seed), flip_sm=flip_sm,
                          seed=seed, deadline_s=spec.deadline_s + (
                              0.0 if burn_s is None else max(0.0, burn_s - spec.burn_s)),
                          copy_bytes=(64 if level == "quick" else 256) * MIB,
                          device_copy_bytes=(256 * MIB if level == "quick" else GIB))


def refusal(gpu: GpuSnapshot) -> str | None:
    """Why qualify will not touch this GPU, or None. Unlike the probe there is no force:
    a qualify run takes all of a GPU's memory and power for a minute, so a GPU any process
    holds is refused, and one whose use cannot be told is refused too."""
    if not gpu.pci_bus_id.is_ok:
        return f"its PCI bus id, which CUDA finds it by, was not read ({gpu.pci_bus_id.describe()})"
    if gpu.mig_mode_current.get_or(False):
        return "MIG is enabled: qualify runs on whole GPUs only"
    procs = gpu.compute_processes
    if procs.is_ok and procs.get():
        named = ", ".join(f"pid {p.pid} ({p.name or '?'})" for p in procs.get()[:4])
        more = f" and {len(procs.get()) - 4} more" if len(procs.get()) > 4 else ""
        return f"held by {len(procs.get())} compute process(es): {named}{more}"
    util = gpu.utilization_gpu_percent
    if not util.is_ok:
        return f"cannot tell whether it is busy: utilization {util.describe()}"
    if util.get() > BUSY_PERCENT:
        return f"busy: {util.get()} % utilization with no process NVML lists"
    used, total = gpu.memory_used_bytes, gpu.memory_total_bytes
    if not used.is_ok or not total.is_ok or not total.get():
        return "cannot tell how much of its memory is in use"
    held = max(0, used.get() - gpu.memory_reserved_bytes.get_or(0))
    if held > BUSY_MEMORY_SHARE * total.get():
        return (f"{held >> 20} MiB of its memory is in use by processes NVML does not list "
                "(another container?)")
    return None
