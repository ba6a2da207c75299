"""`gpuguard slurm health|prolog|epilog`: Slurm acting on gpuguard's verdict (docs/slurm.md).
The decisions are integrations/slurm/'s; the runs integrations/slurm/health.py's and
integrations/slurm/jobs.py's. slurmd runs each with an almost empty environment and no arguments:
a wrapper script (packaging/slurm/) holds the options."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import click

from gpuguard.cli.options import (
    emit_json,
    path_options,
    rule_options,
    state_dir_option,
    text_or_json_option,
)
from gpuguard.cli.values import MAX_WAIT_S, FilePath, Finite


def input_options(fn: Any) -> Any:
    for option in reversed([
        click.option("--node", metavar="NAME",
                     help="This node's Slurm name [default: $SLURMD_NODENAME, else the short "
                          "host name]."),
        click.option("--input", "input_path", type=FilePath(),
                     help="Judge a saved snapshot instead of this host (a cold check)."),
        click.option("--kmsg-file", type=FilePath(),
                     help="Read the kernel log from this file instead of /dev/kmsg."),
        state_dir_option(),
        click.option("--timeout", type=Finite(min=0.2, max=MAX_WAIT_S), default=10.0,
                     show_default=True, help="Deadline of a cold check's sources."),
    ]):
        fn = option(fn)
    return rule_options(path_options(fn))


def slurm_options(fn: Any) -> Any:
    """How to reach Slurm and the fleet brake: health's, and the prolog's and epilog's
    before they fail (a failure is Slurm's drain)."""
    for option in reversed([
        click.option("--slurm-bin", type=FilePath(), metavar="DIR",
                     help="Folder of scontrol and sinfo [default: PATH, then /usr/bin, "
                          "/usr/local/bin, /opt/slurm/bin]."),
        click.option("--slurm-conf", type=FilePath(), metavar="FILE",
                     help="The cluster's slurm.conf [default: $SLURM_CONF, else Slurm's "
                          "own]."),
        click.option("--slurm-timeout", type=Finite(min=0.5, max=MAX_WAIT_S), default=10.0,
                     show_default=True, help="Deadline of each scontrol or sinfo call."),
        click.option("--brake-percent", type=Finite(min=0, max=100), default=20.0,
                     show_default=True, help="Share of the partition drained by gpuguard "
                     "within --brake-window at which it stops draining."),
        click.option("--brake-window", type=Finite(min=0), default=600.0,
                     show_default=True, metavar="S",
                     help="Seconds the brake counts drains over."),
        click.option("--brake-cap", type=Finite(min=0, max=100), default=30.0,
                     show_default=True, help="Share of the partition drained by gpuguard "
                     "now (any age) at which it drains no more (at least one node)."),
    ]):
        fn = option(fn)
    return fn


def qualify_options(fn: Any) -> Any:
    """The return-to-service gate (docs/slurm.md#qualifying-before-a-resume): options, as
    the rest of health's settings are, in the wrapper slurmd runs."""
    for option in reversed([
        click.option("--qualify/--no-qualify", "qualify_enabled", default=True,
                     show_default=True,
                     help="Resume a drain for reset_gpu, reboot or inspect_hardware only "
                          "after a qualification of its GPUs passed (started detached); "
                          "--no-qualify: on the passive verdict alone."),
        click.option("--qualify-level", type=click.Choice(["standard", "long"]),
                     default="standard", show_default=True,
                     help="The qualification a return needs (a long one counts for "
                          "standard too)."),
        click.option("--qualify-seconds", type=Finite(min=0.5, max=3600), metavar="S",
                     help="Seconds of load instead of the level's (qualify --seconds)."),
        click.option("--qualify-targets", type=FilePath(), metavar="DIR",
                     help="Per-model target files instead of the shipped rules/gpus/ "
                          "(qualify --targets)."),
        click.option("--qualify-attempts", type=click.IntRange(min=1, max=10), default=2,
                     show_default=True, help="Attempts that did not finish (died, stopped, "
                     "past their deadline) before the node is kept drained, saying so."),
    ]):
        fn = option(fn)
    return fn


def qualify_settings_of(kw: dict[str, Any]) -> Any:
    """QualifySettings from qualify_options' values (taken out of kw)."""
    from gpuguard.integrations.slurm.gate import QualifySettings

    return QualifySettings(kw.pop("qualify_enabled"), kw.pop("qualify_level"),
                           kw.pop("qualify_seconds"), kw.pop("qualify_targets"),
                           kw.pop("qualify_attempts"))


def settings_of(kw: dict[str, Any], jitter: float = 0.0) -> tuple[Any, Any]:
    """(SlurmSettings, BrakeSettings) from slurm_options' values (taken out of kw)."""
    from gpuguard.integrations.slurm.brake import BrakeSettings
    from gpuguard.integrations.slurm.ctl import SlurmSettings

    ctl = SlurmSettings(kw.pop("slurm_bin"), kw.pop("slurm_conf"), kw.pop("slurm_timeout"))
    brake = BrakeSettings(kw.pop("brake_percent"), kw.pop("brake_window"),
                          jitter_share=jitter, cap_percent=kw.pop("brake_cap"))
    return ctl, brake


def inputs_of(kw: dict[str, Any]) -> Any:
    """What the judgement reads (gpuguard/assess/inputs.py): check's own options, Docker
    and the host's memory and disks left out (health's deadline is slurmd's)."""
    from gpuguard.assess.inputs import HostInputs

    return HostInputs(kw["input_path"], kw["path_sysfs"], kw["path_procfs"],
                      kw["path_rootfs"], kw["kmsg_file"], kw["state_dir"], kw["profile_path"],
                      kw["rules_dirs"], kw["timeout"], docker_default="off")


def state_dir_of(kw: dict[str, Any]) -> Path:
    """Where the Slurm scripts keep their records: --state-dir, else the host's."""
    from gpuguard.io.paths import state_dir_or_default

    return state_dir_or_default(kw["state_dir"])


@click.group()
def slurm() -> None:
    """Slurm: drain and resume this node on gpuguard's verdict, probe a job's GPUs."""


@slurm.command()
@input_options
@click.option("--socket", "socket_path", metavar="PATH",
              help="The daemon's status socket [default: /run/gpuguard/status.sock].")
@click.option("--no-daemon", is_flag=True, help="Always a cold check, never the daemon's.")
@slurm_options
@click.option("--brake-jitter", type=Finite(min=0, max=1), default=0.2,
              show_default=True, metavar="SHARE",
              help="Wait up to this share of HealthCheckInterval (at most 30 s) before "
                   "counting again and draining.")
@click.option("--metrics-file", type=FilePath(),
              help="Write the brake and drain state here for node_exporter's textfile "
                   "collector (the alert that needs no daemon).")
@click.option("--probe-budget", type=Finite(min=0.5, max=50), default=3.0,
              show_default=True, help="Seconds for re-probing the GPUs a prolog failed on.")
@qualify_options
@text_or_json_option()
def health(socket_path: str | None, no_daemon: bool, brake_jitter: float,
           metrics_file: Path | None, probe_budget: float, fmt: str, **kw: Any) -> None:
    """slurmd's HealthCheckProgram: drain on a critical hardware finding, resume when it is
    gone (after a drain for reset_gpu, reboot or inspect_hardware, once a qualification it
    starts detached has passed); exit 0, 2 when the fleet brake held, 3 when Slurm did not
    answer."""
    from gpuguard.daemon import socket_client
    from gpuguard.integrations.slurm.health import run_health
    from gpuguard.integrations.slurm.health_run import HealthRun
    from gpuguard.integrations.slurm.jobs import node_name

    ctl, brake = settings_of(kw, brake_jitter)
    gate = qualify_settings_of(kw)
    inputs = inputs_of(kw)
    cold = no_daemon or inputs.input_path is not None
    run = HealthRun(node_name(kw["node"]), ctl, brake, inputs, state_dir_of(kw),
                    None if cold else socket_path or socket_client.default_socket(),
                    metrics_file, probe_budget, gate)
    code = run_health(run)
    if fmt == "json":
        emit_json(run.to_json(code))
    else:
        click.echo("\n".join(f"gpuguard slurm health: {line}" for line in run.lines))
    for line in run.lost:  # slurmd logs a health program's stderr: the loss is seen there
        click.echo(f"gpuguard slurm health: {line}", err=True)
    sys.exit(code)


@slurm.command()
@input_options
@slurm_options
@click.option("--budget", type=Finite(min=0.5, max=60), default=3.0,
              show_default=True, help="Seconds the probe of the job's GPUs may take.")
def prolog(budget: float, **kw: Any) -> None:
    """slurmd's Prolog: the active probe on the job's GPUs (SLURM_JOB_GPUS); exit 1 when
    one fails it (Slurm drains the node and requeues the job), unless the fleet brake
    holds."""
    from gpuguard.integrations.slurm.jobs import Job, node_name
    from gpuguard.integrations.slurm.jobs import prolog as run

    ctl, brake = settings_of(kw)
    inputs = inputs_of(kw)
    job = Job(node_name(kw["node"]), os.environ.get("SLURM_JOB_ID", "unknown"),
              dict(os.environ), state_dir_of(kw), inputs, ctl, brake)
    code, lines = run(job, budget)
    click.echo("\n".join(f"gpuguard slurm prolog: {line}" for line in lines), err=code != 0)
    sys.exit(code)


@slurm.command()
@input_options
@slurm_options
def epilog(**kw: Any) -> None:
    """slurmd's Epilog: exit 1 on a hardware finding during the job (an Xid whose catalog
    action is reset_gpu or worse, uncorrectable ECC growth); application Xids are only
    recorded with the job id."""
    from gpuguard.integrations.slurm.jobs import Job, node_name
    from gpuguard.integrations.slurm.jobs import epilog as run

    ctl, brake = settings_of(kw)
    inputs = inputs_of(kw)
    job = Job(node_name(kw["node"]), os.environ.get("SLURM_JOB_ID", "unknown"),
              dict(os.environ), state_dir_of(kw), inputs, ctl, brake)
    code, lines = run(job)
    click.echo("\n".join(f"gpuguard slurm epilog: {line}" for line in lines), err=code != 0)
    sys.exit(code)

