"""The `workloads` reading (issue 24): the CUDA facts of each container image and Python
environment asked for (`check --image`, `--python-env`; the daemon: each supervised
service's GPU variant), for image.cuda. A host source (gpuguard/sources/host.py): in
`check`'s forked host child, and in the daemon's slow cycle."""

from __future__ import annotations

from typing import Any

from gpuguard.io.paths import Paths
from gpuguard.model.snapshot import Reading
from gpuguard.model.workload import Workload


def read(workloads: tuple[Workload, ...], paths: Paths, timeout: float
         ) -> Reading[list[dict[str, Any]]]:
    """One entry per workload, in the order given; one that cannot be read says why in
    its own entry (the others are still judged)."""
    images = [w for w in workloads if w.kind == "image"]
    read_images: list[dict[str, Any]] = []
    if images:
        from gpuguard.sources import cuda_images

        read_images = cuda_images.read(images, paths, timeout)
    by_image = iter(read_images)
    entries: list[dict[str, Any]] = []
    for workload in workloads:
        if workload.kind == "image":
            entries.append(next(by_image))
        else:
            from gpuguard.sources import python_envs

            entries.append(python_envs.read(workload, timeout))
    return Reading.ok(entries)
