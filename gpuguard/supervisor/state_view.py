"""`gpuguard failover status`: the supervisor's state files as lines, read through
state.py (the one reader of them), never changed."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from gpuguard.io.clock import utc
from gpuguard.supervisor.state import CannotAccess, ServiceState, Unreadable, read


def read_all(state_dir: Path) -> tuple[list[tuple[str, ServiceState]],
                                        list[tuple[Path, str]]]:
    """Every service's state in the state dir (by name), and the state files that could
    not be read, each with why."""
    try:
        names = sorted(entry.name for entry in os.scandir(state_dir))
    except FileNotFoundError:
        names = []
    except OSError as exc:
        raise CannotAccess(f"cannot read {state_dir}: {exc.strerror or exc}") from exc
    files = [n for n in names if n.startswith("failover-") and n.endswith(".json")
             and not n.endswith(".request.json")]
    states: list[tuple[str, ServiceState]] = []
    unreadable: list[tuple[Path, str]] = []
    for name in files:
        path = state_dir / name
        try:
            current = read(path)
        except Unreadable as exc:
            unreadable.append((path, exc.reason))
            continue
        if current is not None:  # None: removed while we looked
            states.append((name.removeprefix("failover-").removesuffix(".json"), current))
    return states, unreadable


def describe_all(state_dir: Path) -> tuple[list[str], int]:
    """The lines of `gpuguard failover status`, and how many state files were unreadable
    (each has its own `PATH: unreadable (why)` line)."""
    states, unreadable = read_all(state_dir)
    if not states and not unreadable:
        return [f"no supervised service has state in {state_dir}"], 0
    # in the order of the files' names, as they were read
    lines_of = {f"failover-{service}.json": describe(service, st) for service, st in states}
    lines_of.update({path.name: [f"{path}: unreadable ({why})"] for path, why in unreadable})
    return [line for name in sorted(lines_of) for line in lines_of[name]], len(unreadable)


def as_json(service: str, st: ServiceState) -> dict[str, Any]:
    """One service's state in `failover status --format json` (times as Unix seconds)."""
    t = st.transition
    return {"service": service, "active": st.active, "since": st.since, "reason": st.reason,
            "transition": None if t is None else {
                "to": t.to, "step": t.step, "reason": t.reason, "started": t.started,
                "action": t.action},
            "failed_cycles": st.failed_cycles, "healthy_cycles": st.healthy_cycles,
            "errors": st.errors, "failback_blocked": st.failback_blocked,
            "qualify_after": st.qualify_after}


def describe(service: str, st: ServiceState) -> list[str]:
    lines = [f"{service}: {st.active.upper()} since {_when(st.since)} ({st.reason})"]
    if st.transition is not None:
        t = st.transition
        lines.append(f"  moving to {t.to}, at step {t.step} ({t.reason})")
    lines.append(f"  failed cycles {st.failed_cycles}, healthy cycles {st.healthy_cycles}, "
                 f"errors {st.errors}")
    if st.active == "cpu" and st.failback_blocked:
        lines.append(f"  failback held: {st.failback_blocked}")
    elif st.active == "cpu" and st.qualify_after is not None:
        lines.append("  failback waits for a qualification of its GPUs started after "
                     f"{_when(st.qualify_after)} (asked once the GPUs read healthy)")
    return lines


def _when(stamp: float) -> str:
    try:
        return utc(stamp)
    except (OverflowError, OSError, ValueError):
        return f"{stamp!r} (not a time)"
