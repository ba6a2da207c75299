"""image.*: whether a workload's CUDA can run on this host (issue 24).

image.cuda judges each container image and Python environment of the `workloads`
reading (gpuguard/sources/workloads.py: `check --image`, `--python-env`, and the daemon's
supervised GPU variants) against the driver's version and CUDA version and the GPUs'
brand and compute capability, with gpuguard.model.cuda_fit (docs/image-cuda.md).

One result for the host, as the service.* rules give: its status is the worst
workload's, every workload is named in the message, and `observed.service_status` gives
each supervised service's own status (the supervisor counts only its own, and refuses a
failback to a GPU variant that cannot run: gpuguard/supervisor/image_gate.py).
"""

from __future__ import annotations

import re
from typing import Any

from gpuguard.judge.registry import CheckContext, Finding, host_check, skipped, unknown
from gpuguard.model import cuda_fit
from gpuguard.model.cuda_compat import NVML_BRANDS
from gpuguard.model.snapshot import GpuSnapshot

_DOTTED = re.compile(r"\d+(?:\.\d+)*")
_CAPABILITY = re.compile(r"\d+\.\d+")
NOTHING_ASKED = ("no image or Python environment to judge: `gpuguard check --image IMAGE` "
                 "or `--python-env PATH`; the daemon judges its supervised services' GPU "
                 "variants")


@host_check("image.cuda")
def cuda(ctx: CheckContext) -> Finding:
    host = ctx.snapshot.host
    if host.workloads.state == "absent":
        return skipped(NOTHING_ASKED)
    entries = host.workloads.get()
    if not entries:
        return skipped(NOTHING_ASKED)
    driver, version = host.driver_version.get(), host.cuda_driver_version.get()
    if not _DOTTED.fullmatch(driver) or not _DOTTED.fullmatch(version):
        return unknown(f"the driver reports version {driver!r} and CUDA {version!r}: "
                       "not versions to compare")
    facts = cuda_fit.Host(driver, version, tuple(_gpu(g) for g in ctx.snapshot.gpus))
    judged = [(entry, cuda_fit.judge(entry, facts)) for entry in entries]
    return _combine(judged, driver, version)


def _gpu(gpu: GpuSnapshot) -> cuda_fit.Gpu:
    """A GPU as the toolkit compares it; a value that is not one (a replay's odd brand, a
    capability that is no version) is not known, never judged as another."""
    brand = gpu.brand.get_or(None)
    arch = gpu.compute_capability.get_or(None)
    return cuda_fit.Gpu(gpu.index, brand if brand in NVML_BRANDS.values() else None,
                        arch if arch is not None and _CAPABILITY.fullmatch(arch) else None)


def _combine(judged: list[tuple[dict[str, Any], cuda_fit.Fit]], driver: str,
             version: str) -> Finding:
    worst = max((fit.status for _, fit in judged), key=lambda s: s.rank)
    ordered = sorted(judged, key=lambda pair: -pair[1].status.rank)
    services: dict[str, dict[str, Any]] = {}
    for entry, fit in judged:
        name = entry.get("service")
        if name is None:
            continue
        known = services.get(name)
        if known is None or fit.status.rank > known["rank"]:
            services[name] = {"rank": fit.status.rank, "status": fit.status.value,
                              "message": fit.message}
    observed: dict[str, Any] = {
        "driver_version": driver, "cuda_driver_version": version,
        "workloads": [{**{k: entry.get(k) for k in ("kind", "name", "service")},
                       "status": fit.status.value, "message": fit.message}
                      for entry, fit in judged]}
    if services:
        observed["service_status"] = {n: s["status"] for n, s in services.items()}
        observed["services"] = {n: {"message": s["message"]} for n, s in services.items()}
    return Finding(worst, "; ".join(_labelled(e, f) for e, f in ordered), observed)


def _labelled(entry: dict[str, Any], fit: cuda_fit.Fit) -> str:
    service = entry.get("service")
    return f"{service} ({fit.message})" if service else fit.message
