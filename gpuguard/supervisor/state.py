"""The supervisor's state on disk: which variant serves, since when, why, and the step of
a transition in progress. Written atomically and fsynced before every step, so a restart
after SIGKILL knows where it stopped. A file that cannot be read is moved aside and
reported, never trusted and never silently replaced by "gpu"."""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from gpuguard.atomic import write_text


@dataclass
class Transition:
    to: str  # "cpu" or "gpu"
    step: str
    reason: str
    started: float


@dataclass
class ServiceState:
    active: str = "gpu"
    since: float = field(default_factory=time.time)
    reason: str = "initial"
    transition: Transition | None = None
    failed_cycles: int = 0
    healthy_cycles: int = 0
    on_cpu_since: float | None = None
    errors: int = 0
    next_retry: float = 0.0
    transitions: dict[str, int] = field(default_factory=lambda: {"to_cpu": 0, "to_gpu": 0})
    last_transition: float | None = None


class CorruptState(Exception):
    def __init__(self, path: Path, moved_to: Path, reason: str) -> None:
        self.path, self.moved_to, self.reason = path, moved_to, reason
        super().__init__(f"{path}: {reason}; moved aside to {moved_to}")


def path_for(state_dir: Path, service: str) -> Path:
    return state_dir / f"failover-{service}.json"


def save(path: Path, state: ServiceState) -> None:
    os.makedirs(path.parent, exist_ok=True)
    write_text(path, json.dumps(asdict(state), indent=1) + "\n", mode=0o600)


def load(path: Path) -> ServiceState | None:
    """None when there is no file yet; CorruptState when there is one we cannot trust."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    try:
        raw: dict[str, Any] = json.loads(text)
        transition = raw.pop("transition", None)
        state = ServiceState(**raw)
        if state.active not in ("gpu", "cpu"):
            raise ValueError(f"active is {state.active!r}")
        if transition is not None:
            state.transition = Transition(**transition)
            if state.transition.to not in ("gpu", "cpu"):
                raise ValueError(f"transition.to is {state.transition.to!r}")
        return state
    except (ValueError, TypeError) as exc:
        moved = path.with_name(f"{path.name}.corrupt-{int(time.time())}")
        os.replace(path, moved)
        raise CorruptState(path, moved, f"not a valid state file ({exc})") from exc


def request_path(state_dir: Path, service: str) -> Path:
    return state_dir / f"failover-{service}.request.json"
