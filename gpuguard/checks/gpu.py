"""gpu.*: the GPUs the driver sees are the GPUs this host should have, each reachable and
each with an identity of its own."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from gpuguard.checks import not_probed
from gpuguard.judge.registry import (
    CheckContext,
    Finding,
    gpu_check,
    host_check,
    host_part,
    ok,
    unknown,
)
from gpuguard.model.derived import missing_gpu_name
from gpuguard.model.pci import normalise_pci
from gpuguard.model.snapshot import GpuSnapshot


@host_check("gpu.count")
def count(ctx: CheckContext) -> Finding:
    missing = ctx.snapshot.host.gpus_missing
    gone, moved = moved_off_nvidia(ctx, missing.get()) if missing.is_ok else ([], [])
    if gone:
        return _gone(ctx, gone, moved)
    seen = ctx.snapshot.host.gpu_count.get()
    if missing.state == "error" and ctx.profile.gpu_count is None:
        # the daemon's memory of the GPUs is lost (daemon/gpus_seen.py): fewer GPUs than
        # before cannot be told from a host that always had this many
        return unknown(f"{seen} GPU(s) listed; {missing.error}", gpu_count=seen)
    listed = len(ctx.snapshot.gpus)
    if listed != seen:
        # The driver's count and the GPUs listed disagree: a live sweep lists every GPU it
        # counted (unknown ones included), so this is an inconsistent input, not a count.
        return unknown(f"the driver counts {seen} GPU(s) but {listed} are listed: the "
                       "input is inconsistent", gpu_count=seen, listed=listed)
    on_bus = on_the_bus(ctx)
    if isinstance(on_bus, Finding):
        return on_bus
    note, bus = on_bus
    expected = ctx.profile.gpu_count
    if expected is None:
        if seen == 0:
            return ctx.fail(f"the driver sees no GPU{note}", gpu_count=seen, **bus)
        return ok(f"{seen} GPU(s) (no gpu_count in the profile to compare with){note}",
                  gpu_count=seen, **bus)
    if seen != expected:
        return ctx.fail(f"{seen} GPU(s) visible, the profile expects {expected}{note}",
                        gpu_count=seen, expected=expected, **bus)
    return ok(f"{seen} GPU(s), as the profile expects{note}", gpu_count=seen,
              expected=expected, **bus)


def on_the_bus(ctx: CheckContext) -> Finding | tuple[str, dict[str, Any]]:
    """The PCI bus against NVML's list (issue 36, item 2; sources/pci_gpus.py): critical
    naming each NVIDIA GPU bound to the nvidia driver that NVML does not list; the GPUs
    bound to another driver (vfio-pci) or to none, and those another container was given,
    are named in a note, not missing. Where sysfs was not read: no note and nothing
    observed, the rule as it was."""
    pci = ctx.snapshot.host.pci_gpus
    if not pci.is_ok:
        return "", {}
    listed = {normalise_pci(g.pci_bus_id.get()) for g in ctx.snapshot.gpus
              if g.pci_bus_id.is_ok}
    unread = len(listed) < len(ctx.snapshot.gpus)
    bus = bus_against_nvml(pci.get(), listed)
    missing = bus["not_listed"]
    if missing and unread:
        return unknown(f"{len(missing)} NVIDIA GPU(s) on the PCI bus may be missing from "
                       f"NVML ({', '.join(missing)}): the bus address of a listed GPU was "
                       "not read", gpu_count=len(ctx.snapshot.gpus), **bus)
    if missing:
        return ctx.fail(f"{len(missing)} NVIDIA GPU(s) on the PCI bus, bound to the nvidia "
                        f"driver, are not in NVML's list: {', '.join(missing)} (failed to "
                        "initialise or fell off the bus: see xid.recent and "
                        f"`dmesg | grep NVRM`){reached_by_bus_id(ctx, missing)}",
                        gpu_count=len(ctx.snapshot.gpus), **bus)
    others, elsewhere = bus["other_driver"], bus["not_this_container"]
    note = f"; not the nvidia driver's, not counted: {', '.join(others)}" if others else ""
    if bus["excluded"]:
        note += (f"; excluded by the driver (NVreg_ExcludedGpus), not counted: "
                 f"{', '.join(bus['excluded'])}")
    if elsewhere:
        note += (f"; not given to this container (not in /proc/driver/nvidia/gpus), not "
                 f"counted: {', '.join(elsewhere)}")
    return note, bus


def reached_by_bus_id(ctx: CheckContext, missing: list[str]) -> str:
    """The missing GPUs NVML gives a handle for when asked by bus id (sources/nvml_bus.py):
    reachable, yet not counted, which is a fault of its own."""
    handles = ctx.snapshot.host.pci_handles
    wanted = {normalise_pci(address) for address in missing}
    found = [h["address"] for h in handles.get_or([]) if h.get("state") == "found"
             and normalise_pci(str(h.get("address"))) in wanted]
    return f"; NVML reachable by bus id but not counted: {', '.join(found)}" if found else ""


def bus_against_nvml(on_bus: list[dict[str, Any]], listed: set[str]) -> dict[str, Any]:
    """The bus's GPUs sorted by what they are to NVML's list `listed` (normalised bus ids):
    every address, the nvidia driver's missing from the list, those of another driver or
    none, and those the driver's procfs does not show (another container's: a lost GPU
    stays listed there)."""
    unlisted, excluded = _unlisted(on_bus, listed)
    return {"on_bus": [g["address"] for g in on_bus],
            "not_listed": [g["address"] for g in unlisted
                           if g.get("in_driver_procfs") is not False],
            "excluded": [g["address"] for g in excluded],
            "other_driver": [f"{g['address']} ({g['driver'] or 'no driver'})" for g in on_bus
                             if g.get("driver") != "nvidia"],
            "not_this_container": [g["address"] for g in unlisted
                                   if g.get("in_driver_procfs") is False]}


def moved_off_nvidia(ctx: CheckContext, missing: list[dict[str, Any]],
                     ) -> tuple[list[dict[str, Any]], list[str]]:
    """The GPUs the daemon saw that are gone, less those now on the bus bound to another
    driver or excluded by the driver (a GPU handed to vfio-pci for a VM after boot, as
    libvirt's managed passthrough does: given away, not lost), which are named apart."""
    pci = ctx.snapshot.host.pci_gpus
    if not missing or not pci.is_ok:
        return missing, []
    away = {normalise_pci(g["address"]): g for g in pci.get()
            if g.get("driver") != "nvidia" or g.get("excluded") is True}
    still, moved = [], []
    for gpu in missing:
        address = gpu.get("pci_bus_id")
        found = away.get(normalise_pci(address)) if isinstance(address, str) else None
        if found is None:
            still.append(gpu)
        else:
            now = "excluded" if found.get("excluded") is True else \
                found.get("driver") or "no driver"
            moved.append(f"{missing_gpu_name(gpu)} now {now}")
    return still, moved


def _unlisted(on_bus: list[dict[str, Any]], listed: set[str],
              ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The bus's GPUs bound to nvidia that NVML does not list, and apart from them those
    the driver excludes (NVreg_ExcludedGpus: in its procfs, left out of NVML on purpose)."""
    unlisted = [g for g in on_bus
                if g.get("driver") == "nvidia" and normalise_pci(g["address"]) not in listed]
    return ([g for g in unlisted if g.get("excluded") is not True],
            [g for g in unlisted if g.get("excluded") is True])


def _gone(ctx: CheckContext, missing: list[dict[str, Any]],
          moved: list[str] | None = None) -> Finding:
    """GPUs the daemon saw since boot that NVML no longer lists (daemon/gpus_seen.py):
    fallen off the bus, unbound or taken away. Named, and the indexes they had, so that
    the supervisor moves only the services pinned to them."""
    names = [missing_gpu_name(gpu) for gpu in missing]
    indexes = [gpu["index"] for gpu in missing if isinstance(gpu.get("index"), int)]
    seen, expected = len(ctx.snapshot.gpus), ctx.profile.gpu_count
    against = f"; {seen} GPU(s) visible, the profile expects {expected}" \
        if expected is not None and expected != seen else ""
    when = "in an earlier boot" if any(g.get("earlier_boot") for g in missing) else \
        "since boot"
    given = f"; given to another driver, not counted: {'; '.join(moved)}" if moved else ""
    return ctx.fail(f"{len(missing)} GPU(s) seen {when} are gone: {'; '.join(names)}"
                    f"{against}{given}", missing=missing, names=names, gpus=indexes,
                    gpu_count=seen, expected=expected)


@gpu_check("gpu.lost")
def lost(gpu: GpuSnapshot, ctx: CheckContext) -> Finding:
    # NVML's "GPU is lost" is an answer, not a failure to get one: the driver knows the
    # GPU fell off the bus. Its other rules are unknown; this one says what is known.
    if gpu.handle_error.is_ok and refused_to_this_process(gpu.handle_error.get()):
        return unknown(f"NVML refuses this process the GPU's handle "
                       f"({gpu.handle_error.get()}): whether it is reachable cannot be told "
                       "from here (run as root, or where /dev/nvidia* may be opened)",
                       handle_error=gpu.handle_error.get())
    if gpu.handle_error.is_ok:
        # NVML counts the GPU but gives no handle for it, with an error that is not "not
        # supported" (issue 36, item 3): nothing of it can be read, which is the finding
        return ctx.fail(f"NVML cannot give this GPU's handle ({gpu.handle_error.get()}): "
                        "it is counted but cannot be reached (failed to initialise or fell "
                        "off the bus; see xid.recent)", gpu_lost=gpu.gpu_lost.get_or(None),
                        handle_error=gpu.handle_error.get())
    if gpu.gpu_lost.get():
        return ctx.fail("NVML says this GPU is lost: it has fallen off the bus (as Xid 79) "
                        "and answers no call", gpu_lost=True)
    return ok("the GPU answers NVML", gpu_lost=False)


@host_part("gpu.lost")
def lost_on_the_bus(ctx: CheckContext) -> Finding | None:
    """The GPUs on the PCI bus that NVML's list lacks, asked for by bus id (sources/
    nvml_bus.py): an error other than not found or not supported is NVML's answer that the
    GPU is there and cannot be reached, as a by-index handle error is (issue 36, item 3).
    One host result naming each bus id; none where no such answer came."""
    errors = [h for h in ctx.snapshot.host.pci_handles.get_or([])
              if h.get("state") == "error"]
    failed = [h for h in errors if not refused_to_this_process(str(h.get("error")))]
    if not failed:
        refused = [f"{h.get('address')} ({h.get('error')})" for h in errors]
        return unknown(f"NVML refuses this process the handle of GPU(s) on the PCI bus "
                       f"that it does not list: {'; '.join(refused)}") if refused else None
    names = [f"{h.get('address')} ({h.get('error')})" for h in failed]
    return ctx.fail(f"NVML cannot give the handle of {len(failed)} GPU(s) on the PCI bus "
                    f"that it does not list: {'; '.join(names)} (failed to initialise or "
                    "fell off the bus; see xid.recent and `dmesg | grep NVRM`)",
                    pci_bus_ids=[h.get("address") for h in failed],
                    handle_errors=[h.get("error") for h in failed], gpu_lost=True)


# NVML's answers that say this process may not ask (a /dev/nvidiaN it may not open: a
# device cgroup, a file mode, a Slurm step's ConstrainDevices), not that the GPU is gone
REFUSALS = ("insufficient permissions", "no permission")


def refused_to_this_process(error: str) -> bool:
    return any(word in error.lower() for word in REFUSALS)


@host_check("gpu.identity")
def identity(ctx: CheckContext) -> Finding:
    # Two GPUs reporting one UUID or one bus address would make every per-GPU result,
    # metric and history entry ambiguous: both are shown, and this says why.
    clashes = _clashes(ctx.snapshot.gpus)
    if not ctx.snapshot.gpus:
        return ok("no GPU to compare")
    if clashes:
        return ctx.fail("; ".join(clashes), clashes=clashes)
    # an empty UUID or address is no identity: it cannot show the GPUs apart either
    unread = [str(gpu.index) for gpu in ctx.snapshot.gpus
              if not (gpu.uuid.get_or("") and gpu.pci_bus_id.get_or(""))]
    nvml = ctx.snapshot.nvml
    if unread or nvml.hung_call or nvml.sweep_error:
        # An identity not read this time (or kept from the last sweep for a GPU that did
        # not answer) cannot show that the GPUs are distinct.
        who = f"GPU(s) {', '.join(unread)}" if unread else "the GPUs that did not answer"
        return unknown(f"cannot compare identities: the UUID or bus address of {who} "
                       "was not read this time", unread=unread)
    return ok(f"{len(ctx.snapshot.gpus)} GPU(s), each with its own UUID and bus address")


def _clashes(gpus: list[GpuSnapshot]) -> list[str]:
    """Each UUID, then each bus address, that more than one GPU reports, naming them."""
    clashes: list[str] = []
    for field_name in ("uuid", "pci_bus_id"):
        holders = _holders(gpus, field_name)
        clashes += [f"GPUs {', '.join(map(str, indexes))} all report {field_name} {value}"
                    for value, indexes in sorted(holders.items()) if len(indexes) > 1]
    return clashes


def _holders(gpus: list[GpuSnapshot], field_name: str) -> dict[str, list[int]]:
    """The GPUs reporting each value of `field_name` (uuid or pci_bus_id), compared in
    lower case; a value not read, or empty, names no GPU."""
    holders: dict[str, list[int]] = defaultdict(list)
    for gpu in gpus:
        reading = getattr(gpu, field_name)
        if reading.is_ok and reading.value:
            holders[reading.value.lower()].append(gpu.index)
    return holders


@gpu_check("gpu.compute")
def compute(gpu: GpuSnapshot, ctx: CheckContext) -> Finding:
    """The active probe's kernel: a GPU the driver reports healthy can still fail every
    kernel (a page fault leaves a server's /health at 200). A CUDA error on the way to
    the kernel (cuInit, the context, the launch) is the answer, named (cuda_api.ERRORS)."""
    gate = not_probed(gpu, "probe_compute")
    if gate is not None:
        return gate
    result = gpu.probe_compute.get()
    observed = {"phases_ms": result.get("phases_ms"), "elapsed_s": result.get("elapsed_s")}
    if result.get("error"):
        return ctx.fail(f"the GPU cannot run a kernel: {result['error']}",
                        error=result["error"], **observed)
    words, wrong = result.get("words"), result.get("mismatches")
    if wrong:
        return ctx.fail(f"a kernel's pattern read back wrong in {wrong} of {words} words",
                        mismatches=wrong, words=words, **observed)
    return ok(f"a kernel wrote {words} words and every one read back right",
              mismatches=0, words=words, **observed)


@gpu_check("gpu.inforom")
def inforom(gpu: GpuSnapshot, ctx: CheckContext) -> Finding:
    """The InfoROM holds the board's ECC, retirement and power records: NVML's validation
    (its checksum) says whether it is corrupted, and an object whose version read says so
    counts the same. A corrupted InfoROM is an RMA: no reset or reboot rewrites it."""
    state = gpu.inforom.get()
    image = gpu.inforom_image_version.get_or(None)
    observed = {"valid": state["valid"], "image": image, "objects": state["objects"],
                "corrupted": state["corrupted"]}
    if state["valid"] is False:
        return ctx.fail("the InfoROM is corrupted (nvmlDeviceValidateInforom)", **observed)
    if state["corrupted"]:
        return ctx.fail(f"the InfoROM is corrupted: reading its {', '.join(state['corrupted'])} "
                        "object version says so", **observed)
    versions = ", ".join(f"{k} {v}" for k, v in sorted(state["objects"].items()))
    read = f"image {image or '?'}" + (f"; {versions}" if versions else "")
    if state["valid"] is None:
        return ok(f"InfoROM versions read ({read}); NVML does not validate it here",
                  **observed)
    return ok(f"InfoROM valid ({read})", **observed)
