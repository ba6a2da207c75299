"""The host sources besides NVML, filled into a snapshot.

Live checks read them all. A replayed input (`--input`) reads only the ones whose
root the user named (`--path.*`, `--kmsg-file`): a support engineer triaging a
customer's dump must not get the facts of their own laptop mixed in.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import stat
import time
from dataclasses import dataclass, field
from pathlib import Path

from gpuguard.paths import Paths
from gpuguard.snapshot import HOST_READING_FIELDS, Reading, Snapshot
from gpuguard.sources.pipe import read_until

# The source modules are imported where they are used: `gpuguard check` runs them in a
# forked child, and what the parent imports before that fork delays it.

XID_ACK_FILE = "xid-ack.json"


@dataclass
class HostOptions:
    paths: Paths = field(default_factory=Paths)
    kmsg_file: Path | None = None
    state_dir: Path | None = None
    probe_image: str | None = None
    probe_timeout: float = 30.0
    # Docker: "on" (the daemon; `check --docker`), "off", or "auto": only when the profile
    # says `docker: required`. Importing the docker SDK costs ~200 ms, too much for every
    # preflight `check` on hosts that do not run their inference in Docker.
    docker: str = "on"
    profile_path: Path | None = None
    # Which families to read: all for a live check, only those named for a replay.
    kernel_log: bool = True
    procfs: bool = True
    sysfs: bool = True
    rootfs: bool = True


def collect_host(snapshot: Snapshot, opts: HostOptions) -> None:
    """Everything that does not need NVML's GPU list (runs while the NVML worker runs)."""
    from gpuguard.sources import driver_stack, sysfs, toolkit

    host = snapshot.host
    if opts.kernel_log:
        host.kernel_log = read_kernel_log(opts)
    if opts.procfs:
        host.kernel_module_version = driver_stack.module_version(opts.paths.procfs)
        host.kernel_modules = driver_stack.loaded_modules(opts.paths.procfs)
        host.persistenced_running = driver_stack.persistenced_running(opts.paths.procfs)
    if opts.sysfs:
        host.secure_boot = sysfs.secure_boot(opts.paths.sysfs)
    if opts.rootfs:
        host.device_nodes = driver_stack.device_nodes(opts.paths.rootfs)
        host.cdi_specs = toolkit.cdi_specs(opts.paths.rootfs)
        host.container_cli = toolkit.container_cli()
        host.ctk_version = toolkit.ctk_version()
        if _want_docker(opts):
            host.docker = toolkit.docker_info(opts.paths.rootfs)
        else:
            host.docker = Reading.not_supported(
                "Docker is not checked by `gpuguard check` unless asked: --docker, "
                "--probe-image, or `docker: required` in the profile (the daemon checks it)")
        if opts.probe_image:
            host.probe_image = toolkit.probe_image(opts.paths.rootfs, opts.probe_image,
                                                   opts.probe_timeout)
    host.__post_init__()


def _want_docker(opts: HostOptions) -> bool:
    if opts.docker == "on" or opts.probe_image:
        return True
    if opts.docker == "off" or opts.profile_path is None:
        return False
    from gpuguard.profile import load_profile
    from gpuguard.yamlfile import ConfigError

    try:
        return load_profile(opts.profile_path).docker_required
    except ConfigError:
        return False  # the parent reports the bad profile


class ForkedHostFacts:
    """collect_host() in a forked child, so that its imports (psutil, YAML) and reads run
    beside the NVML worker instead of after the parent's own start-up."""

    def __init__(self, opts: HostOptions) -> None:
        self.started = time.monotonic()
        read_fd, write_fd = os.pipe()
        pid = os.fork()
        if pid == 0:  # child
            code = 0
            try:
                os.close(read_fd)
                facts = Snapshot()
                collect_host(facts, opts)
                payload = {name: getattr(facts.host, name).to_json()
                           for name in HOST_READING_FIELDS}
                with os.fdopen(write_fd, "w") as out:
                    out.write(json.dumps(payload))
            except BaseException:
                code = 1
            finally:
                os._exit(code)
        os.close(write_fd)
        self.pid = pid
        self._read_fd = read_fd

    def result(self, deadline_s: float) -> Snapshot:
        facts = Snapshot()
        data, done = read_until(self._read_fd, self.started + deadline_s)
        try:
            payload = json.loads(data) if done else None
        except ValueError:
            payload = None
        if payload is None:
            why = ("did not answer in time" if not done else "failed")
            for name in HOST_READING_FIELDS:
                setattr(facts.host, name, Reading.failed(f"host sources {why}"))
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGKILL)
        else:
            for name, raw in payload.items():
                reading = Reading.from_json(raw)
                if reading.state != "absent":
                    setattr(facts.host, name, reading)
        with contextlib.suppress(ChildProcessError):
            os.waitpid(self.pid, os.WNOHANG)
        facts.host.__post_init__()
        return facts


def collect_gpus(snapshot: Snapshot, opts: HostOptions) -> None:
    """What needs the GPU list: AER counters by PCI address."""
    if not opts.sysfs:
        return
    from gpuguard.sources import sysfs

    for gpu in snapshot.gpus:
        if gpu.pci_bus_id.is_ok:
            gpu.pcie_aer = sysfs.aer_chain(opts.paths.sysfs, gpu.pci_bus_id.get())
            gpu.__post_init__()


def merge(into: Snapshot, host_from: Snapshot) -> None:
    """Carry host facts read in one snapshot into another (the NVML worker's)."""
    for name, value in vars(host_from.host).items():
        if isinstance(value, Reading) and value.state != "absent":
            setattr(into.host, name, value)
    into.host.__post_init__()


def read_kernel_log(opts: HostOptions) -> Reading[dict[str, object]]:
    from gpuguard.sources import kmsg

    path = opts.kmsg_file
    if path is not None and not _is_char_device(path):
        return kmsg.read_file(path)
    # The live device (or another kmsg device, such as the host's mounted into a container).
    log = kmsg.read_device(path or Path("/dev/kmsg"))
    if log.is_ok and opts.state_dir is not None:
        acked = read_xid_ack(opts.state_dir, opts.paths.procfs)
        if acked is not None:
            assert log.value is not None
            log.value["acked_seq"] = acked
    return log


def _is_char_device(path: Path) -> bool:
    try:
        return stat.S_ISCHR(path.stat().st_mode)
    except OSError:
        return False


def boot_id(procfs: Path) -> str | None:
    try:
        return (procfs / "sys" / "kernel" / "random" / "boot_id").read_text().strip()
    except OSError:
        return None


def read_xid_ack(state_dir: Path, procfs: Path) -> int | None:
    """The last acknowledged kmsg sequence number, if it was taken in this boot."""
    try:
        raw = json.loads((state_dir / XID_ACK_FILE).read_text())
    except (OSError, ValueError):
        return None  # no ack, or a bad file: count everything (never hide an Xid)
    if not isinstance(raw, dict) or raw.get("boot_id") != boot_id(procfs):
        return None
    seq = raw.get("seq")
    return seq if isinstance(seq, int) else None


def write_xid_ack(state_dir: Path, procfs: Path, seq: int) -> None:
    from gpuguard.atomic import write_text

    os.makedirs(state_dir, exist_ok=True)
    write_text(state_dir / XID_ACK_FILE,
               json.dumps({"boot_id": boot_id(procfs), "seq": seq}) + "\n")
