"""The `gpuguard` command group: each command lives in a module of its own here."""

from __future__ import annotations

import click

from gpuguard import __version__
from gpuguard.cli import check, daemon, failover, history, qualify, rules, slurm, status


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="gpuguard")
def main() -> None:
    """Hardware preflight and health checks for NVIDIA GPU inference hosts."""


for command in (check.check, check.snapshot, history.xid, history.events_cmd, history.ack,
                daemon.daemon, failover.failover, rules.rules, status.status,
                slurm.slurm, qualify.qualify):
    main.add_command(command)
