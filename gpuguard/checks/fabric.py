"""fabric.*: the GPU fabric of NVSwitch systems (HGX) and the fabric manager behind it.

Until the fabric completes, CUDA cannot create a context on the GPU ("system not yet
initialized"): a GPU that looks fine to every other rule serves nothing. A GPU without a
fabric (PCIe, or NVLink bridges without NVSwitch) says not supported: skipped.
"""

from __future__ import annotations

from typing import Any

from gpuguard.judge.registry import CheckContext, Finding, gpu_check, host_check, ok, skipped
from gpuguard.model.snapshot import GpuSnapshot

START_FM = "start nvidia-fabricmanager (systemctl start nvidia-fabricmanager)"


@gpu_check("fabric.state")
def state(gpu: GpuSnapshot, ctx: CheckContext) -> Finding:
    fabric = gpu.fabric_state.get()
    observed = {"state": fabric, "status": gpu.fabric_status.get_or(None),
                "clique_id": gpu.fabric_clique_id.get_or(None)}
    if fabric != "completed":
        words = fabric.replace("_", " ")
        return ctx.fail(f"GPU fabric {words}: CUDA cannot create a context on this GPU until "
                        f"it completes; {START_FM} on the host that owns the NVSwitches",
                        **observed)
    # Completed: the status says whether it succeeded. An unreadable status is unknown
    # (raised by .get()), never taken as success.
    status = gpu.fabric_status.get()
    if status.strip().lower() != "success":
        return ctx.fail(f"GPU fabric completed with status {status!r}: the GPU is not in the "
                        "NVLink fabric", **observed)
    return ok(f"GPU fabric completed ({status}, clique {observed['clique_id']})", **observed)


@host_check("fabric.manager")
def manager(ctx: CheckContext) -> Finding:
    states = {g.index: g.fabric_state for g in ctx.snapshot.gpus
              if g.fabric_state.state != "not_supported"}
    if not states:
        return skipped("no GPU has a GPU fabric (NVML: not supported): no fabric manager "
                       "needed")
    values = {index: reading.get() for index, reading in states.items()}
    waiting = sorted(index for index, value in values.items() if value != "completed")
    observed: dict[str, Any] = {"fabric_states": {str(k): v for k, v in values.items()}}
    if not waiting:
        # A completed fabric proves a fabric manager ran, here or on the host of this VM
        # (a passed-through HGX GPU has no nvidia-fabricmanager inside the guest).
        return ok("GPU fabric completed on every GPU: the fabric manager did its work "
                  "(here or on the hypervisor)", **observed)
    running = ctx.snapshot.host.fabricmanager_running.get()
    observed["fabricmanager_running"] = running
    gpus = ", ".join(f"GPU {i} {values[i].replace('_', ' ')}" for i in waiting)
    if running:
        return ok(f"nvidia-fabricmanager runs; fabric still initialising: {gpus} "
                  "(fabric.state judges it)", **observed)
    return ctx.fail(f"no nvidia-fabricmanager process and the GPU fabric is not complete "
                    f"({gpus}): {START_FM}; in a VM, start it on the hypervisor", **observed)
