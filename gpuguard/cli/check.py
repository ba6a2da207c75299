"""`gpuguard check` and `gpuguard snapshot`: this host (or a saved dump), judged or recorded.

Imports are local: `gpuguard check --format table` must not pay for docker,
prometheus_client or apscheduler, and the NVML child is forked (gpuguard/cli/entry.py)
before the rules are loaded so that both run at once."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

import click

from gpuguard.assess.inputs import HostInputs, InputProblem
from gpuguard.assess.once import Judgement
from gpuguard.cli import timing
from gpuguard.cli.options import (
    ConfigProblem,
    emit,
    host_source_options,
    path_options,
    rule_options,
)
from gpuguard.cli.values import MAX_WAIT_S, FilePath, Finite

if TYPE_CHECKING:
    from gpuguard.model.profile import Profile
    from gpuguard.model.snapshot import Snapshot
    from gpuguard.model.workload import Workload
    from gpuguard.sources.active.workers import EarlyStart


@click.command()
@click.option("--format", "fmt", type=click.Choice(["table", "json", "prometheus"]),
              default="table", show_default=True)
@click.option("--output", "-o", type=FilePath(),
              help="Write here (atomically) instead of stdout.")
@click.option("--only", multiple=True, metavar="RULE",
              help="Run only these rules (ids or globs such as 'pcie.*'; repeatable).")
@click.option("--skip", multiple=True, metavar="RULE", help="Do not run these rules (repeatable).")
@click.option("--input", "input_path", type=FilePath(),
              help="Check a saved snapshot or an `nvidia-smi -q -x` dump instead of this host.")
@click.option("--timeout", type=Finite(min=0.2, max=MAX_WAIT_S), default=10.0, show_default=True,
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
@click.option("--active-deadline", type=Finite(min=0.5, max=600), metavar="S",
              help="Seconds the active probe may take [default: the profile's "
                   "active_probe.deadline_s, else 10].")
@click.option("--active-buffer-mib", type=click.IntRange(min=1, max=16384), metavar="MIB",
              help="Size of the bandwidth copies [default: profile, else 256].")
@click.option("--active-pattern-mib", type=click.IntRange(min=1, max=16384), metavar="MIB",
              help="Device memory memory.pattern writes and reads back [default: profile, "
                   "else 64].")
@click.option("--image", "images", multiple=True, metavar="IMAGE",
              help="Judge whether this container image's CUDA runs on this host (image.cuda; "
                   "repeatable): its configuration is read through Docker, never pulled or run.")
@click.option("--python-env", "python_envs", multiple=True, metavar="PATH",
              type=FilePath(),
              help="Judge the CUDA build of the PyTorch installed in this virtualenv, prefix "
                   "or site-packages (image.cuda; repeatable), read without importing it.")
@click.option("--record", is_flag=True,
              help="Write this run's rule transitions and Xids to the event store in "
                   "--state-dir (docs/events.md); history escalates the suggested actions.")
@rule_options
@host_source_options
@path_options
def check(fmt: str, output: Path | None, only: tuple[str, ...], skip: tuple[str, ...],
          input_path: Path | None, timeout: float, quiet: bool, fail_on: str,
          xid_window: str | None, active: str | None, active_deadline: float | None,
          active_buffer_mib: int | None, active_pattern_mib: int | None,
          images: tuple[str, ...], python_envs: tuple[Path, ...], record: bool,
          profile_path: Path | None, rules_dirs: tuple[Path, ...], kmsg_file: Path | None,
          state_dir: Path | None, docker: bool | None, host_resources: bool | None,
          probe_image: str | None, path_sysfs: Path | None,
          path_procfs: Path | None, path_rootfs: Path | None) -> None:
    """Check this host (or a saved dump) and exit 0 ok, 1 warning, 2 critical, 3 unknown."""
    started = time.monotonic()
    inputs = HostInputs(input_path, path_sysfs, path_procfs, path_rootfs, kmsg_file,
                        state_dir, profile_path, rules_dirs, timeout, probe_image, docker,
                        "auto", host_resources is True, _workloads(images, python_envs),
                        inforom_kept=True)
    judgement, early = _start(inputs, record, active is not None, only, skip)
    configured = time.monotonic()
    profile, _ = judgement.configure()
    if xid_window is not None:
        profile.xid_window_s = _window(xid_window, judgement, early)

    # Everything imported from here to the result overlaps with the NVML worker.
    from gpuguard.outputs.render import renderer

    render = renderer(fmt)
    waiting = time.monotonic()
    snapshot = judgement.snapshot()
    if active is not None:
        _active_probe(snapshot, profile, active == "force", active_deadline,
                      active_buffer_mib, active_pattern_mib, early, judgement.state_dir())
    gathered = time.monotonic()
    verdict = judgement.verdict(fail_on, only, skip, record)
    if fmt == "table" and quiet and verdict.nagios_code == 0:
        text = ""
    else:
        colour = output is None and sys.stdout.isatty() and "NO_COLOR" not in os.environ
        text = render(snapshot, verdict, duration_s=time.monotonic() - started, colour=colour,
                      quiet=quiet)
    emit(text, output)
    if os.environ.get("GPUGUARD_TIMING"):
        _print_timing(started, configured, waiting, gathered, snapshot)
    # Everything is written: exit now rather than tear the interpreter down (msgspec, click,
    # the rules: 15-20 ms on the H200 host, a fifth of the whole check; docs/benchmarks.md).
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(verdict.code)


@click.command()
@click.option("--output", "-o", type=FilePath(), help="Write here (atomically).")
@click.option("--input", "input_path", type=FilePath(),
              help="Convert an `nvidia-smi -q -x` dump into a snapshot instead of reading NVML.")
@click.option("--timeout", type=Finite(min=0.2, max=MAX_WAIT_S), default=10.0, show_default=True)
@host_source_options
@path_options
def snapshot(output: Path | None, input_path: Path | None, timeout: float,
             kmsg_file: Path | None, state_dir: Path | None, docker: bool | None,
             host_resources: bool | None, probe_image: str | None, path_sysfs: Path | None,
             path_procfs: Path | None, path_rootfs: Path | None) -> None:
    """Record this host's snapshot as JSON (replay it with `check --input`)."""
    import json

    inputs = HostInputs(input_path, path_sysfs, path_procfs, path_rootfs, kmsg_file,
                        state_dir, None, (), timeout, probe_image, docker, "on",
                        host_resources is not False, link_counters=True)
    # the site's profile says which disk paths to read; a snapshot is not judged
    snap = Judgement(inputs).snapshot()
    emit(json.dumps(snap.to_json(), indent=2) + "\n", output)


# --- helpers -----------------------------------------------------------------------


def _start(inputs: HostInputs, record: bool, active: bool, only: tuple[str, ...],
           skip: tuple[str, ...]) -> tuple[Judgement, EarlyStart | None]:
    """The judgement started: the NVML worker runs already (cli/entry.py), the host sources
    start now, and the configuration is loaded meanwhile (the sources that need the
    profile's settings get them when it is). Bad options or configuration are exit 3,
    with no worker left behind."""
    if record and inputs.input_path is not None:
        # A replay is another moment, often another host: its Xids and transitions under
        # this host's boot, aged from now, would feed this host's escalation.
        raise ConfigProblem("--record writes this host's history; it cannot record a "
                            "replayed --input (check it without --record)")
    if active and inputs.input_path is not None:
        raise ConfigProblem("--active probes this host's GPUs; it cannot check a saved "
                            "--input (a snapshot saved after a probe keeps its results)")
    judgement = Judgement(inputs)
    early = _early_probe(inputs.paths().procfs) if active else None
    try:
        judgement.configure(only, skip)
    except InputProblem:
        if early is not None:
            early.abandon()
        raise
    return judgement, early


def _print_timing(started: float, configured: float, waiting: float, gathered: float,
                  snapshot: Snapshot) -> None:
    """Where `check`'s time went (GPUGUARD_TIMING=1; docs/benchmarks.md): ms since main()
    when click had called the command, when the sources were started and the rules
    loaded, when the parent was ready to wait, when the sources were in, when it was done."""
    from gpuguard.sources import nvml

    ms = timing.ms_since_start
    # "collected" is when the parent had the worker's answer; "answered", when the worker
    # had it ready (its own clock): the earlier of the two paths shows only in the second
    answered = nvml.LAST_ANSWER["answered_s"]
    ready = f", answered {answered:.4f} s" if answered is not None else ""
    click.echo(f"gpuguard timing: command {ms(started)} ms, configured {ms(configured)} ms, "
               f"parent ready {ms(waiting)} ms, sources in {ms(gathered)} ms, "
               f"done {ms(time.monotonic())} ms; NVML worker {snapshot.nvml.elapsed_s} s "
               f"from its fork{ready}", err=True)


def _early_probe(procfs: Path) -> EarlyStart:
    """The probe's workers started beside the NVML sweep, each running cuInit while the
    sweep runs (docs/active-probe.md)."""
    from gpuguard.sources.active.workers import EarlyStart

    return EarlyStart(procfs)


def _active_probe(snapshot: Snapshot, profile: Profile, force: bool, deadline_s: float | None,
                  buffer_mib: int | None, pattern_mib: int | None,
                  early: EarlyStart | None, state_dir: Path) -> None:
    """The active probe on the GPUs the NVML sweep found (it needs their bus ids and how
    busy they are): its results become the snapshot's probe_* readings. One probe per
    host at a time: the lock is in the state dir, shared with the daemon's probe."""
    from gpuguard.sources.active.plan import LOCK_FILE, options
    from gpuguard.sources.active.workers import ActiveProbe

    opts = options(profile.probe_settings, force, deadline_s, buffer_mib, pattern_mib)
    opts.lock_path = str(state_dir / LOCK_FILE)
    ActiveProbe(snapshot, opts, early).finish(snapshot)


def _workloads(images: tuple[str, ...], python_envs: tuple[Path, ...]) -> tuple[Workload, ...]:
    """What image.cuda judges: each --image, then each --python-env, as given."""
    from gpuguard.model.workload import Workload

    return (*(Workload("image", image) for image in images),
            *(Workload("python", str(path)) for path in python_envs))


def _window(text: str, judgement: Judgement, early: EarlyStart | None) -> float | None:
    from gpuguard.config.profile import parse_window

    try:
        return parse_window(text)
    except ValueError as exc:
        judgement.abandon()  # no worker is left behind
        if early is not None:
            early.abandon()
        raise click.BadParameter(str(exc), param_hint="--xid-window") from exc
