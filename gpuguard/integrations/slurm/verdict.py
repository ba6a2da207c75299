"""The verdict `gpuguard slurm` acts on: the running daemon's (its status socket) when one
answers, else a cold check of this host (or of a replayed --input) run here with check's
own pipeline; and the active probe on a job's GPUs for the prolog."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpuguard.cli.options import (
    host_options,
    load_rules,
    paths_from,
    start_collection,
)

if TYPE_CHECKING:
    from gpuguard.model.profile import Profile
    from gpuguard.model.rule import RuleSet
    from gpuguard.model.snapshot import Snapshot


@dataclass
class Inputs:
    """check's input options, as `gpuguard slurm ...` takes them."""

    input_path: Path | None = None
    kmsg_file: Path | None = None
    profile_path: Path | None = None
    rules_dirs: tuple[Path, ...] = ()
    state_dir: Path | None = None
    timeout: float = 10.0
    sysfs: Path | None = None
    procfs: Path | None = None
    rootfs: Path | None = None


@dataclass
class Verdict:
    results: list[dict[str, Any]]
    failover_rules: set[str]
    source: str  # "daemon (pid N)", "cold check", ...
    notes: list[str] = field(default_factory=list)


def from_daemon(socket_path: str, timeout: float) -> Verdict | None:
    """The daemon's results, or None when no daemon answers (or it has none yet)."""
    from gpuguard.daemon import socket_client

    try:
        reply = socket_client.ask(socket_path, {"want": "results"}, timeout)
    except socket_client.NoDaemon:
        return None
    results = reply.get("results")
    if not isinstance(results, list) or not all(isinstance(r, dict) for r in results):
        return None
    rules = reply.get("failover_rules")
    return Verdict(results, {r for r in rules if isinstance(r, str)}
                   if isinstance(rules, list) else set(),
                   str(reply.get("note") or "the daemon's verdict"))


def snapshot_of(inputs: Inputs) -> Snapshot:
    """This host (or the replay), collected as `check` collects it."""
    paths = paths_from(inputs.sysfs, inputs.procfs, inputs.rootfs)
    opts = host_options(inputs.input_path, paths, inputs.kmsg_file, inputs.state_dir, None,
                        inputs.timeout, None, "off", None, False)
    if inputs.input_path is not None:  # no click context here: the roots given count
        opts.kernel_log = inputs.kmsg_file is not None
        opts.procfs, opts.sysfs = inputs.procfs is not None, inputs.sysfs is not None
        opts.rootfs = inputs.rootfs is not None
    return start_collection(opts, inputs.input_path, inputs.timeout,
                            link_counters=False).result()


def configuration(inputs: Inputs) -> tuple[Profile, RuleSet]:
    return load_rules(inputs.profile_path, inputs.rules_dirs)


def cold(inputs: Inputs) -> Verdict:
    """A cold check, as `gpuguard check` judges (its rules, its profile)."""
    from gpuguard.judge.engine import evaluate

    snapshot = snapshot_of(inputs)
    profile, ruleset = configuration(inputs)
    results = evaluate(snapshot, ruleset, profile)
    tagged = {r.id for r in ruleset.rules.values() if "failover" in r.tags}
    return Verdict([r.to_json() for r in results], tagged, "a cold check")


def probe(snapshot: Snapshot, profile: Profile, ruleset: RuleSet, gpus: list[int],
          budget_s: float, state_dir: Path) -> list[dict[str, Any]]:
    """The active probe on these GPUs only, within the budget: its rules' results."""
    from gpuguard.daemon.active import PROBE_RULES
    from gpuguard.judge.engine import evaluate
    from gpuguard.model.snapshot import Snapshot
    from gpuguard.sources.active.plan import LOCK_FILE, options
    from gpuguard.sources.active.workers import ActiveProbe

    chosen = Snapshot(host=snapshot.host, nvml=snapshot.nvml,
                      gpus=[g for g in snapshot.gpus if g.index in gpus])
    opts = options(profile.probe_settings, deadline_s=budget_s)
    opts.lock_path = str(state_dir / LOCK_FILE)
    ActiveProbe(chosen, opts).finish(chosen)
    return [r.to_json() for r in evaluate(chosen, ruleset, profile, only=PROBE_RULES)]
