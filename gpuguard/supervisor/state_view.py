"""`gpuguard failover status`: the supervisor's state files as lines, read through
state.py (the one reader of them), never changed."""

from __future__ import annotations

import os
from pathlib import Path

from gpuguard.io.clock import utc
from gpuguard.supervisor.state import CannotAccess, ServiceState, Unreadable, read


def describe_all(state_dir: Path) -> tuple[list[str], int]:
    """The lines of `gpuguard failover status`, and how many state files were unreadable
    (each has its own `PATH: unreadable (why)` line)."""
    try:
        names = sorted(entry.name for entry in os.scandir(state_dir))
    except FileNotFoundError:
        names = []
    except OSError as exc:
        raise CannotAccess(f"cannot read {state_dir}: {exc.strerror or exc}") from exc
    files = [n for n in names if n.startswith("failover-") and n.endswith(".json")
             and not n.endswith(".request.json")]
    if not files:
        return [f"no supervised service has state in {state_dir}"], 0
    lines: list[str] = []
    bad = 0
    for name in files:
        path = state_dir / name
        try:
            current = read(path)
        except Unreadable as exc:
            lines.append(f"{path}: unreadable ({exc.reason})")
            bad += 1
            continue
        if current is None:  # removed while we looked
            continue
        lines.extend(describe(name.removeprefix("failover-").removesuffix(".json"), current))
    return lines, bad


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
