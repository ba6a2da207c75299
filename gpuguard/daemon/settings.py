"""The daemon's settings (what `gpuguard daemon`'s options and files say), and how long it
keeps its samples for the rules it runs."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import structlog

from gpuguard.assess.inputs import HostInputs
from gpuguard.io.paths import state_dir_or_default
from gpuguard.model.rule import RuleSet
from gpuguard.sources import boot_state
from gpuguard.sources import host as host_sources
from gpuguard.sources.kmsg_tail import KernelLogTail

log = structlog.get_logger("gpuguard.daemon")

DEFAULT_LISTEN = "127.0.0.1:9412"
# Host sources read every fast cycle; the others every slow one. Host memory is one
# read of /proc/meminfo (~0.1 ms): memory pressure cannot wait a minute either.
FAST_SOURCES = frozenset({"kernel_log", "host_memory"})


# The daemon's input options: every source (Docker, host memory and disks) unless turned
# off; `timeout` is the NVML deadline of one sweep.
DAEMON_INPUTS = HostInputs(timeout=4.0, docker_default="on", host_resources=True)


@dataclass
class DaemonConfig:
    listen: str = DEFAULT_LISTEN
    fast_interval: float = 5.0
    slow_interval: float = 60.0
    # What the daemon judges (one object for every consumer: gpuguard/assess/inputs.py):
    # the replayed --input (read again every cycle), the roots, the profile and rules.
    inputs: HostInputs = DAEMON_INPUTS
    # The host sources' options, built from `inputs` (the daemon sets the profile's disk
    # paths and the services' workloads on it as they change).
    host: host_sources.HostOptions | None = None
    udev: bool = True
    events_file: Path | None = None
    log_format: str = "auto"
    config_path: Path | None = None  # services for the supervisor (gpuguard/supervisor)
    dry_run: bool = False
    # Seconds between runs of the active probe on idle GPUs; 0: never (daemon/active.py).
    active_probe_interval: float = 0.0
    event_store: bool = True  # record transitions and Xids in state_dir/events.db
    # `gpuguard status` reads the verdict here (daemon/verdict_socket.py); None: no socket
    status_socket: Path | None = None
    status_group: str | None = "gpuguard"  # who besides root may read it
    npd_dir: Path | None = None  # node-problem-detector's condition files (verdict_files.py)
    status_page: bool = False  # --status-page: the page at / on any listener
    # --metrics-compat dcgm: dcgm-exporter's series beside gpuguard's (issue 33); None:
    # the profile's metrics_compat decides
    metrics_compat: str | None = None

    def __post_init__(self) -> None:
        if self.host is None:
            self.host = self.inputs.host_options()
        # the kernel log read where the last cycle left it, not whole each cycle (issue 32)
        self.host.kernel_log_reader = KernelLogTail().read

    @property
    def sources(self) -> host_sources.HostOptions:
        assert self.host is not None  # set in __post_init__
        return self.host

    @property
    def input_path(self) -> Path | None:
        return self.inputs.input_path

    @property
    def timeout(self) -> float:
        return self.inputs.timeout

    @property
    def profile_path(self) -> Path | None:
        return self.inputs.profile_path

    @property
    def rules_dirs(self) -> tuple[Path, ...]:
        return self.inputs.rules_dirs


def sample_spans(ruleset: RuleSet) -> tuple[float, float]:
    """How long to keep the GPUs' samples and the services' samples: as long as the longest
    window a rule judges (a rule whose window_s an override lengthened must not be judged
    over less than it says). The services' 30 min window does not lengthen every GPU's."""
    windows = {r.id: float(r.thresholds["window_s"]) for r in ruleset.rules.values()
               if isinstance(r.thresholds.get("window_s"), int | float)}
    gpus = max([660.0, *(w + 60.0 for rule, w in windows.items()
                         if not rule.startswith("service."))])
    services = max([60.0, *(w + 60.0 for rule, w in windows.items()
                            if rule.startswith("service."))])
    return gpus, services


def host_paths(cfg: DaemonConfig, services: bool) -> tuple[Path | None, str | None, str]:
    """The state dir, the boot id and the procfs root this configuration uses, looked
    up now: under the tests' guard (gpuguard/io/paths.py) a refused one stops the
    start (HostPathForbidden, exit 4)."""
    # A replay records history only into a state dir it was given: never into this
    # host's own (the replayed facts are not this host's).
    if cfg.input_path is not None and cfg.sources.state_dir is None:
        if cfg.event_store:
            log.info("event_store_off", why="a replayed --input without --state-dir")
        cfg.event_store = False
    cfg.sources.look_up_host_paths()
    # looked up only where something is kept there (a replay without services and
    # without a store keeps nothing)
    state_dir = state_dir_or_default(cfg.sources.state_dir) \
        if cfg.event_store or services else None
    # the store's events and the supervisors' time on CPU are of this boot
    boot = boot_state.boot_id(cfg.sources.paths) if cfg.event_store or services else None
    procfs = str(cfg.sources.paths.procfs) if cfg.input_path is None else ""
    return state_dir, boot, procfs
