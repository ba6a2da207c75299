"""A qualification started in the background (issue 30): Slurm's health program must end
within slurmd's 60 s, and a `standard` run may take that long, so `slurm health` starts
`gpuguard qualify` in a session of its own (setsid: slurmd killing the health program's
process group does not reach it) and returns; a later run reads what it recorded (the
event store, records.py). The daemon does the same for a supervisor's failback.

One record per state dir, `qualify-detached.json`: who was started, when, for which GPUs,
which attempt. A run is alive while its pid lives and is still a gpuguard qualify (a pid
reused after a reboot or by another program is not ours); the record says the boot it
was started in, so a reboot ends it."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field

from gpuguard.io.atomic import write_text

TYPE_CHECKING = False
if TYPE_CHECKING:
    from pathlib import Path

RECORD = "qualify-detached.json"
LOG = "qualify-detached.log"
MAX_RECORD = 64 * 1024


@dataclass
class Detached:
    pid: int
    started_at: float          # wall clock, for "since T" and for the events it matches
    boot_id: str | None
    level: str
    gpus: list[int] = field(default_factory=list)
    attempt: int = 1
    purpose: str = ""          # "slurm", "failback llm": who asked, for the reader


def start(state_dir: Path, gpus: list[int], *, level: str = "standard",
          boot_id: str | None = None, attempt: int = 1, purpose: str = "",
          extra_args: tuple[str, ...] = (), env: dict[str, str] | None = None,
          record_file: str = RECORD) -> Detached:
    """Start `gpuguard qualify` on these GPUs in its own session and record it. Its output
    goes to a log in the state dir; its verdict to the event store."""
    return launch(state_dir, gpus, level=level, boot_id=boot_id, attempt=attempt,
                  purpose=purpose, extra_args=extra_args, env=env, record_file=record_file)[0]


def launch(state_dir: Path, gpus: list[int], *, level: str = "standard",
           boot_id: str | None = None, attempt: int = 1, purpose: str = "",
           extra_args: tuple[str, ...] = (), env: dict[str, str] | None = None,
           record_file: str = RECORD) -> tuple[Detached, subprocess.Popen[bytes]]:
    """start(), and the process for a caller that owns it (the daemon: it polls it and
    kills it when it stops). `record_file` names the record (its log beside it): one per
    owner, so the daemon's runs never overwrite Slurm's record in a shared state dir."""
    state_dir.mkdir(parents=True, exist_ok=True)
    bundles = state_dir / "qualify-bundles"
    bundles.mkdir(exist_ok=True)
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    owner = "" if record_file == RECORD else f"{record_file.removesuffix('.json')}-"
    command = [sys.executable, "-m", "gpuguard", "qualify", "--level", level,
               "--state-dir", str(state_dir), "--format", "json",
               "--bundle", str(bundles / f"{stamp}-{owner}{attempt}.json"),
               *(("--purpose", purpose) if purpose else ()),
               *[a for gpu in gpus for a in ("--gpu", str(gpu))], *extra_args]
    with (state_dir / log_of(record_file)).open("ab") as log:
        proc = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                                start_new_session=True, close_fds=True,
                                env={**os.environ, **(env or {})})
    record = Detached(pid=proc.pid, started_at=time.time(), boot_id=boot_id, level=level,
                      gpus=list(gpus), attempt=attempt, purpose=purpose)
    write_text(state_dir / record_file, json.dumps(asdict(record)) + "\n", mode=0o600)
    return record, proc


def log_of(record_file: str) -> str:
    """The log beside a record: qualify-detached.json's is qualify-detached.log."""
    return f"{record_file.removesuffix('.json')}.log"


def load(state_dir: Path, record_file: str = RECORD) -> Detached | None:
    """The record, or None when there is none or it is not one of ours (a bad file
    starts nothing by itself: the caller starts a new run)."""
    path = state_dir / record_file
    try:
        with path.open("rb") as f:
            raw = json.loads(f.read(MAX_RECORD))
        record = Detached(pid=int(raw["pid"]), started_at=float(raw["started_at"]),
                          boot_id=raw.get("boot_id"), level=str(raw["level"]),
                          gpus=[int(g) for g in raw.get("gpus", [])],
                          attempt=int(raw.get("attempt", 1)), purpose=str(raw.get("purpose", "")))
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return record if record.pid > 0 else None


def alive(record: Detached, procfs: Path, boot_id: str | None) -> bool:
    """Whether the recorded run still runs: same boot, its pid alive and a gpuguard
    qualify (read from /proc/PID/cmdline under --path.procfs)."""
    if record.boot_id and boot_id and record.boot_id != boot_id:
        return False
    try:
        with (procfs / str(record.pid) / "cmdline").open("rb") as f:
            words = f.read(4096).split(b"\0")
    except OSError:
        return False
    return b"gpuguard" in b" ".join(words) and b"qualify" in words


def clear(state_dir: Path, record_file: str = RECORD) -> None:
    """Forget the record (its result has been read and acted on)."""
    with contextlib.suppress(FileNotFoundError):
        (state_dir / record_file).unlink()
