"""What gpuguard's Slurm scripts keep in the state dir (STATE_DIR/slurm/): a job's start
(the kernel log's position and the GPUs' ECC counts, for its epilog), and the last prolog
or epilog failure (job, time, findings, GPUs), which makes Slurm's "Prolog error" or
"Epilog error" drain gpuguard's own, and health's record of its drain (what it drained
for and the GPUs present, by identity: integrations/slurm/resume.py). Small JSON files
written atomically; a bad or foreign one reads as absent, never as a finding (a drain
record that reads as absent keeps the node drained)."""

from __future__ import annotations

import contextlib
import json
import os
import time
from pathlib import Path
from typing import Any

from gpuguard.integrations.slurm.resume import DrainRecord
from gpuguard.io.atomic import write_text
from gpuguard.io.bounded import BoundedReadError, read_text

MAX_BYTES = 256 * 1024
KEEP_JOBS_S = 30 * 86400  # a job whose epilog never ran (node crashed): its file goes
FAILURE = "script-failure.json"
DRAIN = "drain.json"


def folder(state_dir: Path) -> Path:
    path = state_dir / "slurm"
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    return path


def _read(path: Path) -> dict[str, Any] | None:
    try:
        raw = json.loads(read_text(path, MAX_BYTES, 2.0))
    except (OSError, BoundedReadError, ValueError):
        return None
    return raw if isinstance(raw, dict) else None


def _job_file(state_dir: Path, job_id: str) -> Path:
    safe = "".join(c for c in job_id if c.isalnum() or c in "_-")[:40] or "unknown"
    return folder(state_dir) / f"job-{safe}.json"


def save_job_start(state_dir: Path, job_id: str, start: dict[str, Any]) -> None:
    write_text(_job_file(state_dir, job_id), json.dumps({"job": job_id, **start}), 0o600)
    prune(state_dir)


def job_start(state_dir: Path, job_id: str) -> dict[str, Any] | None:
    try:
        return _read(_job_file(state_dir, job_id))
    except OSError:  # a state dir that cannot be made: no note (the epilog says unknown)
        return None


def forget_job(state_dir: Path, job_id: str) -> None:
    with contextlib.suppress(OSError):
        os.unlink(_job_file(state_dir, job_id))


def prune(state_dir: Path) -> None:
    cutoff = time.time() - KEEP_JOBS_S
    for path in folder(state_dir).glob("job-*.json"):
        try:
            if path.stat().st_mtime < cutoff:
                path.unlink()
        except OSError:
            continue


def record_failure(state_dir: Path, script: str, node: str, job_id: str,
                   findings: list[dict[str, Any]], gpus: list[int]) -> None:
    """A prolog or epilog failed on this node: Slurm drains it next ("Prolog error")."""
    write_text(folder(state_dir) / FAILURE, json.dumps(
        {"script": script, "node": node, "job": job_id, "time": time.time(),
         "findings": findings, "gpus": gpus}), 0o600)


def failure(state_dir: Path, node: str) -> dict[str, Any] | None:
    found = _read(folder(state_dir) / FAILURE)
    if found is None or found.get("node") != node or \
            not isinstance(found.get("time"), int | float):
        return None
    return found


def clear_failure(state_dir: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(folder(state_dir) / FAILURE)


def save_drain(state_dir: Path, node: str, record: DrainRecord) -> None:
    """What health drained for (OSError when it cannot be written: the caller says so)."""
    write_text(folder(state_dir) / DRAIN, json.dumps({"node": node, **record.to_json()}),
               0o600)


def drain_record(state_dir: Path, node: str) -> DrainRecord | None:
    try:
        found = _read(folder(state_dir) / DRAIN)
    except OSError:  # a state dir that cannot be made: no record, so no resume
        return None
    if found is None or found.get("node") != node:
        return None
    return DrainRecord.from_json(found)


def clear_drain(state_dir: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(folder(state_dir) / DRAIN)
