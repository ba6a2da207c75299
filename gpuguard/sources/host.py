"""The host sources besides NVML, filled into a snapshot.

Live checks read them all. A replayed input (`--input`) reads only the ones whose
root the user named (`--path.*`, `--kmsg-file`): a support engineer triaging a
customer's dump must not get the facts of their own laptop mixed in.
"""

from __future__ import annotations

import contextlib
import json
import os
import stat
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from gpuguard.io import forked
from gpuguard.io.paths import Paths, host_default
from gpuguard.model.snapshot import Reading, Snapshot, SourceRun
from gpuguard.model.workload import Workload
from gpuguard.sources import boot_state

# The source modules are imported where they are used: `gpuguard check` runs them in a
# forked child, and what the parent imports before that fork delays it.



@dataclass
class HostOptions:
    paths: Paths = field(default_factory=Paths)
    kmsg_file: Path | None = None
    state_dir: Path | None = None
    probe_image: str | None = None
    probe_timeout: float = 30.0
    # Deadline of one file read (a kernel log given as a pipe): a source that passes it is
    # an error reading, never a stuck check or cycle.
    read_timeout: float = 5.0
    # Docker: "on" (the daemon; `check --docker`), "off", or "auto": only when the profile
    # says `docker: required`. Importing the docker SDK costs ~200 ms, too much for every
    # preflight `check` on hosts that do not run their inference in Docker.
    docker: str = "on"
    # The profile's `docker: required` (docker "auto": check Docker only then).
    docker_required: bool = False
    # Host memory and disk space (host.memory, host.disk): the daemon reads them; `check`
    # only with --host-resources (psutil's import and Docker's API stay off its path).
    host_resources: bool = True
    # The paths host.disk watches besides Docker's data root: the profile's `disk_paths`
    # (whoever loaded the profile sets them: the sources never read it themselves).
    disk_paths: tuple[Path, ...] = ()
    # The images and Python environments image.cuda judges (sources/workloads.py)
    workloads: tuple[Workload, ...] = ()
    # Which families to read: all for a live check, only those named for a replay.
    kernel_log: bool = True
    # Who reads the kernel log: None, a whole read each time (`check`); the daemon's keeps
    # its place and reads only what is new (sources/kmsg_tail.py)
    kernel_log_reader: Callable[[Path, float], Reading[dict[str, Any]]] | None = None
    procfs: bool = True
    sysfs: bool = True
    rootfs: bool = True

    def kmsg_path(self) -> Path:
        """The kernel log to read: --kmsg-file, else the host's /dev/kmsg."""
        return self.kmsg_file if self.kmsg_file is not None else host_default("kmsg")

    def look_up_host_paths(self) -> None:
        """Look up now every default host path these options will read, so that the
        guard (gpuguard/io/paths.py) refuses in the parent, before any worker is forked,
        rather than as an unknown reading inside one."""
        if self.kernel_log and _is_char_device(self.kmsg_path()) and self.state_dir is None:
            self.state_dir = host_default("state")  # where `xid ack` keeps its sequence
        if self.procfs:
            _ = self.paths.procfs
        if self.sysfs:
            _ = self.paths.sysfs
        if self.rootfs:
            _ = self.paths.rootfs


@dataclass(frozen=True)
class HostSource:
    """One host source: the snapshot fields it fills, and whether these options read it.
    Fast sources come first: `check` stops waiting at its deadline, and a slow source
    (a kernel log on a pipe, Docker) may then make only its own fields unknown."""

    name: str
    fields: tuple[str, ...]
    wanted: Callable[[HostOptions], bool]
    read: Callable[[HostOptions], dict[str, Reading[Any]]]
    # What it needs of the profile (Docker's `required`, the disk paths): `check` starts
    # the sources before its profile is loaded and hands those over once it is.
    needs_profile: Callable[[HostOptions], bool] = lambda o: False


def _procfs(opts: HostOptions) -> dict[str, Reading[Any]]:
    from gpuguard.sources import driver_stack

    procfs = opts.paths.procfs
    return {"kernel_module_version": driver_stack.module_version(procfs),
            "kernel_modules": driver_stack.loaded_modules(procfs),
            "persistenced_running": driver_stack.persistenced_running(procfs),
            "fabricmanager_running": driver_stack.fabricmanager_running(procfs)}


def _sysfs(opts: HostOptions) -> dict[str, Reading[Any]]:
    from gpuguard.sources import pci_gpus, sysfs

    return {"secure_boot": sysfs.secure_boot(opts.paths.sysfs),
            # the driver's procfs only where procfs is read (a replay names its own)
            "pci_gpus": pci_gpus.read(opts.paths.sysfs,
                                      opts.paths.procfs if opts.procfs else None)}


def _rootfs(opts: HostOptions) -> dict[str, Reading[Any]]:
    from gpuguard.sources import driver_stack, toolkit

    return {"device_nodes": driver_stack.device_nodes(opts.paths.rootfs),
            "cdi_specs": toolkit.cdi_specs(opts.paths.rootfs),
            "container_cli": toolkit.container_cli(),
            "ctk_version": toolkit.ctk_version()}


def _gpu_devices(opts: HostOptions) -> dict[str, Reading[Any]]:
    from gpuguard.sources import gpu_devices

    paths = opts.paths
    return {"gpu_devices": gpu_devices.read(paths.procfs if opts.procfs else None,
                                            paths.sysfs if opts.sysfs else None,
                                            paths.rootfs if opts.rootfs else None,
                                            opts.read_timeout)}


def _docker(opts: HostOptions) -> dict[str, Reading[Any]]:
    from gpuguard.sources import toolkit

    if not _want_docker(opts):
        return {"docker": Reading.not_supported(
            "Docker is not checked by `gpuguard check` unless asked: --docker, "
            "--probe-image, or `docker: required` in the profile (the daemon checks it)")}
    return {"docker": toolkit.docker_info(opts.paths.rootfs)}


RESOURCES_OFF = ("host resources are not read by `gpuguard check` unless asked: "
                 "--host-resources (the daemon reads them)")


def _host_memory(opts: HostOptions) -> dict[str, Reading[Any]]:
    if not opts.host_resources:
        return {"host_memory": Reading.not_supported(RESOURCES_OFF)}
    from gpuguard.sources import host_memory

    return {"host_memory": host_memory.read(opts.paths.procfs, opts.read_timeout)}


def _disk_space(opts: HostOptions) -> dict[str, Reading[Any]]:
    if not opts.host_resources:
        return {"disk_space": Reading.not_supported(RESOURCES_OFF)}
    from gpuguard.sources import disk_space

    return {"disk_space": disk_space.read(opts.paths.rootfs, opts.disk_paths, opts.docker != "off",
                                          opts.read_timeout)}


def _probe_image(opts: HostOptions) -> dict[str, Reading[Any]]:
    from gpuguard.sources import toolkit

    assert opts.probe_image is not None
    return {"probe_image": toolkit.probe_image(opts.paths.rootfs, opts.probe_image,
                                               opts.probe_timeout)}


def _workloads(opts: HostOptions) -> dict[str, Reading[Any]]:
    from gpuguard.sources import workloads

    return {"workloads": workloads.read(opts.workloads, opts.paths, opts.read_timeout)}


HOST_SOURCES: tuple[HostSource, ...] = (
    HostSource("procfs", ("kernel_module_version", "kernel_modules", "persistenced_running",
                          "fabricmanager_running"), lambda o: o.procfs, _procfs),
    HostSource("sysfs", ("secure_boot", "pci_gpus"), lambda o: o.sysfs, _sysfs),
    HostSource("host_memory", ("host_memory",), lambda o: o.procfs, _host_memory),
    HostSource("rootfs", ("device_nodes", "cdi_specs", "container_cli", "ctk_version"),
               lambda o: o.rootfs, _rootfs),
    HostSource("gpu_devices", ("gpu_devices",), lambda o: o.procfs or o.sysfs or o.rootfs,
               _gpu_devices),
    HostSource("kernel_log", ("kernel_log",), lambda o: o.kernel_log,
               lambda o: {"kernel_log": read_kernel_log(o)}),
    HostSource("docker", ("docker",), lambda o: o.rootfs, _docker,
               lambda o: o.docker == "auto" and not o.probe_image),
    HostSource("disk_space", ("disk_space",), lambda o: o.rootfs, _disk_space,
               lambda o: o.host_resources),
    HostSource("probe_image", ("probe_image",), lambda o: o.rootfs and bool(o.probe_image),
               _probe_image),
    HostSource("workloads", ("workloads",), lambda o: bool(o.workloads), _workloads),
)


def collect_host(snapshot: Snapshot, opts: HostOptions,
                 done: Callable[[str, dict[str, Reading[Any]]], None] | None = None,
                 only: frozenset[str] | None = None, skip: frozenset[str] = frozenset(),
                 profile_settings: Callable[[], None] | None = None) -> None:
    """Everything that does not need NVML's GPU list (runs while the NVML worker runs).
    `done` hears each source's readings as soon as that source has them; `only` and
    `skip` pick sources by name (the daemon reads the kernel log every fast cycle and
    the rest every slow one); `profile_settings` fills in the profile's settings before
    the first source that needs them."""
    for source in HOST_SOURCES:
        if not source.wanted(opts) or source.name in skip or \
                (only is not None and source.name not in only):
            continue
        if profile_settings is not None and source.needs_profile(opts):
            profile_settings()
            profile_settings = None
        started = time.monotonic()
        try:
            values = source.read(opts)
        except Exception as exc:  # a broken source is unknown, never the end of the run
            values = {name: Reading.failed(f"the {source.name} source failed: "
                                           f"{type(exc).__name__}: {exc}")
                      for name in source.fields}
        for name, reading in values.items():
            setattr(snapshot.host, name, reading)
        snapshot.record(source.name, started, [getattr(snapshot.host, n) for n in values])
        if done is not None:
            done(source.name, {n: getattr(snapshot.host, n) for n in values})


def _want_docker(opts: HostOptions) -> bool:
    if opts.docker == "on" or opts.probe_image:
        return True
    return opts.docker == "auto" and opts.docker_required


class ForkedHostFacts:
    """collect_host() in a forked child, so that its imports (YAML, docker) and reads run
    beside the NVML worker instead of after the parent's own start-up. The child writes
    one line per source as it finishes; at the deadline the sources that have not
    answered are unknown, and only they: NVML's own host facts are never touched."""

    def __init__(self, opts: HostOptions, profile_later: bool = False) -> None:
        self.started = time.monotonic()
        self.opts = opts
        opts.look_up_host_paths()
        # `check` forks this before its profile is loaded: the sources that need the
        # profile's settings wait for them on this pipe (tell()), the rest start at once
        self._tell_fd: int | None = None
        settings_fd: int | None = None
        if profile_later:
            settings_fd, self._tell_fd = os.pipe()
        self.worker = forked.Worker(
            lambda out: _write_host_facts(out, opts, settings_fd, self._tell_fd))
        if settings_fd is not None:
            os.close(settings_fd)

    def tell(self, docker_required: bool, disk_paths: tuple[Path, ...]) -> None:
        """The profile's settings, once the parent has loaded it (it is read once)."""
        self.opts.docker_required, self.opts.disk_paths = docker_required, disk_paths
        if self._tell_fd is None:
            return
        line = json.dumps({"docker_required": docker_required,
                           "disk_paths": [str(p) for p in disk_paths]}) + "\n"
        with contextlib.suppress(OSError):  # a worker gone already: its ending says so
            os.write(self._tell_fd, line.encode())
        os.close(self._tell_fd)
        self._tell_fd = None

    def abandon(self) -> None:
        if self._tell_fd is not None:
            os.close(self._tell_fd)
            self._tell_fd = None
        self.worker.kill()

    def result(self, deadline_at: float) -> Snapshot:
        """The host facts read by the monotonic time `deadline_at`."""
        facts = Snapshot()
        data = self.worker.read(deadline_at)
        finished = self.worker.finished
        answered: set[str] = set()
        for line in data.splitlines():
            try:
                message = json.loads(line)
                readings = {name: Reading.from_json(raw)
                            for name, raw in message["readings"].items()}
            except (ValueError, KeyError, TypeError, AttributeError):
                continue  # a line cut at the deadline: that source did not answer
            answered.add(message["source"])
            for name, reading in readings.items():
                if name in HOST_SOURCE_FIELDS and reading.state != "absent":
                    setattr(facts.host, name, reading)
            run = message.get("run") or {}
            facts.sources[message["source"]] = SourceRun(
                bool(run.get("success")), float(run.get("duration_s") or 0.0), run.get("error"))
        waited = round(time.monotonic() - self.started, 1)
        for source in HOST_SOURCES:
            if source.wanted(self.opts) and source.name not in answered:
                why = (f"did not answer within {waited:g} s" if not finished
                       else "stopped without an answer")
                for name in source.fields:
                    setattr(facts.host, name, Reading.failed(f"the {source.name} source {why}"))
                facts.sources[source.name] = SourceRun(False, waited, f"the source {why}")
        if not finished:
            self.worker.kill()
        self.worker.reap()
        return facts


def _write_host_facts(out: TextIO, opts: HostOptions, settings_fd: int | None,
                      tell_fd: int | None) -> None:
    """In the worker: one line per source as it finishes (its readings and how it did)."""
    facts = Snapshot()
    if tell_fd is not None:
        os.close(tell_fd)  # the parent's end

    def done(name: str, values: dict[str, Reading[Any]]) -> None:
        out.write(json.dumps({"source": name, "run": facts.sources[name].to_json(),
                              "readings": {field_name: reading.to_json()
                                           for field_name, reading in values.items()}}) + "\n")

    def settings() -> None:
        assert settings_fd is not None
        with os.fdopen(settings_fd, "rb") as pipe:
            line = pipe.readline(1 << 20)
        if not line:
            raise SystemExit(1)  # the parent gave up (a bad profile): nothing more to read
        told = json.loads(line)
        opts.docker_required = bool(told["docker_required"])
        opts.disk_paths = tuple(Path(p) for p in told["disk_paths"])

    collect_host(facts, opts, done, profile_settings=settings if settings_fd is not None
                 else None)


HOST_SOURCE_FIELDS = frozenset(name for source in HOST_SOURCES for name in source.fields)


def collect_gpus(snapshot: Snapshot, opts: HostOptions) -> None:
    """What needs the GPU list: AER counters by PCI address."""
    if not opts.sysfs:
        return
    from gpuguard.sources import sysfs

    started = time.monotonic()
    for gpu in snapshot.gpus:
        if gpu.pci_bus_id.is_ok:
            gpu.pcie_aer = sysfs.aer_chain(opts.paths.sysfs, gpu.pci_bus_id.get())
    snapshot.record("pcie_aer", started, [gpu.pcie_aer for gpu in snapshot.gpus])


def merge(into: Snapshot, host_from: Snapshot) -> None:
    """Carry the host sources' facts into another snapshot (the NVML worker's). Only the
    fields the host sources own: NVML's driver version and GPU count are never replaced."""
    for name in HOST_SOURCE_FIELDS:
        value = getattr(host_from.host, name)
        if value.state != "absent":
            setattr(into.host, name, value)
    into.sources.update(host_from.sources)


def read_kernel_log(opts: HostOptions) -> Reading[dict[str, Any]]:
    read = opts.kernel_log_reader or read_kmsg_at
    log = read(opts.kmsg_path(), opts.read_timeout)
    if log.is_ok and opts.state_dir is not None and _is_char_device(opts.kmsg_path()):
        # the ack is a sequence number of this boot's live log, never of a saved file
        acked = boot_state.read_xid_ack(opts.state_dir, opts.paths)
        if acked is not None:
            assert log.value is not None
            log.value["acked_seq"] = acked
    return log


def read_kmsg_at(path: Path, deadline_s: float) -> Reading[dict[str, Any]]:
    """A saved log (a file, or a pipe such as `<(dmesg)`), or a live kmsg device (the
    host's, or the host's mounted into a container)."""
    from gpuguard.sources import kmsg

    if _is_char_device(path):
        return kmsg.read_device(path, deadline_s)
    return kmsg.read_file(path, deadline_s)


def _is_char_device(path: Path) -> bool:
    try:
        return stat.S_ISCHR(path.stat().st_mode)
    except OSError:
        return False
