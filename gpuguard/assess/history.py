"""The history step of a judgement: what the state dir's past does to this run's results
(acks, escalation; with --record, this run written first). The daemon keeps its history
in memory (daemon/recorder.py: a thread does the disk); a cold path reads the store once
(StoreHistory). Either is handed to gpuguard/assess/once.judge, which applies it: no
consumer applies history beside the judgement."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from gpuguard.io.paths import Paths
    from gpuguard.model.results import Result
    from gpuguard.model.rule import RuleSet
    from gpuguard.model.snapshot import Snapshot


class History(Protocol):
    def apply(self, results: list[Result], snapshot: Snapshot,
              ruleset: RuleSet) -> list[Result]:
        """The results with history's verdicts applied (never raises for a bad store)."""
        ...


class StoreHistory:
    """The event store in a state dir, read once (and this run recorded, `record`). A
    store that is not there changes nothing and costs no import."""

    def __init__(self, state_dir: Path, paths: Paths, record: bool = False) -> None:
        self.state_dir = state_dir
        self.paths = paths
        self.record = record

    def apply(self, results: list[Result], snapshot: Snapshot,
              ruleset: RuleSet) -> list[Result]:
        if not self.record and not (self.state_dir / "events.db").is_file():
            return results
        from gpuguard.events.commands import with_history

        return with_history(results, snapshot, ruleset, self.state_dir, self.paths,
                            self.record)
