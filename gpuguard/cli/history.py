"""`gpuguard events`, `gpuguard ack` and `gpuguard xid ack`: the event store from the
command line (gpuguard/events/commands.py does the work)."""

from __future__ import annotations

import math
from pathlib import Path

import click

from gpuguard.assess.inputs import load_configuration
from gpuguard.cli.options import (
    ConfigProblem,
    kmsg_device_option,
    paths_from,
    rule_options,
    span_option,
    state_dir_option,
)
from gpuguard.cli.rule_ids import complete_rule_id
from gpuguard.cli.values import FilePath
from gpuguard.events.kinds import KINDS


@click.group()
def xid() -> None:
    """Kernel-log Xids."""


@xid.command("ack")
@state_dir_option()
@click.option("--path.procfs", "path_procfs", show_default="/proc",
              type=FilePath(), help="procfs mount point (for the boot id).")
@kmsg_device_option()
def xid_ack(state_dir: Path | None, path_procfs: Path | None, kmsg_device: Path | None) -> None:
    """Stop the Xids logged so far (this boot) from counting in xid.recent."""
    from gpuguard.io.paths import host_default, state_dir_or_default
    from gpuguard.sources import boot_state, kmsg

    state_dir = state_dir_or_default(state_dir)
    paths = paths_from(None, path_procfs, None)
    log = kmsg.read_device(kmsg_device or host_default("kmsg"))
    if not log.is_ok or log.value is None:
        raise ConfigProblem(log.describe())
    seqs = [e["seq"] for e in log.value["xids"] if e.get("seq") is not None]
    if not seqs:
        click.echo("no Xid in the kernel log: nothing to acknowledge")
        return
    try:
        boot_state.write_xid_ack(state_dir, paths, max(seqs))
    except OSError as exc:
        raise ConfigProblem(f"cannot write {state_dir}: {exc.strerror or exc}") from exc
    click.echo(f"acknowledged {len(seqs)} Xid line(s) up to kmsg sequence {max(seqs)}")
    from gpuguard.events.ack_command import record_xid_ack

    record_xid_ack(state_dir, paths, max(seqs), len(seqs))


def _finite_span(text: str, option: str, most_s: float | None = None) -> float:
    """A span of the command line (90s, 15m, 24h, 30d) that is a finite number of seconds,
    at most `most_s`: `infd` or `1e400d` would be written, then break every reader."""
    seconds = span_option(text, option)
    if not math.isfinite(seconds) or (most_s is not None and seconds > most_s):
        limit = "" if most_s is None else f" of at most {most_s / 86400:.0f}d"
        raise ConfigProblem(f"{option}: a span{limit} such as 90s, 15m, 24h, 30d, "
                            f"not {text!r}")
    return seconds


@click.command("events")
@click.option("--since", default="24h", show_default=True, metavar="SPAN",
              help="Events of the last SPAN (90s, 15m, 24h, 30d).")
@click.option("--gpu", metavar="N|UUID|SERIAL", help="Only this GPU (by index, UUID or serial).")
@click.option("--rule", "rule_id", metavar="ID", shell_complete=complete_rule_id,
              help="Only this rule (xid.recent for Xids).")
@click.option("--kind", "kinds", multiple=True,
              type=click.Choice(KINDS),
              help="Only these kinds (repeatable).")
@click.option("--format", "fmt", type=click.Choice(["table", "json"]), default="table",
              show_default=True)
@click.option("--limit", type=click.IntRange(min=1, max=100_000), default=200,
              show_default=True, help="At most this many, newest first.")
@state_dir_option()
def events_cmd(since: str, gpu: str | None, rule_id: str | None, kinds: tuple[str, ...],
               fmt: str, limit: int, state_dir: Path | None) -> None:
    """What happened: rule transitions, Xids, repairs, failovers, acks (any user may read)."""
    from gpuguard.events.commands import CannotRead, stream_events
    from gpuguard.io.paths import state_dir_or_default

    state_dir = state_dir_or_default(state_dir)

    try:
        # a batch of rows at a time: 100 000 rows are not held at once (issue 32)
        stream_events(state_dir, _finite_span(since, "--since"), gpu, rule_id, kinds, fmt,
                      limit, write=lambda text: click.echo(text, nl=False))
    except CannotRead as exc:
        raise ConfigProblem(str(exc)) from exc


@click.command("ack")
@click.argument("rule_id", metavar="RULE", shell_complete=complete_rule_id)
@click.option("--gpu", metavar="N|UUID|SERIAL",
              help="The GPU (required for a GPU rule: an ack names one board).")
@click.option("--reason", required=True, help="Why, for `gpuguard events`.")
@click.option("--for", "duration", default="24h", show_default=True, metavar="SPAN",
              help="How long the ack holds at most (it ends earlier when the finding "
                   "changes).")
@state_dir_option()
@click.option("--path.procfs", "path_procfs", show_default="/proc",
              type=FilePath(), help="procfs mount point (for the boot id).")
@kmsg_device_option()
@rule_options
def ack(rule_id: str, gpu: str | None, reason: str, duration: str, state_dir: Path | None,
        path_procfs: Path | None, kmsg_device: Path | None, profile_path: Path | None,
        rules_dirs: tuple[Path, ...]) -> None:
    """Acknowledge RULE's finding as the event store last recorded it (its status, and
    for a host rule what it names; a per-GPU result of a host rule, such as xid.recent's,
    with --gpu): its suggested action becomes none (its status stays)
    until the finding changes or the time is up. A rule that is ok, or a GPU the store
    never recorded, is refused."""
    from gpuguard.events.ack_command import AckRefused, record_ack
    from gpuguard.events.acks import ACK_MAX_S

    _, ruleset = load_configuration(profile_path, rules_dirs)
    if rule_id not in ruleset.rules:
        raise ConfigProblem(f"no rule {rule_id!r}; see `gpuguard rules list`")
    scope = ruleset.rules[rule_id].scope
    if scope == "gpu" and gpu is None:
        raise ConfigProblem(f"{rule_id} is a GPU rule: name the GPU with --gpu (an ack "
                            "covers one board's finding)")
    # a host rule with --gpu: the result it gives that GPU (xid.recent, sxid.recent and
    # gsp.firmware give one per GPU); the store refuses a GPU it recorded no finding on
    seconds = _finite_span(duration, "--for", ACK_MAX_S)
    from gpuguard.io.paths import host_default, state_dir_or_default

    # `ack xid.recent` also acknowledges the kernel log's lines (as `xid ack` does)
    kmsg = kmsg_device if kmsg_device is not None or rule_id not in (
        "xid.recent", "sxid.recent") else host_default("kmsg")
    try:
        click.echo(record_ack(state_dir_or_default(state_dir), paths_from(None, path_procfs, None),
                              kmsg, rule_id, gpu, reason, seconds))
    except AckRefused as exc:
        raise ConfigProblem(str(exc)) from exc
