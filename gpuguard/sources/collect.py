"""One way for data to flow: the sources that make a snapshot, started together and
gathered under one deadline. `gpuguard check` and `gpuguard snapshot` collect through
Collection; the daemon, whose NVML worker persists between cycles, through finish() and
the same host sources (gpuguard/sources/host.py).

Standard library and gpuguard's own light modules only at the top: `check` starts a
Collection before its configuration is loaded, so both run at once.
"""

from __future__ import annotations

import time
from pathlib import Path

from gpuguard.model.snapshot import Snapshot
from gpuguard.sources import host as host_sources
from gpuguard.sources import nvml


class Collection:
    """NVML's sweep (or a replayed file) and the host sources, each in a forked worker,
    started now; result() gathers them by the deadline that --timeout gives."""

    def __init__(self, opts: host_sources.HostOptions, input_path: Path | None,
                 timeout: float, link_counters: bool = True,
                 profile_later: bool = False, inforom_kept: bool = False) -> None:
        self.started = time.monotonic()
        self.opts = opts
        self.timeout = timeout
        opts.look_up_host_paths()  # a refused default stops here, before any worker starts
        self.replayed = load_input(input_path, timeout) if input_path is not None else None
        keep = nvml.keep_place(None if opts.state_dir is None else str(opts.state_dir),
                               str(opts.kmsg_path()), str(opts.paths.boot_id_file)) \
            if inforom_kept and opts.kernel_log else None
        self.sweep = None if input_path is not None else \
            nvml.start_sweep(str(opts.paths.procfs), nvml.deadline_for(timeout), link_counters,
                             keep, str(opts.paths.sysfs) if opts.sysfs else None)
        # beside the NVML worker; with `profile_later`, before the profile is loaded (tell())
        self.host = host_sources.ForkedHostFacts(opts, profile_later)

    def tell(self, docker_required: bool, disk_paths: tuple[Path, ...]) -> None:
        """The profile's settings for the host sources that need them."""
        self.host.tell(docker_required, disk_paths)

    def result(self) -> Snapshot:
        snapshot = self.replayed if self.sweep is None else self.sweep.result()
        assert snapshot is not None
        return finish(snapshot, self.host.result(self.host_deadline()), self.opts)

    def abandon(self) -> None:
        """Stop waiting (a bad configuration): no worker is left behind."""
        if self.sweep is not None:
            self.sweep.abandon()
        self.host.abandon()

    def host_deadline(self) -> float:
        """When to stop waiting for the host sources (monotonic): NVML's share of
        --timeout, or longer when a probe container was asked for (it has its own)."""
        share = nvml.deadline_for(self.timeout)
        if self.opts.probe_image:
            share = max(share, self.opts.probe_timeout + 2.0)
        return self.started + share


def load_input(path: Path, timeout: float) -> Snapshot:
    """A replayed snapshot or nvidia-smi XML (replay.InputError when it cannot be read)."""
    from gpuguard.sources import replay

    started = time.monotonic()
    snapshot = replay.load(path, timeout)
    snapshot.record("input", started)
    return snapshot


def finish(snapshot: Snapshot, host_facts: Snapshot | None,
           opts: host_sources.HostOptions) -> Snapshot:
    """NVML's (or the replay's) snapshot with the host sources' facts, then the sources
    that need the GPU list (AER counters by PCI address)."""
    if host_facts is not None:
        host_sources.merge(snapshot, host_facts)
    host_sources.collect_gpus(snapshot, opts)
    return snapshot
