"""Disk space source: free space and inodes where models and images live (host.disk).

Docker's data root as the engine reports it (`DockerRootDir` of `docker info`, asked on
the configured socket under the deadline), else /var/lib/docker where it exists, and the
profile's `disk_paths` (the model cache, ...). Every statvfs runs under the source's
deadline in a thread of its own (gpuguard/io/deadline.py): a dead NFS mount makes
its own path unknown, never the cycle stuck. Paths are the host's, read under
`--path.rootfs`.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from gpuguard.io import deadline
from gpuguard.model.snapshot import Reading

DEFAULT_DOCKER_ROOT = "/var/lib/docker"


def read(rootfs: Path, disk_paths: tuple[Path, ...], docker: bool,
         timeout_s: float) -> Reading[list[dict[str, Any]]]:
    """One entry per path: Docker's data root first (role docker), then the profile's
    paths (role profile); a path that could not be read has an `error` instead of sizes."""
    wanted: list[tuple[str, str]] = []
    failed: list[dict[str, Any]] = []
    root, why = docker_root(rootfs, timeout_s) if docker else (None, None)
    if root is None and _exists(rootfs, DEFAULT_DOCKER_ROOT, timeout_s):
        root = DEFAULT_DOCKER_ROOT  # no engine to ask (or it did not answer): the default
    if root is not None:
        wanted.append((root, "docker"))
    elif why is not None:
        failed.append({"path": "docker data root", "role": "docker",
                       "error": f"{why}; {DEFAULT_DOCKER_ROOT} does not exist"})
    for extra in disk_paths:
        if str(extra) not in (p for p, _ in wanted):
            wanted.append((str(extra), "profile"))
    answers = deadline.call_all(
        {f"statvfs:{_under(rootfs, name)}": _statvfs_of(_under(rootfs, name))
         for name, _ in wanted}, timeout_s)
    entries: list[dict[str, Any]] = []
    for path, role in wanted:
        answer = answers[f"statvfs:{_under(rootfs, path)}"]
        if isinstance(answer, deadline.DeadlineExceeded):
            entries.append({"path": path, "role": role,
                            "error": f"statvfs {answer} (a network mount that is gone?)"})
        elif isinstance(answer, OSError):
            entries.append({"path": path, "role": role,
                            "error": f"statvfs failed: {answer.strerror or answer}"})
        elif isinstance(answer, BaseException):
            entries.append({"path": path, "role": role,
                            "error": f"statvfs failed: {type(answer).__name__}: {answer}"})
        else:
            entries.append({"path": path, "role": role, **answer})
    return Reading.ok(entries + failed)


def docker_root(rootfs: Path, timeout_s: float) -> tuple[str | None, str | None]:
    """(Docker's data root, None), or (None, why not) when an engine is configured but did
    not say, or (None, None) when no engine is configured (nothing to judge: not a fault)."""
    from gpuguard.sources import toolkit

    base_url = toolkit.docker_base_url(rootfs)
    if base_url is None:
        return None, None
    import docker

    try:
        client = docker.DockerClient(base_url=base_url, timeout=max(1, int(timeout_s)))
        try:
            info = client.info()
        finally:
            client.close()
    except Exception as exc:  # the SDK raises requests', urllib3's and its own errors
        return None, f"the Docker engine at {base_url} did not answer ({type(exc).__name__})"
    root = info.get("DockerRootDir") if isinstance(info, dict) else None
    if not isinstance(root, str) or not root.startswith("/"):
        return None, f"the Docker engine at {base_url} did not report its DockerRootDir"
    return root, None


def _statvfs_of(path: Path) -> Any:
    def read() -> dict[str, int]:
        st = os.statvfs(path)
        # f_bavail, not f_bfree: what `df` shows as available, the blocks a process that
        # is not root may use (ext4 keeps 5 % for root, which is no room for a model)
        return {"total_bytes": st.f_blocks * st.f_frsize, "free_bytes": st.f_bavail * st.f_frsize,
                "inodes_total": st.f_files, "inodes_free": min(st.f_favail, st.f_files)}
    return read


def _under(rootfs: Path, path: str) -> Path:
    return rootfs / path.lstrip("/")


def _exists(rootfs: Path, path: str, timeout_s: float) -> bool:
    """A directory there (a stat, under the deadline too: /var/lib/docker may be a mount)."""
    where = _under(rootfs, path)
    try:
        return bool(deadline.call(f"isdir:{where}", where.is_dir, timeout_s))
    except (OSError, deadline.DeadlineExceeded):
        return False
