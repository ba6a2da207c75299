"""`gpuguard daemon`: its options, turned into the daemon's configuration."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from gpuguard.cli.options import host_source_options, path_options, rule_options
from gpuguard.cli.values import MAX_INTERVAL_S, MAX_WAIT_S, FilePath, Finite


@click.command()
@click.option("--listen", default="127.0.0.1:9412", show_default=True,
              help="HOST:PORT for /metrics, /healthz and /status (9412: clashes with neither "
                   "node_exporter 9100 nor dcgm-exporter 9400).")
@click.option("--fast-interval", type=Finite(min=0.1, max=MAX_INTERVAL_S), default=5.0,
              show_default=True,
              help="Seconds between fast cycles (clocks, ECC, Xid, PCIe, ...).")
@click.option("--slow-interval", type=Finite(min=0.1, max=MAX_INTERVAL_S), default=60.0,
              show_default=True, help="Seconds between slow cycles (versions, VBIOS, toolkit).")
@click.option("--timeout", type=Finite(min=0.2, max=MAX_WAIT_S), default=4.0, show_default=True,
              help="Deadline of one NVML sweep; past it driver.responsive is critical.")
@click.option("--input", "input_path", type=FilePath(),
              help="Replay this snapshot or nvidia-smi XML, read again every cycle.")
@click.option("--log-format", type=click.Choice(["auto", "json", "console"]), default="auto",
              show_default=True, help="auto: JSON lines unless stderr is a terminal.")
@click.option("--udev/--no-udev", default=True, show_default=True,
              help="React to PCI add/remove events of NVIDIA devices at once.")
@click.option("--config", "config_path", type=FilePath(),
              help="Services the supervisor fails over to CPU (docs/supervisor.md) "
                   "[default: /etc/gpuguard/gpuguard.yaml if present].")
@click.option("--dry-run", is_flag=True,
              help="Supervisor: log the transitions it would make, change nothing.")
@click.option("--active-probe-interval", type=Finite(min=0), default=0.0,
              show_default=True, metavar="S",
              help="Run the active probe (docs/active-probe.md) on idle GPUs every S seconds "
                   "(0: never); its results are stale after 2 intervals.")
@click.option("--event-store/--no-event-store", default=True, show_default=True,
              help="Record rule transitions, Xids and failovers in STATE_DIR/events.db "
                   "(docs/events.md); history escalates the suggested actions.")
@click.option("--events-file", type=FilePath(),
              help="Also read udev-style events as JSON lines appended to this file "
                   "({\"action\": \"remove\", \"properties\": {...}}): a replay of a udev log.")
@click.option("--status-socket", type=FilePath(), metavar="PATH",
              help="Serve the latest verdict to `gpuguard status` and `gpuguard slurm health` "
                   "on this Unix socket (the unit uses /run/gpuguard/status.sock).")
@click.option("--status-group", default="gpuguard", show_default=True, metavar="GROUP",
              help="Group (name or gid) that may read the status socket besides root; "
                   "root only where it does not exist.")
@click.option("--npd-dir", type=FilePath(), metavar="DIR",
              help="Write one verdict file per node condition here each cycle, for "
                   "node-problem-detector's plugin (docs/kubernetes.md).")
@click.option("--status-page", is_flag=True,
              help="Serve a status page at / (docs/status-page.md); the profile's "
                   "`status_page: true` does it on a loopback listener only.")
@click.option("--metrics-compat", type=click.Choice(["dcgm"]), default=None,
              help="Also export dcgm-exporter's series (DCGM_FI_DEV_*, with its names, types, "
                   "units and labels) from what gpuguard reads, for the dashboards and "
                   "alerts written for it (docs/metrics.md); the profile's "
                   "`metrics_compat: dcgm` does it too. Off by default.")
@rule_options
@host_source_options
@path_options
def daemon(listen: str, fast_interval: float, slow_interval: float, timeout: float,
           input_path: Path | None, log_format: str, udev: bool, config_path: Path | None,
           dry_run: bool, active_probe_interval: float, event_store: bool,
           events_file: Path | None, status_socket: Path | None, status_group: str,
           npd_dir: Path | None, status_page: bool, metrics_compat: str | None,
           profile_path: Path | None, rules_dirs: tuple[Path, ...], kmsg_file: Path | None,
           state_dir: Path | None, docker: bool | None, host_resources: bool | None,
           probe_image: str | None, path_sysfs: Path | None,
           path_procfs: Path | None, path_rootfs: Path | None) -> None:
    """Run the checks on a schedule and serve them to Prometheus (systemd Type=notify)."""
    from gpuguard.assess.inputs import HostInputs
    from gpuguard.daemon.app import Daemon
    from gpuguard.daemon.settings import DaemonConfig
    from gpuguard.io.paths import (
        config_or_default,
        forbidden,
        profile_or_default,
        rules_dirs_or_default,
    )

    if udev and forbidden():
        from gpuguard.io.paths import HostPathForbidden

        raise HostPathForbidden("udev")
    # the defaults looked up now: under the tests' guard a refused one stops the start
    inputs = HostInputs(input_path, path_sysfs, path_procfs, path_rootfs, kmsg_file,
                        state_dir, profile_or_default(profile_path),
                        tuple(rules_dirs_or_default(rules_dirs)), timeout, probe_image, docker,
                        "on", host_resources is not False)
    cfg = DaemonConfig(
        listen=listen, fast_interval=fast_interval, slow_interval=slow_interval,
        inputs=inputs, udev=udev, events_file=events_file,
        log_format=log_format, dry_run=dry_run, active_probe_interval=active_probe_interval,
        event_store=event_store, status_socket=status_socket, status_group=status_group,
        npd_dir=npd_dir, status_page=status_page, metrics_compat=metrics_compat,
        config_path=config_or_default(config_path))
    sys.exit(Daemon(cfg).run())
