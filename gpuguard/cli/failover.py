"""`gpuguard failover`: where the supervisor's services run, and moving them by hand."""

from __future__ import annotations

from pathlib import Path

import click

from gpuguard.cli.options import (
    ConfigProblem,
    emit_json,
    state_dir_option,
    text_or_json_option,
)
from gpuguard.cli.values import MAX_WAIT_S, Finite

SCHEMA = 1  # of status's JSON document (gpuguard/outputs/schemas/failover-status.schema.json)


@click.group()
def failover() -> None:
    """The supervisor's services: where they run, and moving them by hand."""


@failover.command("status")
@state_dir_option()
@text_or_json_option()
def failover_status(state_dir: Path | None, fmt: str) -> None:
    """Which variant of each service serves, since when and why."""
    from gpuguard.io.paths import state_dir_or_default
    from gpuguard.supervisor import state, state_view

    state_dir = state_dir_or_default(state_dir)
    try:
        if fmt == "json":
            unreadable = _print_json(state_dir)
        else:
            lines, unreadable = state_view.describe_all(state_dir)
            for line in lines:
                click.echo(line)
            from gpuguard.events.commands import last_transitions

            for line in last_transitions(state_dir):
                click.echo(line)
    except state.CannotAccess as exc:
        raise ConfigProblem(str(exc)) from exc
    if unreadable:
        raise ConfigProblem(f"{unreadable} state file(s) in {state_dir} could not be read")


def _print_json(state_dir: Path) -> int:
    """The document of `failover status --format json`; how many state files were
    unreadable (the command then exits 3, as the text's does, after printing it)."""
    from gpuguard.events.commands import recent_transitions
    from gpuguard.supervisor import state_view

    states, unreadable = state_view.read_all(state_dir)
    found, problem = recent_transitions(state_dir)
    emit_json({"schema": SCHEMA, "state_dir": str(state_dir),
               "services": [state_view.as_json(name, st) for name, st in states],
               "unreadable": [{"path": str(path), "reason": why} for path, why in unreadable],
               "transitions": [e.to_json() for e in found], "event_store_problem": problem})
    return len(unreadable)


@failover.command("to")
@click.argument("variant", type=click.Choice(["cpu", "gpu"]))
@click.argument("service")
@click.option("--reason", required=True, help="Why, for the log and `failover status`.")
@state_dir_option()
@click.option("--wait", type=Finite(min=0, max=MAX_WAIT_S), default=120.0, show_default=True,
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
