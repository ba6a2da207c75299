"""Judge this host once (issue 27): the one place that evaluates the rules and applies the
history step, for every consumer (`check`, `status --cold`, `slurm health|prolog|epilog`,
the daemon's cycles, the probes of the supervisor and the prolog).

`judge` is the step they share: the GPUs seen since boot (a GPU gone from NVML is a
finding, whichever path judges), the rules, history (acks, escalation: the daemon's in
memory, a cold path's read from the store), then the GPUs an ack of gpu.count took out
forgotten. `Judgement` is a cold path's whole run: the collection started at once (beside
the configuration's load), configured once, gathered once, judged once; a re-probe of some
GPUs reuses that snapshot and those rules.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from gpuguard.assess.inputs import HostInputs, InputProblem, load_configuration

if TYPE_CHECKING:
    from pathlib import Path

    from gpuguard.assess.gpus_seen import SeenGpus
    from gpuguard.assess.history import History
    from gpuguard.model.profile import Profile
    from gpuguard.model.results import Result, Verdict
    from gpuguard.model.rule import RuleSet
    from gpuguard.model.samples import Samples
    from gpuguard.model.snapshot import Snapshot
    from gpuguard.sources.collect import Collection


def judge(snapshot: Snapshot, profile: Profile, ruleset: RuleSet, *,
          only: Iterable[str] = (), skip: Iterable[str] = (), cadence: str | None = None,
          samples: Samples | None = None, history: History | None = None,
          seen: SeenGpus | None = None) -> list[Result]:
    """The results of the selected rules (of one cadence, for the daemon) on this
    snapshot, with the GPUs seen and history applied where given."""
    from gpuguard.judge.engine import evaluate

    if seen is not None:
        missing = seen.reading(snapshot)
        if missing is not None:  # None: the sweep cannot tell which GPUs are there
            snapshot.host.gpus_missing = missing
    results = evaluate(snapshot, ruleset, profile, only, skip, cadence=cadence,
                       samples=samples)
    if history is not None:
        results = history.apply(results, snapshot, ruleset)
    if seen is not None:
        seen.forget_acknowledged(results)
    return results


class Judgement:
    """One cold judgement of this host (or of a replayed --input). The sources start when
    it is made (the NVML worker may have started earlier still: gpuguard/cli/entry.py);
    the configuration is loaded by configure(), meanwhile."""

    def __init__(self, inputs: HostInputs, profile_later: bool = True) -> None:
        self.inputs = inputs
        self.opts = inputs.host_options()
        self.collection: Collection = _start(inputs, self.opts, profile_later)
        self._config: tuple[Profile, RuleSet] | None = None
        self._snapshot: Snapshot | None = None

    def configure(self, only: Iterable[str] = (),
                  skip: Iterable[str] = ()) -> tuple[Profile, RuleSet]:
        """The profile and rules (once), with --only/--skip checked against them; the
        host sources that need the profile (Docker's `required`, the disk paths) are told.
        A bad one is InputProblem, and no worker is left behind."""
        if self._config is None:
            try:
                config = load_configuration(self.inputs.profile_path, self.inputs.rules_dirs)
                _check_filters(list(only), list(skip), list(config[1].rules))
            except InputProblem:
                self.collection.abandon()
                raise
            self._config = config
            self.collection.tell(config[0].docker_required, tuple(config[0].disk_paths))
        return self._config

    def snapshot(self) -> Snapshot:
        """The host, gathered once under the inputs' deadline."""
        if self._snapshot is None:
            self.configure()
            _import_what_judging_needs()
            self._snapshot = self.collection.result()
        return self._snapshot

    def abandon(self) -> None:
        self.collection.abandon()

    def results(self, only: Iterable[str] = (), skip: Iterable[str] = (),
                record: bool = False) -> list[Result]:
        """The judgement: every selected rule, with the state dir's history and the
        GPUs it has seen (none for a replay without a --state-dir of its own)."""
        profile, ruleset = self.configure(only, skip)
        snapshot = self.snapshot()
        return judge(snapshot, profile, ruleset, only=only, skip=skip,
                     history=self.history(record), seen=self.seen())

    def verdict(self, fail_on: str = "unknown", only: Iterable[str] = (),
                skip: Iterable[str] = (), record: bool = False,
                source: str = "a cold check") -> Verdict:
        from gpuguard.model.results import Verdict

        results = self.results(only, skip, record)
        _, ruleset = self.configure()
        fake = self.snapshot().nvml.fake_note()
        return Verdict(results, fail_on, notes=(fake,) if fake else (), source=source,
                       failover_rules=frozenset(ruleset.failover_rules()))

    def probe(self, gpus: list[int], budget_s: float) -> list[Result]:
        """The active probe on these GPUs of the snapshot only, within the budget: its
        rules' results (no history: a probe is evidence of now). One probe per host at a
        time: the lock is in the state dir, shared with the daemon's probe."""
        from gpuguard.model.snapshot import Snapshot
        from gpuguard.sources.active.plan import LOCK_FILE, PROBE_RULES, options
        from gpuguard.sources.active.workers import ActiveProbe

        profile, ruleset = self.configure()
        snapshot = self.snapshot()
        chosen = Snapshot(host=snapshot.host, nvml=snapshot.nvml,
                          gpus=[g for g in snapshot.gpus if g.index in gpus])
        opts = options(profile.probe_settings, deadline_s=budget_s)
        opts.lock_path = str(self.state_dir() / LOCK_FILE)
        ActiveProbe(chosen, opts).finish(chosen)
        return judge(chosen, profile, ruleset, only=PROBE_RULES)

    def state_dir(self) -> Path:
        """Where this host's state is: --state-dir, else the host's default."""
        from gpuguard.io.paths import state_dir_or_default

        return state_dir_or_default(self.inputs.state_dir)

    def reads_state(self) -> bool:
        """Whether this judgement reads a state dir's history and GPUs seen: this host's
        always, a replay's only when a --state-dir was given for it."""
        return self.inputs.input_path is None or self.inputs.state_dir is not None

    def history(self, record: bool) -> History | None:
        """The store's history: this host's (its state dir), or a replay's only when a
        --state-dir was given for it (a replay is another moment, often another host)."""
        from gpuguard.assess.history import StoreHistory

        if not self.reads_state():
            return None
        return StoreHistory(self.state_dir(), self.inputs.paths(), record)

    def seen(self) -> SeenGpus | None:
        """The GPUs the daemon has seen, read and never written here (keep=False)."""
        if not self.reads_state():
            return None
        from gpuguard.assess.gpus_seen import FILE

        state = self.state_dir()
        if not (state / FILE).is_file():
            return None  # nothing seen yet: costs no more than this stat
        from gpuguard.assess.gpus_seen import SeenGpus
        from gpuguard.sources.boot_state import boot_id

        return SeenGpus(state, boot_id(self.inputs.paths()), keep=False)


def _import_what_judging_needs() -> None:
    """The modules `judge` uses, imported while the NVML worker still runs: after it has
    answered, nothing overlaps them (bench/check_before_after.py: 2.5-5 ms of a cold
    `check` went there)."""
    import gpuguard.assess.gpus_seen
    import gpuguard.assess.history
    import gpuguard.judge.engine  # noqa: F401


def _start(inputs: HostInputs, opts: object, profile_later: bool) -> Collection:
    from gpuguard.sources.collect import Collection
    from gpuguard.sources.host import HostOptions

    assert isinstance(opts, HostOptions)
    if inputs.input_path is None:
        return Collection(opts, None, inputs.timeout, inputs.link_counters, profile_later,
                          inputs.inforom_kept)
    from gpuguard.sources.replay import InputError  # the replay's error: only with --input

    try:
        return Collection(opts, inputs.input_path, inputs.timeout, inputs.link_counters,
                          profile_later)
    except InputError as exc:
        raise InputProblem(str(exc)) from exc


def _check_filters(only: list[str], skip: list[str], rule_ids: list[str]) -> None:
    from gpuguard.model.rule_filter import filter_problem

    problem = filter_problem(only, skip, rule_ids)
    if problem is not None:
        raise InputProblem(problem)
