"""recovery.action: the driver's own verdict on what the GPU needs (newer drivers)."""

from __future__ import annotations

from gpuguard.judge.registry import CheckContext, Finding, gpu_check, ok, warning
from gpuguard.model.snapshot import GpuSnapshot

WHAT_TO_DO = {
    "gpu_reset": "drain the GPU's work and reset it (nvidia-smi -r -i <index>)",
    "node_reboot": "drain the node and reboot it",
    "drain_p2p": "stop peer-to-peer traffic to this GPU; it can keep serving alone",
    "drain_and_reset": "drain the GPU's work, then reset it",
    "bus_reset": "drain the node and reset the PCIe bus (reboot if unsure)",
    "system_reboot": "drain the node and reboot it",
    "recover_imex_domain": "recover the IMEX domain this GPU belongs to",
}


@gpu_check("recovery.action")
def action(gpu: GpuSnapshot, ctx: CheckContext) -> Finding:
    needed = gpu.recovery_action.get()
    if needed == "none":
        return ok("the driver asks for no recovery action", recovery_action=needed)
    todo = WHAT_TO_DO.get(needed, "see NVIDIA's XID catalog for this action")
    if needed == "drain_p2p":
        return warning(f"the driver asks for recovery action {needed}: {todo}",
                       recovery_action=needed)
    return ctx.fail(f"the driver asks for recovery action {needed}: {todo}",
                    recovery_action=needed)
