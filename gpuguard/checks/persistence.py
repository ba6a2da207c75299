"""persistence.*: the driver keeps GPUs initialised between clients (faster start, stable state).

Two things keep it up: the nvidia-persistenced daemon (the supported way) and the legacy
persistence mode (`nvidia-smi -pm 1`, being retired in its favour). Either one is enough:
while the mode is on for every GPU the driver stays initialised just the same (cloud and VM
images often run that way), so that host is healthy. A warning needs neither.
"""

from __future__ import annotations

from gpuguard.judge.registry import (
    CheckContext,
    Finding,
    gpu_check,
    host_check,
    ok,
    skipped,
    unknown,
)
from gpuguard.model.snapshot import GpuSnapshot


@gpu_check("persistence.mode")
def mode(gpu: GpuSnapshot, ctx: CheckContext) -> Finding:
    if gpu.persistence_mode.get():
        return ok("persistence mode on", persistence_mode=True)
    if ctx.snapshot.host.persistenced_running.get_or(False):
        return ok("persistence mode off, but nvidia-persistenced keeps the GPU initialised",
                  persistence_mode=False, persistenced_running=True)
    return ctx.fail("persistence mode is off and nvidia-persistenced is not known to run: the "
                    "driver tears the GPU down whenever the last client exits",
                    persistence_mode=False)


@host_check("persistence.daemon")
def daemon(ctx: CheckContext) -> Finding:
    host = ctx.snapshot.host
    gpus = host.gpu_count.get_or(len(ctx.snapshot.gpus))
    if not gpus:
        return skipped("no GPU on this host")
    if host.persistenced_running.state == "absent":
        host.persistenced_running.get()  # a replayed input without host state: skipped
    if host.persistenced_running.get_or(False):
        return ok("nvidia-persistenced is running")
    off = [g.index for g in ctx.snapshot.gpus if g.persistence_mode.get_or(None) is False]
    unread = [g.index for g in ctx.snapshot.gpus if not g.persistence_mode.is_ok]
    missing = gpus - len(ctx.snapshot.gpus)  # counted by the driver but not read at all
    if not off and not unread and missing <= 0:
        daemon_state = "is not running" if host.persistenced_running.is_ok \
            else f"could not be checked ({host.persistenced_running.describe()})"
        return ok(f"persistence mode is on for all {gpus} GPU(s), so the driver stays "
                  f"initialised; nvidia-persistenced {daemon_state} (it is the supported way, "
                  "the mode is being retired)", persistenced_running=host.persistenced_running
                  .get_or(None), persistence_mode_off=[])
    if off:
        host.persistenced_running.get()  # an unreadable daemon state: unknown, not a warning
        return ctx.fail(f"neither nvidia-persistenced nor persistence mode keeps GPU(s) "
                        f"{', '.join(map(str, off))} initialised: the driver tears each down "
                        "when its last client exits (slow starts, lost state)",
                        persistenced_running=False, persistence_mode_off=off)
    host.persistenced_running.get()
    what = ", ".join(f"GPU {i}" for i in unread) or f"{missing} GPU(s) the driver counts"
    return unknown(f"nvidia-persistenced is not running and the persistence mode of {what} "
                   "could not be read: cannot tell whether the driver stays initialised",
                   persistenced_running=False, persistence_mode_unread=unread)
