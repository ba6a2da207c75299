"""The return-to-service gate of `gpuguard slurm health` (issue 30, docs/slurm.md#qualifying-
before-a-resume): a node gpuguard drained for reset_gpu, reboot or inspect_hardware is
resumed only once its passive verdict is clean (integrations/slurm/resume.py) *and* each
of its GPUs passed a `standard` qualification (gpuguard/qualify/) that started after the
gate: the drain, and the clearing evidence after it (a GPU reset or driver reload the
store recorded for those boards). After a reboot since the drain, only a qualification of
this boot counts. Drains for failover, restart_app or update_software are not gated.

`decide` is the whole decision, pure, on what the run read (Facts); health does what the
Step says (integrations/slurm/qualifying.py): a qualification is started detached and
never waited for, since slurmd kills its health program after 60 s and a standard run
may take that long. One step per run, the first that applies:

  our last attempt alive, within its deadline        WAIT     keep: qualifying since T
  our last attempt alive, past its deadline           STOP     kill it; a later run retries
  no GPU to qualify                                   RESUME
  each GPU's newest qualification since the gate passed   RESUME
  one finished and did not pass (critical, warning)   FAIL     the reason: its finding
  none yet, or one that did not finish (unknown, or nothing recorded):
    the node still running jobs                       BUSY     keep
    the node idle, this gate's attempts used up       GIVE_UP  keep, saying so
    the node idle, attempts left                      START    keep: qualifying since T

A drill (qualify --inject-bit-flip) is never evidence either way; a `quick` run is not a
`standard` one.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING, Any

from gpuguard.integrations.slurm import reason as grammar
from gpuguard.io.clock import utc
from gpuguard.qualify.records import Board, latest

if TYPE_CHECKING:
    from pathlib import Path

    from gpuguard.qualify.records import Qualification

# the drains whose way back is a qualification (the reason's action word)
GATED = ("reset_gpu", "reboot", "inspect_hardware")
# a finished run that did not pass: its finding; an unknown one did not finish (a stop, a
# refusal, a hang) and vouches for nothing either way
FINDING = ("critical", "warning")
ATTEMPT_FIELDS = ("pid", "started_at", "number", "gate", "deadline_at")


def gated(reason: str) -> bool:
    """Whether this gpuguard reason's drain waits for a qualification."""
    found = grammar.parse(reason)
    return found is not None and found.word in GATED


def action_of(reason: str) -> str:
    found = grammar.parse(reason)
    return found.word if found is not None else "unknown"


def purpose(node: str, drained_at: float, reason: str) -> str:
    """What the qualification decides, as its event keeps it (qualify --purpose): the
    drain it ends, so that `gpuguard events` shows the two together."""
    return f"slurm resume of {node} drained at {utc(drained_at)} for {action_of(reason)}"


@dataclass(frozen=True)
class QualifySettings:
    """`slurm health`'s --qualify* options (gpuguard/cli/slurm.py)."""

    enabled: bool = True
    level: str = "standard"
    seconds: float | None = None   # the load's length (qualify --seconds)
    targets: Path | None = None    # qualify --targets
    max_attempts: int = 2


@dataclass(frozen=True)
class Attempt:
    """The qualification health started last (the drain record keeps it)."""

    pid: int
    started_at: float        # wall clock
    number: int              # 1, 2, ... for this gate
    gate: float              # the gate it was started for (a later gate starts again)
    deadline_at: float       # wall clock: alive past it, it is stopped
    boot_id: str | None = None
    gpus: tuple[int, ...] = ()
    gave_up: bool = False    # the give-up was said (an event once, not every run)

    def to_json(self) -> dict[str, Any]:
        return {"pid": self.pid, "started_at": self.started_at, "number": self.number,
                "gate": self.gate, "deadline_at": self.deadline_at, "boot_id": self.boot_id,
                "gpus": list(self.gpus), "gave_up": self.gave_up}

    @classmethod
    def from_json(cls, raw: Any) -> Attempt | None:
        """None for anything but what to_json wrote."""
        if not isinstance(raw, dict) or not all(_number(raw.get(k)) for k in ATTEMPT_FIELDS) \
                or not isinstance(raw["pid"], int) or not isinstance(raw["number"], int):
            return None
        gpus, boot = raw.get("gpus", []), raw.get("boot_id")
        if not isinstance(gpus, list) or not all(isinstance(g, int) and not isinstance(g, bool)
                                                 for g in gpus) \
                or not isinstance(boot, str | None) \
                or not isinstance(raw.get("gave_up", False), bool):
            return None
        return cls(raw["pid"], float(raw["started_at"]), raw["number"], float(raw["gate"]),
                   float(raw["deadline_at"]), boot, tuple(gpus), raw.get("gave_up", False))


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) \
        and math.isfinite(value)


@dataclass(frozen=True)
class Target:
    """A GPU of the drain record, where NVML has it now."""

    index: int
    board: Board


@dataclass(frozen=True)
class Facts:
    now: float
    gate: float                   # a qualification counts when it started at or after it
    gate_why: str                 # "the drain at T", "a GPU reset at T"
    targets: tuple[Target, ...]
    found: tuple[Qualification, ...]  # the store's, newest first
    attempt: Attempt | None
    alive: bool                   # the attempt's process still runs
    idle: bool                    # no job on the node (a qualification takes whole GPUs)
    max_attempts: int = 2
    level: str = "standard"
    boot_id: str | None = None
    new_boot: bool = False        # rebooted since the drain: only this boot's runs count


class Verb(StrEnum):
    WAIT = "wait"
    STOP = "stop"
    RESUME = "resume"
    FAIL = "fail"
    BUSY = "busy"
    GIVE_UP = "give up"
    START = "start"
    OFF = "off"          # --no-qualify: the passive verdict alone
    CANNOT = "cannot"    # a replayed snapshot: no board here to qualify


@dataclass(frozen=True)
class Step:
    verb: Verb
    why: str
    reason: str | None = None          # FAIL: the qualify finding in the reason grammar
    gpus: tuple[int, ...] = ()          # START: the GPUs to qualify (NVML indexes)
    number: int = 0                     # START: which attempt
    gate: float = 0.0                   # START: the gate it is started for
    evidence: tuple[Qualification, ...] = field(default_factory=tuple)  # RESUME, FAIL


def _since(attempt: Attempt, f: Facts) -> str:
    return f"qualifying since {utc(attempt.started_at)} (attempt {attempt.number} of " \
           f"{f.max_attempts}, pid {attempt.pid})"


def decide(f: Facts) -> Step:
    """The step (see the module's doc)."""
    if f.attempt is not None and f.alive:
        return _running(f.attempt, f)
    if not f.targets:
        return Step(Verb.RESUME, "no GPU to qualify")
    newest = _newest(f)
    if all(q is not None and q.passed for _, q in newest):
        return Step(Verb.RESUME, f"every GPU passed a {f.level} qualification since "
                    f"{f.gate_why}", evidence=tuple(q for _, q in newest if q is not None))
    failed = [(t, q) for t, q in newest
              if q is not None and not q.passed and q.status in FINDING]
    if failed:
        return _failed(failed, f)
    return _again(newest, f)


def _running(attempt: Attempt, f: Facts) -> Step:
    """Ours still runs: waited for, or stopped once past its deadline."""
    if f.now <= attempt.deadline_at:
        return Step(Verb.WAIT, _since(attempt, f))
    return Step(Verb.STOP, f"the qualification started at {utc(attempt.started_at)} "
                f"(pid {attempt.pid}) outlived its deadline of {utc(attempt.deadline_at)}: "
                "stopped, a later run retries")


def _newest(f: Facts) -> list[tuple[Target, Qualification | None]]:
    """Each GPU's newest qualification that counts (not a drill; this boot's after a
    reboot since the drain; the level or above; started at or after the gate)."""
    counted = [q for q in f.found if not q.drill and (not f.new_boot or q.boot_id == f.boot_id)]
    return [(t, latest(counted, t.board, f.level, f.gate)) for t in f.targets]


def _again(newest: list[tuple[Target, Qualification | None]], f: Facts) -> Step:
    """None yet, or one that did not finish: a (next) attempt, once the node is idle and
    while attempts for this gate are left."""
    if not f.idle:
        return Step(Verb.BUSY, "waiting for the node's jobs to end before qualifying its GPUs")
    tried = f.attempt.number if f.attempt is not None and f.attempt.gate == f.gate else 0
    if tried >= f.max_attempts:
        last = next((q for _, q in newest if q is not None and not q.passed), None)
        what = f"the last: {last.message}" if last is not None else \
            "no result recorded: they died or outlived their deadline; their output is " \
            "the state dir's qualify-detached.log"
        return Step(Verb.GIVE_UP, f"not qualified: {tried} attempt(s) since {f.gate_why} did "
                    f"not finish ({what}); kept drained: a passing `gpuguard qualify` "
                    "resumes it, or resume by hand")
    todo = tuple(t.index for t, q in newest if q is None or not q.passed)
    return Step(Verb.START, f"qualifying since {utc(f.now)} (attempt {tried + 1} of "
                f"{f.max_attempts}, GPU(s) {', '.join(map(str, todo))})",
                gpus=todo, number=tried + 1, gate=f.gate)


def _failed(failed: list[tuple[Target, Qualification]], f: Facts) -> Step:
    """The first failing GPU's worst qualify rule, as gpuguard's reason: the action its
    rule suggests where that is one that drains (qualify.run: reset_gpu), else
    inspect_hardware (a warning's `none` would read as a drain that needs no gate)."""
    target, q = min(failed, key=lambda tq: tq[0].index)
    rule = worst_rule(q)
    action = q.action if q.action in GATED else "inspect_hardware"
    # the GPU's NVML index now, as every reason names it (the run's may predate a renumber)
    reason = grammar.Reason.of(action, rule, target.index, len(failed) - 1).text()
    return Step(Verb.FAIL, f"the {q.level} qualification of GPU {target.index} "
                f"({target.board.describe()}) started at {utc(q.started_at)} did not pass: "
                f"{q.message[:200]}", reason=reason, evidence=tuple(q for _, q in failed))


def worst_rule(q: Qualification) -> str:
    """The rule the event names (its status is the worst; among equals qualify.run)."""
    worst = [rule for rule, status in q.results if status == q.status]
    if "qualify.run" in worst:
        return "qualify.run"
    return worst[0] if worst else "qualify.run"
