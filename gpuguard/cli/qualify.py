"""`gpuguard qualify`: each idle GPU proves itself under full power (docs/qualify.md).

The host is read once (the NVML sweep says which GPUs are idle and who they are), the
run takes the host-wide probe lock, and its readings are judged by the qualify.* rules
like any other rule: the table, JSON and Prometheus output and the exit code are
`check`'s. SIGTERM or SIGINT stops it within a second, its GPUs unknown."""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING

import click

from gpuguard.assess.inputs import HostInputs
from gpuguard.assess.once import Judgement
from gpuguard.cli.options import emit, path_options, rule_options, state_dir_option
from gpuguard.cli.values import MAX_WAIT_S, FilePath, Finite

if TYPE_CHECKING:
    from types import FrameType

    from gpuguard.model.results import Verdict
    from gpuguard.model.snapshot import Snapshot
    from gpuguard.qualify.run import Outcome

LEVEL_HELP = ("quick: seconds, a taste of each part; standard (default): under a minute, "
              "the gate back into service; long: minutes of heat, after a repair")


@click.command()
@click.option("--level", type=click.Choice(["quick", "standard", "long"]), default="standard",
              show_default=True, help=LEVEL_HELP)
@click.option("--gpu", "gpus", multiple=True, type=click.IntRange(min=0, max=1023),
              metavar="INDEX", help="Qualify only this GPU (repeatable) [default: all].")
@click.option("--format", "fmt", type=click.Choice(["table", "json", "prometheus"]),
              default="table", show_default=True)
@click.option("--output", "-o", type=FilePath(), help="Write here (atomically).")
@click.option("--bundle", type=FilePath(),
              help="Write the evidence (identities, driver, measurements, sampled series, "
                   "failures) as JSON here: what a vendor asks for with an RMA.")
@click.option("--chart", type=FilePath(),
              help="Write an SVG chart of power, clocks and temperatures over the run here.")
@click.option("--seconds", "burn_s", type=Finite(min=0.5, max=3600), metavar="S",
              help="Seconds of load instead of the level's (the deadline grows with it).")
@click.option("--inject-bit-flip", "flip_sm", type=click.IntRange(min=0, max=1023),
              metavar="SM", help="Drill: every result computed on this SM gets one bit "
                                 "flipped, so the path from kernel to verdict shows on a "
                                 "good GPU. A run with it never records a pass.")
@click.option("--deadline", "deadline_s", type=Finite(min=1, max=7200), metavar="S",
              help="Seconds the whole run may take before its unfinished GPUs are unknown "
                   "[default: the level's: quick 60, standard 120, long 600].")
@click.option("--targets", "targets_dir", type=FilePath(), metavar="DIR",
              help="Judge against this folder of per-model target files instead of the "
                   "shipped rules/gpus/ (a model gpuguard does not know, a site's floors).")
@click.option("--purpose", metavar="TEXT",
              help="What this run decides (\"slurm resume of node7 drained at ...\", "
                   "\"failback of llm\"): kept with its events and bundle.")
@click.option("--seed", type=click.IntRange(min=0, max=2**32 - 1),
              help="The inputs' seed [default: random; the bundle records it].")
@click.option("--fail-on", type=click.Choice(["unknown", "warning", "critical"]),
              default="unknown", show_default=True,
              help="Lowest status that gives a non-zero exit.")
@click.option("--timeout", type=Finite(min=0.2, max=MAX_WAIT_S), default=10.0, show_default=True,
              help="Seconds before a hung driver is reported while reading the host.")
@click.option("--kmsg-file", type=FilePath(),
              help="Read the kernel log from this file instead of /dev/kmsg.")
@rule_options
@state_dir_option()
@path_options
def qualify(level: str, gpus: tuple[int, ...], fmt: str, output: Path | None,
            bundle: Path | None, chart: Path | None, burn_s: float | None,
            flip_sm: int | None, deadline_s: float | None, targets_dir: Path | None,
            purpose: str | None, seed: int | None, fail_on: str, timeout: float,
            kmsg_file: Path | None, profile_path: Path | None, rules_dirs: tuple[Path, ...],
            state_dir: Path | None,
            path_sysfs: Path | None, path_procfs: Path | None,
            path_rootfs: Path | None) -> None:
    """Qualify this host's idle GPUs under full load; exit 0 ok, 1 warning, 2 critical,
    3 unknown (a refused, stopped or unfinished GPU is unknown: it did not pass)."""
    from gpuguard.qualify.run import Request, run

    _check_targets(output=output, bundle=bundle, chart=chart)
    started = time.monotonic()
    # at once: a stop during the NVML sweep still ends with a verdict (every GPU unknown)
    stop = _stop_on_signals()
    inputs = HostInputs(None, path_sysfs, path_procfs, path_rootfs, kmsg_file, state_dir,
                        profile_path, rules_dirs, timeout, None, False, "auto", False, ())
    judgement = Judgement(inputs)
    judgement.configure(("qualify.*",))
    snapshot = judgement.snapshot()
    lock = judgement.state_dir() / "active-probe.lock"
    if targets_dir is not None:
        _load_targets(targets_dir)
    outcome = run(snapshot, Request(level=level, gpus=gpus, burn_s=burn_s, flip_sm=flip_sm,
                                    seed=seed, lock_path=str(lock), deadline_s=deadline_s,
                                    targets_dir=targets_dir), stop)
    outcome.options["purpose"] = (purpose or "")[:300]
    outcome.options["bundle"] = str(bundle) if bundle is not None else None
    verdict = _with_note(judgement.verdict(fail_on, only=("qualify.*",),
                                           source="a qualify run"), outcome)
    _write_evidence(snapshot, outcome, verdict, bundle, chart, judgement)
    from gpuguard.outputs.render import renderer

    colour = output is None and sys.stdout.isatty() and "NO_COLOR" not in os.environ
    emit(renderer(fmt)(snapshot, verdict, duration_s=time.monotonic() - started,
                       colour=colour, quiet=False), output)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(verdict.code)


def _with_note(verdict: Verdict, outcome: Outcome) -> Verdict:
    """The table's header says what ran (its first line is `check`'s)."""
    import dataclasses

    from gpuguard.sources.qualify.plan import LEVEL_TABLE

    level = str(outcome.options.get("level"))
    what = LEVEL_TABLE[level].describe(outcome.options.get("burn_s"))
    ran = (f"gpuguard qualify --level {level}: {what}; "
           f"{len(outcome.readings)} GPU(s) in {outcome.seconds:.1f} s"
           + (f"; stopped by a signal, its workers gone {outcome.freed_after_s:.2f} s after it"
              if outcome.stopped and outcome.freed_after_s is not None else ""))
    return dataclasses.replace(verdict, notes=(*verdict.notes, ran))


def _check_targets(**paths: Path | None) -> None:
    """Where the output, the bundle and the chart go, checked before any GPU is touched:
    a run of a minute whose evidence then cannot be written is bad input (exit 3)."""
    from gpuguard.cli.options import ConfigProblem
    from gpuguard.io.atomic import check_writable_target

    for name, path in paths.items():
        if path is None:
            continue
        try:
            check_writable_target(path)
            if not path.parent.is_dir() or not os.access(path.parent, os.W_OK):
                raise OSError(0, f"its folder {path.parent} is not a writable directory")
        except OSError as exc:
            raise ConfigProblem(f"--{name} {path}: {exc.strerror or exc}") from exc


def _load_targets(folder: Path) -> None:
    """A bad targets folder is exit 3 before any GPU is touched."""
    from gpuguard.assess.inputs import InputProblem
    from gpuguard.config.gpu_targets import load_targets
    from gpuguard.config.yamlfile import ConfigError

    try:
        load_targets(folder)
    except ConfigError as exc:
        raise InputProblem(str(exc)) from exc


def _write_evidence(snapshot: Snapshot, outcome: Outcome, verdict: Verdict,
                    bundle: Path | None, chart: Path | None, judgement: Judgement) -> None:
    import json

    from gpuguard.io.atomic import write_text
    from gpuguard.qualify import evidence
    from gpuguard.sources.boot_state import boot_id

    try:
        if bundle is not None:
            write_text(bundle, json.dumps(evidence.bundle(snapshot, outcome, verdict),
                                          indent=1) + "\n")
        if chart is not None:
            from gpuguard.qualify.chart import draw

            write_text(chart, draw(snapshot, outcome))
    except OSError as exc:  # checked before the run; gone since: the verdict still stands
        print(f"gpuguard: cannot write {exc.filename}: {exc.strerror or exc}", file=sys.stderr)
    problem = evidence.record(judgement.state_dir(), boot_id(judgement.inputs.paths()),
                              snapshot, outcome, verdict)
    if problem is not None:
        print(f"gpuguard: {problem}", file=sys.stderr)


def _stop_on_signals() -> threading.Event:
    """SIGTERM and SIGINT set the event; the run kills its workers within a second."""
    stop = threading.Event()

    def handler(signum: int, frame: FrameType | None) -> None:
        stop.set()

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, handler)
    return stop
