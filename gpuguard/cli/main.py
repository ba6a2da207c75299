"""The `gpuguard` command line.

Imports are local to each command: `gpuguard check --format table` must not pay
for docker, prometheus_client or apscheduler, and the NVML child is forked before
the rules are loaded so that both run at once.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from gpuguard import __version__

if TYPE_CHECKING:
    from gpuguard.config.profile import Profile
    from gpuguard.io.paths import Paths
    from gpuguard.model.rule import RuleSet
    from gpuguard.model.snapshot import Snapshot
    from gpuguard.sources.active_probe import EarlyStart
    from gpuguard.sources.collect import Collection
    from gpuguard.sources.host import HostOptions

EXIT_UNKNOWN = 3


def _path_options(fn: Any) -> Any:
    for option in reversed([
        click.option("--path.sysfs", "path_sysfs", show_default="/sys",
                     type=click.Path(path_type=Path), help="sysfs mount point."),
        click.option("--path.procfs", "path_procfs", show_default="/proc",
                     type=click.Path(path_type=Path), help="procfs mount point."),
        click.option("--path.rootfs", "path_rootfs", show_default="/",
                     type=click.Path(path_type=Path), help="Host root filesystem (for /etc)."),
    ]):
        fn = option(fn)
    return fn


STATE_DIR_HELP = ("Where gpuguard keeps its state: the event store (events.db), acks, the "
                  "kernel-log ack and the supervisor's failover state.")


def _state_dir_option() -> Callable[[Any], Any]:
    return click.option("--state-dir", type=click.Path(path_type=Path),
                        show_default="/var/lib/gpuguard", help=STATE_DIR_HELP)


def _kmsg_device_option() -> Callable[[Any], Any]:
    return click.option("--kmsg-file", "kmsg_device", type=click.Path(path_type=Path),
                        help="The live kernel log device to acknowledge [default: /dev/kmsg; "
                             "e.g. the host's, mounted into a container].")


def _host_source_options(fn: Any) -> Any:
    for option in reversed([
        click.option("--kmsg-file", type=click.Path(path_type=Path),
                     help="Read the kernel log from this file (dmesg, dmesg -r or /dev/kmsg "
                          "records) instead of /dev/kmsg."),
        _state_dir_option(),
        click.option("--docker/--no-docker", "docker", default=None,
                     help="Check the Docker daemon (toolkit.docker). Default: the daemon "
                          "always does; `check` only with --probe-image or when the profile "
                          "says `docker: required` (the docker SDK costs ~200 ms to import)."),
        click.option("--host-resources/--no-host-resources", "host_resources", default=None,
                     help="Read host memory and disk space (host.memory, host.disk). Default: the "
                          "daemon and `snapshot` always do; `check` only when asked (psutil's "
                          "import and the Docker API stay off its path)."),
        click.option("--probe-image", metavar="IMAGE",
                     help="Also run nvidia-smi in a throwaway container of IMAGE with all GPUs "
                          "and compare its driver version with the host's (off by default)."),
    ]):
        fn = option(fn)
    return fn


def _rule_options(fn: Any) -> Any:
    for option in reversed([
        click.option("--profile", "profile_path", type=click.Path(path_type=Path),
                     help="Host profile [default: /etc/gpuguard/profile.yaml if present]."),
        click.option("--rules", "rules_dirs", multiple=True, type=click.Path(path_type=Path),
                     help="Directory of extra rule files (repeatable) "
                          "[default: /etc/gpuguard/rules.d if present]."),
    ]):
        fn = option(fn)
    return fn


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="gpuguard")
def main() -> None:
    """Hardware preflight and health checks for NVIDIA GPU inference hosts."""


@main.command()
@click.option("--format", "fmt", type=click.Choice(["table", "json", "prometheus"]),
              default="table", show_default=True)
@click.option("--output", "-o", type=click.Path(path_type=Path),
              help="Write here (atomically) instead of stdout.")
@click.option("--only", multiple=True, metavar="RULE",
              help="Run only these rules (ids or globs such as 'pcie.*'; repeatable).")
@click.option("--skip", multiple=True, metavar="RULE", help="Do not run these rules (repeatable).")
@click.option("--input", "input_path", type=click.Path(path_type=Path),
              help="Check a saved snapshot or an `nvidia-smi -q -x` dump instead of this host.")
@click.option("--timeout", type=click.FloatRange(min=0.2), default=10.0, show_default=True,
              help="Seconds before a hung driver is reported (driver.responsive).")
@click.option("--quiet", "-q", is_flag=True, help="Print only problems; nothing when all is well.")
@click.option("--fail-on", type=click.Choice(["unknown", "warning", "critical"]),
              default="unknown", show_default=True,
              help="Lowest status that gives a non-zero exit: `critical` for ExecStartPre= "
                   "(warnings and unknowns then exit 0); the default keeps Nagios codes.")
@click.option("--xid-window", metavar="SPAN",
              help="Count Xids of the last SPAN (90s, 15m, 2h, 1d) or `boot` "
                   "[default: the profile's xid_window, else boot].")
@click.option("--active", type=click.Choice(["on", "force"]), is_flag=False, flag_value="on",
              default=None, help="Also run the active probe (docs/active-probe.md): a kernel, "
                                 "a memory pattern and PCIe, HBM and NVLink copies on every "
                                 "idle GPU; `--active=force` probes busy GPUs too.")
@click.option("--active-deadline", type=click.FloatRange(min=0.5, max=600), metavar="S",
              help="Seconds the active probe may take [default: the profile's "
                   "active_probe.deadline_s, else 10].")
@click.option("--active-buffer-mib", type=click.IntRange(min=1, max=16384), metavar="MIB",
              help="Size of the bandwidth copies [default: profile, else 256].")
@click.option("--active-pattern-mib", type=click.IntRange(min=1, max=16384), metavar="MIB",
              help="Device memory memory.pattern writes and reads back [default: profile, "
                   "else 64].")
@click.option("--record", is_flag=True,
              help="Write this run's rule transitions and Xids to the event store in "
                   "--state-dir (docs/events.md); history escalates the suggested actions.")
@_rule_options
@_host_source_options
@_path_options
def check(fmt: str, output: Path | None, only: tuple[str, ...], skip: tuple[str, ...],
          input_path: Path | None, timeout: float, quiet: bool, fail_on: str,
          xid_window: str | None, active: str | None, active_deadline: float | None,
          active_buffer_mib: int | None, active_pattern_mib: int | None, record: bool,
          profile_path: Path | None, rules_dirs: tuple[Path, ...], kmsg_file: Path | None,
          state_dir: Path | None, docker: bool | None, host_resources: bool | None,
          probe_image: str | None, path_sysfs: Path | None,
          path_procfs: Path | None, path_rootfs: Path | None) -> None:
    """Check this host (or a saved dump) and exit 0 ok, 1 warning, 2 critical, 3 unknown."""
    started = time.monotonic()
    if record and input_path is not None:
        # A replay is another moment, often another host: its Xids and transitions under
        # this host's boot, aged from now, would feed this host's escalation.
        raise ConfigProblem("--record writes this host's history; it cannot record a "
                            "replayed --input (check it without --record)")
    paths = _paths(path_sysfs, path_procfs, path_rootfs)
    host_opts = _host_options(input_path, paths, kmsg_file, state_dir, probe_image, timeout,
                              docker, "auto", profile_path, host_resources is True)
    # check never judges the NVLink error counters (the daemon does, by growth): left out
    collection = _collection(host_opts, input_path, timeout, link_counters=False)
    early = _early_probe(paths.procfs) if active is not None and input_path is None else None
    try:
        profile, ruleset = _load_config(profile_path, rules_dirs)
        _check_filters(only, skip, list(ruleset.rules))
        if xid_window is not None:
            profile.xid_window_s = _window(xid_window)
        if active is not None and input_path is not None:
            raise ConfigProblem("--active probes this host's GPUs; it cannot check a saved "
                                "--input (a snapshot saved after a probe keeps its results)")
    except click.ClickException:
        collection.abandon()  # do not leave the worker behind
        if early is not None:
            early.abandon()
        raise

    # Everything imported from here to the result overlaps with the NVML worker.
    from gpuguard.judge.engine import evaluate
    from gpuguard.model.results import Verdict

    render = _renderer(fmt)
    waiting = time.monotonic()
    snapshot = collection.result()
    if active is not None:
        _active_probe(snapshot, profile, active == "force", active_deadline,
                      active_buffer_mib, active_pattern_mib, early)
    gathered = time.monotonic()
    results = evaluate(snapshot, ruleset, profile, only, skip)
    notes: list[str] = []
    if input_path is None:
        from gpuguard.io.paths import state_dir_or_default

        state = state_dir_or_default(state_dir)
        if record or (state / "events.db").is_file():
            from gpuguard.events.commands import with_history

            results = with_history(results, snapshot, ruleset, state, paths, record)
    elif state_dir is not None:
        # A replay is judged as it was: this host's acks do not apply to it. Said only when
        # the state dir was named (a replay reads no host path it was not given).
        from gpuguard.events.commands import acks_in_force

        acks = acks_in_force(state_dir)
        if acks:
            notes.append(f"{acks} ack(s) in {state_dir} do not apply to a replayed --input: "
                         "its actions are shown unacknowledged")
    verdict = Verdict(results, fail_on, tuple(notes))
    if fmt == "table" and quiet and verdict.nagios_code == 0:
        text = ""
    else:
        colour = output is None and sys.stdout.isatty() and "NO_COLOR" not in os.environ
        text = render(snapshot, verdict, duration_s=time.monotonic() - started, colour=colour,
                      quiet=quiet)
    _emit(text, output)
    if os.environ.get("GPUGUARD_TIMING"):
        _print_timing(waiting, gathered, snapshot)
    # Everything is written: exit now rather than tear the interpreter down (msgspec, click,
    # the rules: 15-20 ms on the H200 host, a fifth of the whole check; docs/benchmarks.md).
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(verdict.code)


@main.command()
@click.option("--output", "-o", type=click.Path(path_type=Path), help="Write here (atomically).")
@click.option("--input", "input_path", type=click.Path(path_type=Path),
              help="Convert an `nvidia-smi -q -x` dump into a snapshot instead of reading NVML.")
@click.option("--timeout", type=click.FloatRange(min=0.2), default=10.0, show_default=True)
@_host_source_options
@_path_options
def snapshot(output: Path | None, input_path: Path | None, timeout: float,
             kmsg_file: Path | None, state_dir: Path | None, docker: bool | None,
             host_resources: bool | None, probe_image: str | None, path_sysfs: Path | None,
             path_procfs: Path | None, path_rootfs: Path | None) -> None:
    """Record this host's snapshot as JSON (replay it with `check --input`)."""
    import json

    paths = _paths(path_sysfs, path_procfs, path_rootfs)
    host_opts = _host_options(input_path, paths, kmsg_file, state_dir, probe_image, timeout,
                              docker, "on", None, host_resources is not False)
    snap = _collection(host_opts, input_path, timeout).result()
    _emit(json.dumps(snap.to_json(), indent=2) + "\n", output)


@main.group()
def xid() -> None:
    """Kernel-log Xids."""


@xid.command("ack")
@_state_dir_option()
@click.option("--path.procfs", "path_procfs", show_default="/proc",
              type=click.Path(path_type=Path), help="procfs mount point (for the boot id).")
@_kmsg_device_option()
def xid_ack(state_dir: Path | None, path_procfs: Path | None, kmsg_device: Path | None) -> None:
    """Stop the Xids logged so far (this boot) from counting in xid.recent."""
    from gpuguard.io.paths import host_default, state_dir_or_default
    from gpuguard.sources import host as host_sources
    from gpuguard.sources import kmsg

    state_dir = state_dir_or_default(state_dir)
    paths = _paths(None, path_procfs, None)
    log = kmsg.read_device(kmsg_device or host_default("kmsg"))
    if not log.is_ok or log.value is None:
        raise ConfigProblem(log.describe())
    seqs = [e["seq"] for e in log.value["xids"] if e.get("seq") is not None]
    if not seqs:
        click.echo("no Xid in the kernel log: nothing to acknowledge")
        return
    try:
        host_sources.write_xid_ack(state_dir, paths, max(seqs))
    except OSError as exc:
        raise ConfigProblem(f"cannot write {state_dir}: {exc.strerror or exc}") from exc
    click.echo(f"acknowledged {len(seqs)} Xid line(s) up to kmsg sequence {max(seqs)}")
    from gpuguard.events.commands import record_xid_ack

    record_xid_ack(state_dir, paths, max(seqs), len(seqs))


@main.command("events")
@click.option("--since", default="24h", show_default=True, metavar="SPAN",
              help="Events of the last SPAN (90s, 15m, 24h, 30d).")
@click.option("--gpu", metavar="N|UUID|SERIAL", help="Only this GPU (by index, UUID or serial).")
@click.option("--rule", "rule_id", metavar="ID", help="Only this rule (xid.recent for Xids).")
@click.option("--kind", "kinds", multiple=True,
              type=click.Choice(["rule", "xid", "supervisor", "ack", "probe"]),
              help="Only these kinds (repeatable).")
@click.option("--format", "fmt", type=click.Choice(["table", "json"]), default="table",
              show_default=True)
@click.option("--limit", type=click.IntRange(min=1, max=100_000), default=200,
              show_default=True, help="At most this many, newest first.")
@_state_dir_option()
def events_cmd(since: str, gpu: str | None, rule_id: str | None, kinds: tuple[str, ...],
               fmt: str, limit: int, state_dir: Path | None) -> None:
    """What happened: rule transitions, Xids, failovers, acks (any user may read)."""
    from gpuguard.events.commands import CannotRead, list_events
    from gpuguard.io.paths import state_dir_or_default

    state_dir = state_dir_or_default(state_dir)

    try:
        click.echo(list_events(state_dir, _span_option(since, "--since"), gpu, rule_id,
                               kinds, fmt, limit), nl=False)
    except CannotRead as exc:
        raise ConfigProblem(str(exc)) from exc


@main.command("ack")
@click.argument("rule_id", metavar="RULE")
@click.option("--gpu", metavar="N|UUID|SERIAL",
              help="The GPU (required for a GPU rule: an ack names one board).")
@click.option("--reason", required=True, help="Why, for `gpuguard events`.")
@click.option("--for", "duration", default="24h", show_default=True, metavar="SPAN",
              help="How long the ack holds at most (it ends earlier when the finding "
                   "changes).")
@_state_dir_option()
@click.option("--path.procfs", "path_procfs", show_default="/proc",
              type=click.Path(path_type=Path), help="procfs mount point (for the boot id).")
@_kmsg_device_option()
@_rule_options
def ack(rule_id: str, gpu: str | None, reason: str, duration: str, state_dir: Path | None,
        path_procfs: Path | None, kmsg_device: Path | None, profile_path: Path | None,
        rules_dirs: tuple[Path, ...]) -> None:
    """Acknowledge RULE's finding: its suggested action becomes none (its status stays)
    until the finding changes or the time is up; recorded in the event store."""
    from gpuguard.events.commands import CannotRead, record_ack

    _, ruleset = _load_config(profile_path, rules_dirs)
    if rule_id not in ruleset.rules:
        raise ConfigProblem(f"no rule {rule_id!r}; see `gpuguard rules list`")
    scope = ruleset.rules[rule_id].scope
    if scope == "gpu" and gpu is None:
        raise ConfigProblem(f"{rule_id} is a GPU rule: name the GPU with --gpu (an ack "
                            "covers one board's finding)")
    if scope == "host" and gpu is not None:
        raise ConfigProblem(f"{rule_id} is a host rule: it takes no --gpu")
    seconds = _span_option(duration, "--for")
    from gpuguard.io.paths import host_default, state_dir_or_default

    # `ack xid.recent` also acknowledges the kernel log's lines (as `xid ack` does)
    kmsg = kmsg_device if kmsg_device is not None or rule_id not in (
        "xid.recent", "sxid.recent") else host_default("kmsg")
    try:
        click.echo(record_ack(state_dir_or_default(state_dir), _paths(None, path_procfs, None),
                              kmsg, rule_id, gpu, reason, seconds))
    except CannotRead as exc:
        raise ConfigProblem(str(exc)) from exc


@main.command()
@click.option("--listen", default="127.0.0.1:9412", show_default=True,
              help="HOST:PORT for /metrics, /healthz and /status (9412: clashes with neither "
                   "node_exporter 9100 nor dcgm-exporter 9400).")
@click.option("--fast-interval", type=click.FloatRange(min=0.1), default=5.0, show_default=True,
              help="Seconds between fast cycles (clocks, ECC, Xid, PCIe, ...).")
@click.option("--slow-interval", type=click.FloatRange(min=0.1), default=60.0,
              show_default=True, help="Seconds between slow cycles (versions, VBIOS, toolkit).")
@click.option("--timeout", type=click.FloatRange(min=0.2), default=4.0, show_default=True,
              help="Deadline of one NVML sweep; past it driver.responsive is critical.")
@click.option("--input", "input_path", type=click.Path(path_type=Path),
              help="Replay this snapshot or nvidia-smi XML, read again every cycle.")
@click.option("--log-format", type=click.Choice(["auto", "json", "console"]), default="auto",
              show_default=True, help="auto: JSON lines unless stderr is a terminal.")
@click.option("--udev/--no-udev", default=True, show_default=True,
              help="React to PCI add/remove events of NVIDIA devices at once.")
@click.option("--config", "config_path", type=click.Path(path_type=Path),
              help="Services the supervisor fails over to CPU (docs/supervisor.md) "
                   "[default: /etc/gpuguard/gpuguard.yaml if present].")
@click.option("--dry-run", is_flag=True,
              help="Supervisor: log the transitions it would make, change nothing.")
@click.option("--active-probe-interval", type=click.FloatRange(min=0), default=0.0,
              show_default=True, metavar="S",
              help="Run the active probe (docs/active-probe.md) on idle GPUs every S seconds "
                   "(0: never); its results are stale after 2 intervals.")
@click.option("--event-store/--no-event-store", default=True, show_default=True,
              help="Record rule transitions, Xids and failovers in STATE_DIR/events.db "
                   "(docs/events.md); history escalates the suggested actions.")
@click.option("--events-file", type=click.Path(path_type=Path),
              help="Also read udev-style events as JSON lines appended to this file "
                   "({\"action\": \"remove\", \"properties\": {...}}): a replay of a udev log.")
@_rule_options
@_host_source_options
@_path_options
def daemon(listen: str, fast_interval: float, slow_interval: float, timeout: float,
           input_path: Path | None, log_format: str, udev: bool, config_path: Path | None,
           dry_run: bool, active_probe_interval: float, event_store: bool,
           events_file: Path | None,
           profile_path: Path | None, rules_dirs: tuple[Path, ...], kmsg_file: Path | None,
           state_dir: Path | None, docker: bool | None, host_resources: bool | None,
           probe_image: str | None, path_sysfs: Path | None,
           path_procfs: Path | None, path_rootfs: Path | None) -> None:
    """Run the checks on a schedule and serve them to Prometheus (systemd Type=notify)."""
    from gpuguard.daemon.app import Daemon, DaemonConfig
    from gpuguard.io.paths import (
        config_or_default,
        forbidden,
        profile_or_default,
        rules_dirs_or_default,
    )

    if udev and forbidden():
        from gpuguard.io.paths import HostPathForbidden

        raise HostPathForbidden("udev")
    paths = _paths(path_sysfs, path_procfs, path_rootfs)
    profile_path = profile_or_default(profile_path)
    dirs = rules_dirs_or_default(rules_dirs)
    cfg = DaemonConfig(
        listen=listen, fast_interval=fast_interval, slow_interval=slow_interval,
        timeout=timeout, input_path=input_path,
        host=_host_options(input_path, paths, kmsg_file, state_dir, probe_image, timeout,
                           docker, "on", profile_path, host_resources is not False),
        profile_path=profile_path, rules_dirs=dirs, udev=udev, events_file=events_file,
        log_format=log_format, dry_run=dry_run, active_probe_interval=active_probe_interval,
        event_store=event_store,
        config_path=config_or_default(config_path))
    sys.exit(Daemon(cfg).run())


@main.group()
def failover() -> None:
    """The supervisor's services: where they run, and moving them by hand."""


@failover.command("status")
@_state_dir_option()
def failover_status(state_dir: Path | None) -> None:
    """Which variant of each service serves, since when and why."""
    from gpuguard.io.paths import state_dir_or_default
    from gpuguard.supervisor import state

    state_dir = state_dir_or_default(state_dir)
    try:
        lines, unreadable = state.describe_all(state_dir)
    except state.CannotAccess as exc:
        raise ConfigProblem(str(exc)) from exc
    for line in lines:
        click.echo(line)
    from gpuguard.events.commands import last_transitions

    for line in last_transitions(state_dir):
        click.echo(line)
    if unreadable:
        raise ConfigProblem(f"{unreadable} state file(s) in {state_dir} could not be read")


@failover.command("to")
@click.argument("variant", type=click.Choice(["cpu", "gpu"]))
@click.argument("service")
@click.option("--reason", required=True, help="Why, for the log and `failover status`.")
@_state_dir_option()
@click.option("--wait", type=float, default=120.0, show_default=True,
              help="Seconds to wait for the daemon to finish the move (0: do not wait).")
def failover_to(variant: str, service: str, reason: str, state_dir: Path | None,
                wait: float) -> None:
    """Ask the daemon to move SERVICE to its VARIANT now (and wait until it has)."""
    import time as _time

    from gpuguard.io.paths import state_dir_or_default
    from gpuguard.supervisor import state

    state_dir = state_dir_or_default(state_dir)
    try:
        state.write_request(state_dir, service, variant, reason)
    except (state.NoSuchService, state.CannotAccess) as exc:
        raise ConfigProblem(str(exc)) from exc
    click.echo(f"asked the daemon to move {service} to {variant}")
    end = _time.monotonic() + wait
    while _time.monotonic() < end:
        if state.move_done(state_dir, service, variant):
            click.echo(f"{service} now runs on {variant.upper()}")
            return
        _time.sleep(0.2)
    if wait:
        raise ConfigProblem(f"{service} is not on {variant} after {wait:g} s: see the "
                            "daemon's log (failover_failed) and `gpuguard failover status`")


@main.group()
def rules() -> None:
    """Inspect the rules in force."""


@rules.command("list")
@_rule_options
def rules_list(profile_path: Path | None, rules_dirs: tuple[Path, ...]) -> None:
    """List every rule with its scope, severity and whether it is enabled."""
    _, ruleset = _load_config(profile_path, rules_dirs)
    rows = ruleset.ordered()
    width = max(len(r.id) for r in rows)
    click.echo(f"{'RULE':<{width}}  SCOPE  SEVERITY  ENABLED  SUMMARY")
    for r in rows:
        click.echo(f"{r.id:<{width}}  {r.scope:<5}  {r.severity.value:<8}  "
                   f"{'yes' if r.enabled else 'no':<7}  {r.summary}")


@rules.command("explain")
@click.argument("rule_id")
@_rule_options
def rules_explain(rule_id: str, profile_path: Path | None, rules_dirs: tuple[Path, ...]) -> None:
    """What RULE_ID checks, the thresholds in force, and what to do when it fails."""
    _, ruleset = _load_config(profile_path, rules_dirs)
    rule = ruleset.rules.get(rule_id)
    if rule is None:
        raise ConfigProblem(f"no rule {rule_id!r}; see `gpuguard rules list`")
    click.echo(f"{rule.id}  ({rule.scope} rule, severity {rule.severity.value}, "
               f"{'enabled' if rule.enabled else 'disabled'})")
    click.echo(f"  checks:      {rule.summary}")
    if rule.when is not None:
        click.echo(f"  when:        {rule.when.source}")
    if rule.thresholds:
        click.echo("  thresholds:  " + ", ".join(f"{k}={v}" for k, v in rule.thresholds.items()))
    if rule.tags:
        click.echo(f"  tags:        {', '.join(rule.tags)}")
    click.echo(f"  defined at:  {rule.origin}")
    for where in rule.overrides:
        click.echo(f"  changed at:  {where}")
    click.echo(f"  remediation: {rule.remediation or '-'}")
    from gpuguard.judge.actions import WRONG_DATA, suggest
    from gpuguard.model.results import Status

    prefix = "inspect_hardware when the GPU read back wrong data, else " \
        if rule.id in WRONG_DATA else ""
    source = {"xid.recent": "the Xid catalog per event, else ",
              "sxid.recent": "the SXid catalog per event, else ",
              "recovery.action": "the driver's recovery action field, else "}
    whats = [f"{status.value} {action.value} ({why})" for status in
             (Status.CRITICAL, Status.WARNING)
             for action, why in [suggest(rule, status, {}, ruleset)]]
    click.echo(f"  action:      {prefix}"
               f"{source.get(rule.id, '') if rule.action is None else ''}" + "; ".join(whats))


@rules.command("fields")
def rules_fields() -> None:
    """Names that a rule's `when:` condition can use."""
    from gpuguard.config.ruleset import GPU_CONDITION_NAMES, HOST_CONDITION_NAMES

    click.echo("gpu scope:  " + ", ".join(GPU_CONDITION_NAMES))
    click.echo("host scope: " + ", ".join(HOST_CONDITION_NAMES))


# --- helpers -----------------------------------------------------------------------


def _print_timing(waiting: float, gathered: float, snapshot: Snapshot) -> None:
    """Where `check`'s time went (GPUGUARD_TIMING=1; docs/benchmarks.md): ms since main()
    when the parent was ready to wait, when the sources were in, when it was done."""
    from gpuguard.cli.entry import STARTED

    def ms(t: float) -> float:
        return round((t - STARTED) * 1000, 1)

    click.echo(f"gpuguard timing: parent ready {ms(waiting)} ms, sources in {ms(gathered)} ms, "
               f"done {ms(time.monotonic())} ms; NVML worker {snapshot.nvml.elapsed_s} s "
               "from its fork", err=True)


def _early_probe(procfs: Path) -> EarlyStart:
    """The probe's workers started beside the NVML sweep, each running cuInit while the
    sweep runs (docs/active-probe.md)."""
    from gpuguard.sources.active_probe import EarlyStart

    return EarlyStart(procfs)


def _active_probe(snapshot: Snapshot, profile: Profile, force: bool, deadline_s: float | None,
                  buffer_mib: int | None, pattern_mib: int | None,
                  early: EarlyStart | None) -> None:
    """The active probe on the GPUs the NVML sweep found (it needs their bus ids and how
    busy they are): its results become the snapshot's probe_* readings."""
    from gpuguard.sources.active_probe import ActiveProbe, options

    opts = options(profile.probe_settings, force, deadline_s, buffer_mib, pattern_mib)
    ActiveProbe(snapshot, opts, early).finish(snapshot)


def _check_filters(only: tuple[str, ...], skip: tuple[str, ...], rule_ids: list[str]) -> None:
    """A filter that names no rule is a typo: say so rather than pass on nothing checked."""
    import fnmatch

    for option, patterns in (("--only", only), ("--skip", skip)):
        for pattern in patterns:
            if not any(fnmatch.fnmatchcase(rule_id, pattern) for rule_id in rule_ids):
                raise ConfigProblem(f"{option} {pattern!r} matches no rule; see "
                                    "`gpuguard rules list`")


def _host_options(input_path: Path | None, paths: Paths, kmsg_file: Path | None,
                  state_dir: Path | None, probe_image: str | None, timeout: float,
                  docker: bool | None, docker_default: str,
                  profile_path: Path | None, host_resources: bool = False) -> HostOptions:
    from gpuguard.io.paths import profile_or_default
    from gpuguard.sources.host import HostOptions

    profile_path = profile_or_default(profile_path)
    mode = docker_default if docker is None else ("on" if docker else "off")
    opts = HostOptions(paths=paths, kmsg_file=kmsg_file, state_dir=state_dir,
                       probe_image=probe_image, probe_timeout=max(timeout, 5.0),
                       read_timeout=min(5.0, 0.75 * timeout), docker=mode,
                       profile_path=profile_path, host_resources=host_resources)
    if input_path is not None:
        # A replay reads only the host sources the user pointed at.
        given = _given_options()
        opts.kernel_log = kmsg_file is not None
        opts.procfs = "path_procfs" in given
        opts.sysfs = "path_sysfs" in given
        opts.rootfs = "path_rootfs" in given or probe_image is not None
    return opts


def _given_options() -> set[str]:
    from click.core import ParameterSource

    ctx = click.get_current_context()
    return {name for name in ctx.params
            if ctx.get_parameter_source(name) == ParameterSource.COMMANDLINE}


def _span_option(text: str, option: str) -> float:
    from gpuguard.config.profile import parse_window

    try:
        seconds = parse_window(text)
    except ValueError:
        seconds = None
    if seconds is None:
        raise click.BadParameter(f"a span such as 90s, 15m, 24h, 30d, not {text!r}",
                                 param_hint=option)
    return seconds


def _window(text: str) -> float | None:
    from gpuguard.config.profile import parse_window

    try:
        return parse_window(text)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--xid-window") from exc


def _renderer(fmt: str) -> Callable[..., str]:
    if fmt == "json":
        from gpuguard.outputs import json_out

        return lambda snapshot, verdict, **_: json_out.render(snapshot, verdict)
    if fmt == "prometheus":
        from gpuguard.outputs import prometheus

        return lambda snapshot, verdict, duration_s, **_: prometheus.render(
            snapshot, verdict, duration_s)
    from gpuguard.outputs import table

    return lambda snapshot, verdict, colour, quiet, **_: table.render(
        snapshot, verdict, colour, quiet)


def _paths(sysfs: Path | None, procfs: Path | None, rootfs: Path | None) -> Paths:
    from gpuguard.io.paths import Paths

    return Paths(sysfs=sysfs, procfs=procfs, rootfs=rootfs)


def _load_config(profile_path: Path | None,
                 rules_dirs: tuple[Path, ...]) -> tuple[Profile, RuleSet]:
    from gpuguard.config.ruleset import load_config
    from gpuguard.config.yamlfile import ConfigError
    from gpuguard.io.paths import profile_or_default, rules_dirs_or_default

    try:
        return load_config(profile_or_default(profile_path), rules_dirs_or_default(rules_dirs))
    except ConfigError as exc:
        raise ConfigProblem(str(exc)) from exc


def _collection(opts: HostOptions, input_path: Path | None, timeout: float,
                link_counters: bool = True) -> Collection:
    from gpuguard.sources.collect import Collection
    from gpuguard.sources.replay import InputError

    try:
        return Collection(opts, input_path, timeout, link_counters)
    except InputError as exc:
        raise ConfigProblem(str(exc)) from exc


def _emit(text: str, output: Path | None) -> None:
    if output is None:
        sys.stdout.write(text)
        sys.stdout.flush()
        return
    from gpuguard.io.atomic import write_text

    try:
        write_text(output, text)
    except OSError as exc:
        raise ConfigProblem(f"cannot write {output}: {exc.strerror or exc}") from exc


class ConfigProblem(click.ClickException):
    """Bad input or configuration: nothing was checked, so the verdict is UNKNOWN (3)."""

    exit_code = EXIT_UNKNOWN

    def show(self, file: Any = None) -> None:
        click.echo(f"gpuguard: {self.format_message()}", err=True)
