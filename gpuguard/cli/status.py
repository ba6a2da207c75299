"""`gpuguard status`: the running daemon's latest verdict, with check's renderers, exit
codes and filters. The common path never reaches this module: gpuguard/cli/entry.py hands
the command line to gpuguard/cli/status_client.py before click loads. Here: --help, a
usage error (exit 3), and --cold when no daemon answers (a cold `gpuguard check`)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import click

from gpuguard.cli import check as check_command
from gpuguard.cli.values import MAX_WAIT_S, FilePath, Finite


@click.command()
@click.option("--format", "fmt", type=click.Choice(["table", "json", "prometheus"]),
              default="table", show_default=True)
@click.option("--output", "-o", type=FilePath(),
              help="Write here (atomically) instead of stdout.")
@click.option("--only", multiple=True, metavar="RULE",
              help="Show only these rules (ids or globs such as 'pcie.*'; repeatable).")
@click.option("--skip", multiple=True, metavar="RULE", help="Leave these rules out (repeatable).")
@click.option("--fail-on", type=click.Choice(["unknown", "warning", "critical"]),
              default="unknown", show_default=True,
              help="Lowest status that gives a non-zero exit, as for `check`.")
@click.option("--quiet", "-q", is_flag=True, help="Print only problems; nothing when all is well.")
@click.option("--socket", "socket_path", metavar="PATH",
              help="The daemon's status socket [default: /run/gpuguard/status.sock].")
@click.option("--timeout", type=Finite(min=0.1, max=MAX_WAIT_S), default=5.0, show_default=True,
              help="Seconds to wait for the daemon's answer.")
@click.option("--cold", is_flag=True,
              help="When no daemon answers, check this host now (`gpuguard check`) instead "
                   "of exit 3.")
def status(fmt: str, output: Path | None, only: tuple[str, ...], skip: tuple[str, ...],
           fail_on: str, quiet: bool, socket_path: str | None, timeout: float,
           cold: bool) -> None:
    """The daemon's latest verdict at once: exit 0 ok, 1 warning, 2 critical, 3 unknown.

    A result older than its cadence's stale_after (two of its interval and its longest
    cycle, in the header) is unknown, naming its age. No daemon answering is exit 3 (or,
    with --cold, a cold check)."""
    from gpuguard.cli import status_client
    from gpuguard.daemon import socket_client

    opts: dict[str, Any] = {"fmt": fmt, "only": list(only), "skip": list(skip), "fail_on": fail_on,
            "quiet": quiet, "output": None if output is None else str(output)}
    path = socket_path or socket_client.default_socket()
    try:
        reply = socket_client.ask(path, status_client.request_of(opts), timeout)
    except socket_client.NoDaemon as exc:
        if not cold:
            click.echo(f"gpuguard: {exc}; nothing was checked (`gpuguard status --cold` "
                       "checks this host itself)", err=True)
            sys.exit(status_client.EXIT_UNKNOWN)
        click.echo(f"gpuguard: {exc}: checking this host now (--cold)", err=True)
        click.get_current_context().invoke(check_command.check, fmt=fmt, output=output,
                                           only=only, skip=skip, fail_on=fail_on,
                                           quiet=quiet)
        return
    sys.exit(status_client.show(reply, opts["output"]))
