"""persistence.*: the driver keeps GPUs initialised between clients (faster start, stable state).

Persistence mode (`nvidia-smi -pm`) is being retired for the nvidia-persistenced daemon,
so both are checked.
"""

from __future__ import annotations

from gpuguard.checks import CheckContext, Finding, gpu_check, host_check, ok, skipped
from gpuguard.snapshot import GpuSnapshot


@gpu_check("persistence.mode")
def mode(gpu: GpuSnapshot, ctx: CheckContext) -> Finding:
    if not gpu.persistence_mode.get():
        return ctx.fail("persistence mode is off: the driver tears the GPU down whenever the "
                        "last client exits", persistence_mode=False)
    return ok("persistence mode on", persistence_mode=True)


@host_check("persistence.daemon")
def daemon(ctx: CheckContext) -> Finding:
    gpus = ctx.snapshot.host.gpu_count.get_or(len(ctx.snapshot.gpus))
    if not gpus:
        return skipped("no GPU on this host")
    if ctx.snapshot.host.persistenced_running.get():
        return ok("nvidia-persistenced is running")
    return ctx.fail("nvidia-persistenced is not running: without it the driver tears each GPU "
                    "down when its last client exits (slow starts, lost state)",
                    persistenced_running=False)
