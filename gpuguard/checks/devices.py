"""devices.*: the GPU's device side outside NVML (sources/gpu_devices.py): processes stuck
in uninterruptible sleep holding /dev/nvidia*, and the nvidia-uvm and nvidia-peermem
modules with the device nodes they serve."""

from __future__ import annotations

from typing import Any

from gpuguard.judge.registry import (
    CheckContext,
    Finding,
    host_check,
    ok,
    skipped,
    unknown,
)
from gpuguard.model.snapshot import Snapshot

SHOWN_PIDS = 5  # the processes a message names; observed holds them all (up to 64)


def _part(snapshot: Snapshot, name: str) -> Any:
    """One part of the gpu_devices reading (raises Unavailable as .get() does); None when
    this input did not read it (a replay without that root)."""
    return snapshot.host.gpu_devices.get().get(name)


@host_check("devices.unkillable", thresholds=("min_stuck_s",))
def stuck_processes(ctx: CheckContext) -> Finding:
    stuck = _part(ctx.snapshot, "stuck")
    if stuck is None:
        return skipped("this input did not read the processes (no --path.procfs)")
    if "error" in stuck:
        return unknown(f"cannot tell: {stuck['error']}")
    limit = ctx.threshold("min_stuck_s")
    held = stuck["processes"]
    observed = {"processes": held, "more": stuck["more"], "unreadable": stuck["unreadable"],
                "min_stuck_s": limit}
    long = [p for p in held if p["off_cpu_s"] is not None and p["off_cpu_s"] >= limit]
    if long:
        return ctx.fail(_stuck_message(long, stuck["more"]), **observed)
    untimed = [p for p in held if p["off_cpu_s"] is None]
    if untimed:
        return unknown(f"{len(untimed)} process(es) in uninterruptible sleep hold GPU devices "
                       f"({_named(untimed[0])}); how long cannot be told here (no "
                       "/proc/PID/sched)", **observed)
    hidden = [p for p in stuck["unreadable"]
              if p["off_cpu_s"] is None or p["off_cpu_s"] >= limit]
    if hidden:
        return unknown(f"{len(hidden)} process(es) stuck in uninterruptible sleep whose files "
                       f"cannot be read here ({_named(hidden[0])}): whether they hold GPU "
                       "devices cannot be told (run as root)", **observed)
    briefly = f" ({len(held)} in it for less than {limit:g} s)" if held else ""
    return ok(f"no process stuck in uninterruptible sleep holds a GPU device{briefly}",
              **observed)


def _stuck_message(long: list[dict[str, Any]], beyond_the_list: int) -> str:
    """The processes stuck longer than the limit, the first SHOWN_PIDS named."""
    more = len(long) - SHOWN_PIDS + beyond_the_list
    names = "; ".join(_named(p) for p in long[:SHOWN_PIDS])
    return (f"{len(long) + beyond_the_list} process(es) stuck in uninterruptible sleep "
            f"holding GPU devices: {names}{f'; and {more} more' if more > 0 else ''}. They "
            "cannot be killed and keep the GPU from being reset")


def _named(p: dict[str, Any]) -> str:
    devices = ", ".join(p.get("devices") or [])
    held = f" holding {devices}" if devices else ""
    off = f" for {p['off_cpu_s']:g} s" if p["off_cpu_s"] is not None else ""
    return f"pid {p['pid']} ({p['comm'] or '?'}){held}{off}"


@host_check("devices.uvm")
def uvm(ctx: CheckContext) -> Finding:
    """nvidia-uvm loads on the first CUDA use (nvidia-modprobe), so it is judged only while
    a CUDA process runs, or always where the profile says `uvm: required` (containers
    cannot load it themselves). Its device node is judged where /dev was read; a /dev that
    could not be read leaves a required module unknown, and a live one that CUDA processes
    already use ok (they opened the node)."""
    modules = _part(ctx.snapshot, "modules")
    if modules is None:
        return skipped("this input did not read the loaded modules (no --path.sysfs)")
    state = modules.get("nvidia_uvm")
    required = ctx.profile.uvm_required
    running = _cuda_processes(ctx.snapshot)
    read = ctx.snapshot.host.device_nodes
    nodes = read.value if read.is_ok else None
    observed = {"state": state, "required": required, "cuda_processes": running,
                "nodes": None if nodes is None else [n for n in nodes
                                                     if n.startswith("nvidia-uvm")]}
    if str(state).startswith("unreadable"):
        return unknown(f"cannot tell whether nvidia-uvm is loaded: {state}", **observed)
    why = "the profile requires it (uvm: required)" if required else \
        f"{running} CUDA process(es) run" if running else None
    if why is None:
        if state in ("live", "builtin") or running == 0:
            return ok(f"nvidia-uvm is {state or 'not loaded'}, and not needed yet: it loads on "
                      "the first CUDA use", **observed)
        return skipped("the profile does not require nvidia-uvm and whether a CUDA process "
                       "runs cannot be read (NVML lists no processes here)", **observed)
    return _uvm_needed(ctx, why, observed)


def _uvm_needed(ctx: CheckContext, why: str, observed: dict[str, Any]) -> Finding:
    """nvidia-uvm where CUDA needs it (`why`): loaded, and its node present where /dev was
    read."""
    state, nodes = observed["state"], observed["nodes"]
    if state not in ("live", "builtin"):
        return ctx.fail(f"nvidia-uvm is {state or 'not loaded'} while {why}: CUDA cannot "
                        "start (cuInit fails) until it is", **observed)
    if nodes is None and observed["required"]:
        ctx.snapshot.host.device_nodes.get()  # /dev unread: the node cannot be vouched for
    if nodes is not None and "nvidia-uvm" not in nodes:
        return ctx.fail(f"nvidia-uvm is loaded but /dev/nvidia-uvm is missing while {why}: "
                        "CUDA cannot open it", **observed)
    where = "with /dev/nvidia-uvm" if nodes is not None else "(/dev not read here)"
    return ok(f"nvidia-uvm is loaded {where} ({why})", **observed)


def _cuda_processes(snapshot: Snapshot) -> int | None:
    """How many compute processes NVML lists over all GPUs; None where no GPU's list could
    be read (a container without the host's PID namespace, an older input)."""
    lists = [g.compute_processes.value for g in snapshot.gpus if g.compute_processes.is_ok]
    if not lists:
        return None
    return sum(len(listed or []) for listed in lists)


@host_check("devices.peermem")
def peermem(ctx: CheckContext) -> Finding:
    """GPUDirect RDMA through nvidia-peermem, only where the profile asks for it (the
    dma-buf route of newer kernels and open modules needs no module)."""
    if not ctx.profile.gpudirect_rdma:
        return skipped("the profile does not ask for GPUDirect RDMA (gpudirect_rdma: true)")
    modules = _part(ctx.snapshot, "modules")
    rdma = _part(ctx.snapshot, "rdma")
    if modules is None or rdma is None:
        return skipped("this input did not read the modules and /dev/infiniband "
                       "(--path.sysfs, --path.rootfs)")
    state = modules.get("nvidia_peermem")
    observed = {"state": state, "rdma_nodes": rdma}
    if str(state).startswith("unreadable"):
        return unknown(f"cannot tell whether nvidia-peermem is loaded: {state}", **observed)
    if state not in ("live", "builtin"):
        return ctx.fail(f"nvidia-peermem is {state or 'not loaded'}: GPUDirect RDMA falls back "
                        "to staging through host memory (or fails where NCCL requires it)",
                        **observed)
    if not rdma:
        return ctx.fail("nvidia-peermem is loaded but there is no RDMA device node "
                        "(/dev/infiniband/uverbs*): no NIC to do GPUDirect RDMA through",
                        **observed)
    return ok(f"nvidia-peermem is loaded, {len(rdma)} RDMA device node(s)", **observed)
