"""One `gpuguard slurm health` run's own state (integrations/slurm/health.py runs it; the
gate's part, qualifying.py, reads and writes it too): where it reads and keeps, what it
said, what of the state dir it lost; and the events it records (`gpuguard events`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from gpuguard.integrations.slurm.gate import QualifySettings
from gpuguard.integrations.slurm.plan import BRAKE_RULE

if TYPE_CHECKING:
    from pathlib import Path

    from gpuguard.assess.inputs import HostInputs
    from gpuguard.assess.once import Judgement
    from gpuguard.integrations.slurm import brake as slurm_brake
    from gpuguard.integrations.slurm import ctl as slurm_ctl
    from gpuguard.model.results import Verdict


@dataclass
class HealthRun:
    node: str
    ctl: slurm_ctl.SlurmSettings
    brake: slurm_brake.BrakeSettings
    inputs: HostInputs
    state_dir: Path  # the Slurm records' (the inputs' --state-dir, else the host's)
    socket_path: str | None  # None: a cold check
    metrics_file: Path | None = None
    probe_budget_s: float = 3.0
    qualify: QualifySettings = field(default_factory=QualifySettings)
    lines: list[str] = field(default_factory=list)
    cold: Judgement | None = None  # this host collected, once per run (judgement())
    lost: list[str] = field(default_factory=list)  # what of the state dir was lost
    stateless: bool = False  # the state dir cannot be made: no record to read either
    # what it decided on and what it decided, for `--format json` (None: not that far)
    verdict: Verdict | None = None
    plan: dict[str, Any] | None = None

    def to_json(self, code: int) -> dict[str, Any]:
        """The run as `slurm health --format json` prints it (docs/json-output.md): the
        verdict part is Verdict.to_json's, as the daemon's socket serves it."""
        return {"schema": 1, "node": self.node, "exit_code": code,
                "verdict": None if self.verdict is None else self.verdict.to_json(),
                "plan": self.plan, "lines": list(self.lines), "lost": list(self.lost)}

    def say(self, text: str) -> None:
        self.lines.append(text)

    def lose(self, text: str) -> None:
        """A part of the state dir lost this run: said, and the run goes on without it."""
        self.lost.append(f"state: {text}")
        self.say(f"state: {text}")

    def judgement(self) -> Judgement:
        """This run's cold judgement of the host: one collection and one configuration,
        shared by the cold verdict and a re-probe."""
        if self.cold is None:
            from gpuguard.assess.once import Judgement

            self.cold = Judgement(self.inputs)
        return self.cold



def record(run: HealthRun, what: str, message: str, status: str,
           data: dict[str, Any] | None = None) -> None:
    """Into the state dir's event store (`gpuguard events`; never fatal)."""
    from gpuguard.events import store
    from gpuguard.events.writer import EventWriter

    writer = EventWriter(store.path_in(run.state_dir), integrity_check=False)
    try:
        writer.record(store.Event(kind="rule", source="slurm", rule=BRAKE_RULE
                                  if what == BRAKE_RULE else "slurm.node",
                                  status=status, message=f"{run.node}: {what}: {message}",
                                  data=data or {}))
        writer.flush()
    except Exception as exc:  # the store is history: Slurm's state and the metric still say it
        run.say(f"event not recorded: {type(exc).__name__}: {exc}")
    finally:
        writer.close()
