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

from gpuguard.cli import timing
from gpuguard.cli.options import (
    ConfigProblem,
    emit,
    host_options,
    host_source_options,
    load_rules,
    path_options,
    paths_from,
    rule_options,
    start_collection,
)

if TYPE_CHECKING:
    from gpuguard.io.paths import Paths
    from gpuguard.model.profile import Profile
    from gpuguard.model.results import Result
    from gpuguard.model.rule import RuleSet
    from gpuguard.model.snapshot import Snapshot
    from gpuguard.model.workload import Workload
    from gpuguard.sources.active.workers import EarlyStart


@click.command()
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
@click.option("--image", "images", multiple=True, metavar="IMAGE",
              help="Judge whether this container image's CUDA runs on this host (image.cuda; "
                   "repeatable): its configuration is read through Docker, never pulled or run.")
@click.option("--python-env", "python_envs", multiple=True, metavar="PATH",
              type=click.Path(path_type=Path),
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
    if record and input_path is not None:
        # A replay is another moment, often another host: its Xids and transitions under
        # this host's boot, aged from now, would feed this host's escalation.
        raise ConfigProblem("--record writes this host's history; it cannot record a "
                            "replayed --input (check it without --record)")
    paths = paths_from(path_sysfs, path_procfs, path_rootfs)
    host_opts = host_options(input_path, paths, kmsg_file, state_dir, probe_image, timeout,
                             docker, "auto", None, host_resources is True)
    host_opts.workloads = _workloads(images, python_envs)
    # The NVML worker runs already (cli/entry.py), the host sources start now, and the
    # configuration is loaded meanwhile; the sources that need the profile's settings
    # (Docker's `required`, the disk paths) get them when it is (it is read once, here).
    # check never judges the NVLink error counters (the daemon does, by growth): left out
    collection = start_collection(host_opts, input_path, timeout, link_counters=False,
                                  profile_later=True)
    early = _early_probe(paths.procfs) if active is not None and input_path is None else None
    try:
        profile, ruleset = _configuration(profile_path, rules_dirs, only, skip, xid_window,
                                          active is not None and input_path is not None)
    except click.ClickException:
        collection.abandon()  # no worker is left behind
        if early is not None:
            early.abandon()
        raise
    collection.tell(profile.docker_required, tuple(profile.disk_paths))

    # Everything imported from here to the result overlaps with the NVML worker.
    from gpuguard.judge.engine import evaluate
    from gpuguard.model.results import Verdict
    from gpuguard.outputs.render import renderer

    render = renderer(fmt)
    waiting = time.monotonic()
    snapshot = collection.result()
    if active is not None:
        from gpuguard.io.paths import state_dir_or_default

        _active_probe(snapshot, profile, active == "force", active_deadline,
                      active_buffer_mib, active_pattern_mib, early, state_dir_or_default(state_dir))
    gathered = time.monotonic()
    results = evaluate(snapshot, ruleset, profile, only, skip)
    results, notes = _history(results, snapshot, ruleset, paths, input_path, state_dir, record)
    verdict = Verdict(results, fail_on, tuple(notes))
    if fmt == "table" and quiet and verdict.nagios_code == 0:
        text = ""
    else:
        colour = output is None and sys.stdout.isatty() and "NO_COLOR" not in os.environ
        text = render(snapshot, verdict, duration_s=time.monotonic() - started, colour=colour,
                      quiet=quiet)
    emit(text, output)
    if os.environ.get("GPUGUARD_TIMING"):
        _print_timing(waiting, gathered, snapshot)
    # Everything is written: exit now rather than tear the interpreter down (msgspec, click,
    # the rules: 15-20 ms on the H200 host, a fifth of the whole check; docs/benchmarks.md).
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(verdict.code)


def _configuration(profile_path: Path | None, rules_dirs: tuple[Path, ...],
                   only: tuple[str, ...], skip: tuple[str, ...], xid_window: str | None,
                   active_on_replay: bool) -> tuple[Profile, RuleSet]:
    """The profile and rules, with the command line's filters and window checked; a bad
    one is exit 3 (ConfigProblem)."""
    profile, ruleset = load_rules(profile_path, rules_dirs)
    _check_filters(only, skip, list(ruleset.rules))
    if xid_window is not None:
        profile.xid_window_s = _window(xid_window)
    if active_on_replay:
        raise ConfigProblem("--active probes this host's GPUs; it cannot check a saved "
                            "--input (a snapshot saved after a probe keeps its results)")
    return profile, ruleset


def _history(results: list[Result], snapshot: Snapshot, ruleset: RuleSet, paths: Paths,
             input_path: Path | None, state_dir: Path | None,
             record: bool) -> tuple[list[Result], list[str]]:
    """The results with this host's history applied (and this run recorded, --record),
    and the notes the output carries."""
    if input_path is None:
        from gpuguard.io.paths import state_dir_or_default

        state = state_dir_or_default(state_dir)
        if record or (state / "events.db").is_file():
            from gpuguard.events.commands import with_history

            results = with_history(results, snapshot, ruleset, state, paths, record)
        return results, []
    if state_dir is None:
        return results, []
    # A replay is judged as it was: this host's acks do not apply to it. Said only when
    # the state dir was named (a replay reads no host path it was not given).
    from gpuguard.events.commands import acks_in_force

    acks = acks_in_force(state_dir)
    if not acks:
        return results, []
    return results, [f"{acks} ack(s) in {state_dir} do not apply to a replayed --input: "
                     "its actions are shown unacknowledged"]


@click.command()
@click.option("--output", "-o", type=click.Path(path_type=Path), help="Write here (atomically).")
@click.option("--input", "input_path", type=click.Path(path_type=Path),
              help="Convert an `nvidia-smi -q -x` dump into a snapshot instead of reading NVML.")
@click.option("--timeout", type=click.FloatRange(min=0.2), default=10.0, show_default=True)
@host_source_options
@path_options
def snapshot(output: Path | None, input_path: Path | None, timeout: float,
             kmsg_file: Path | None, state_dir: Path | None, docker: bool | None,
             host_resources: bool | None, probe_image: str | None, path_sysfs: Path | None,
             path_procfs: Path | None, path_rootfs: Path | None) -> None:
    """Record this host's snapshot as JSON (replay it with `check --input`)."""
    import json

    paths = paths_from(path_sysfs, path_procfs, path_rootfs)
    profile, _ = load_rules(None, ())  # the site's profile says which disk paths to read
    host_opts = host_options(input_path, paths, kmsg_file, state_dir, probe_image, timeout,
                             docker, "on", profile, host_resources is not False)
    snap = start_collection(host_opts, input_path, timeout).result()
    emit(json.dumps(snap.to_json(), indent=2) + "\n", output)


# --- helpers -----------------------------------------------------------------------


def _print_timing(waiting: float, gathered: float, snapshot: Snapshot) -> None:
    """Where `check`'s time went (GPUGUARD_TIMING=1; docs/benchmarks.md): ms since main()
    when the parent was ready to wait, when the sources were in, when it was done."""
    ms = timing.ms_since_start
    click.echo(f"gpuguard timing: parent ready {ms(waiting)} ms, sources in {ms(gathered)} ms, "
               f"done {ms(time.monotonic())} ms; NVML worker {snapshot.nvml.elapsed_s} s "
               "from its fork", err=True)


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


def _check_filters(only: tuple[str, ...], skip: tuple[str, ...], rule_ids: list[str]) -> None:
    from gpuguard.model.rule_filter import filter_problem

    problem = filter_problem(only, skip, rule_ids)
    if problem is not None:
        raise ConfigProblem(problem)


def _window(text: str) -> float | None:
    from gpuguard.config.profile import parse_window

    try:
        return parse_window(text)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--xid-window") from exc
