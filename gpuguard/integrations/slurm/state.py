"""What gpuguard's Slurm scripts keep in the state dir (STATE_DIR/slurm/): a job's start
(the kernel log's position and the GPUs' ECC counts, for its epilog), and the last prolog
or epilog failure (job, time, findings, GPUs), which makes Slurm's "Prolog error" or
"Epilog error" drain gpuguard's own, and health's record of its drain (what it drained
for and the GPUs present, by identity: integrations/slurm/resume.py). Small JSON files
written atomically.

A record is read as gpuguard wrote it or not at all: one that is missing is absent (the
first run, a clean state dir); one that is there but cannot be used (not JSON, not UTF-8,
too large, a FIFO, a symlink, a directory, another shape or another node's) is
RecordLost, which the caller says (stderr and the textfile's gpuguard_slurm_state_lost)
and then decides without it, never on a part of it. Never a finding: a lost drain record
keeps the node drained, a lost failure record leaves Slurm's drain Slurm's."""

from __future__ import annotations

import contextlib
import errno
import json
import math
import os
import re
import stat
import time
from pathlib import Path
from typing import Any

from gpuguard.config.shapes import RULE_ID_PATTERN
from gpuguard.integrations.slurm.resume import DrainRecord
from gpuguard.io.atomic import write_text
from gpuguard.io.bounded import read_text
from gpuguard.judge.actions import ACTIONS

MAX_BYTES = 256 * 1024
KEEP_JOBS_S = 30 * 86400  # a job whose epilog never ran (node crashed): its file goes
FAILURE = "script-failure.json"
DRAIN = "drain.json"
LOCK = "health.lock"
SCRIPTS = ("prolog", "epilog")


class RecordLost(Exception):
    """A record is there but cannot be used; str() says which and why."""


class AnotherNodesRecord(RecordLost):
    """The record names another node (a state dir shared between nodes): not this node's
    to use, nor to remove."""


def folder(state_dir: Path) -> Path:
    path = state_dir / "slurm"
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    return path


def _read(path: Path, what: str) -> dict[str, Any] | None:
    """The record's JSON object; None when there is none; RecordLost when one is there
    but is not a JSON object gpuguard can read (whatever the path turns out to be)."""
    try:
        if stat.S_ISLNK(os.lstat(path).st_mode):
            raise RecordLost(f"{what} {path} is a symbolic link: not gpuguard's")
        raw = json.loads(read_text(path, MAX_BYTES, 2.0))
    except OSError as exc:
        if exc.errno in (errno.ENOENT, errno.ENOTDIR):  # none, or no state dir to hold one
            return None
        raise RecordLost(f"{what} {path} cannot be read: {exc.strerror or exc}") from None
    except (ValueError, RecursionError) as exc:
        raise RecordLost(f"{what} {path} is not JSON: {str(exc)[:80]}") from None
    if not isinstance(raw, dict):
        raise RecordLost(f"{what} {path} holds a JSON {type(raw).__name__}, not a record")
    return raw


def _unlink(path: Path, what: str) -> None:
    """Remove a record (gone already: fine); RecordLost when it cannot be."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        return
    except OSError as exc:
        raise RecordLost(f"{what} {path} cannot be removed: {exc.strerror or exc}") from None


def _job_file(state_dir: Path, job_id: str) -> Path:
    safe = "".join(c for c in job_id if c.isalnum() or c in "_-")[:40] or "unknown"
    return state_dir / "slurm" / f"job-{safe}.json"


def save_job_start(state_dir: Path, job_id: str, start: dict[str, Any]) -> None:
    folder(state_dir)
    write_text(_job_file(state_dir, job_id), json.dumps({"job": job_id, **start}), 0o600)
    prune(state_dir)


def _count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def job_start(state_dir: Path, job_id: str) -> dict[str, Any] | None:
    """The prolog's note (None: none was kept); RecordLost for one that cannot be used."""
    what = f"the note of job {job_id}'s start"
    found = _read(_job_file(state_dir, job_id), what)
    if found is None:
        return None
    usec, ecc = found.get("kmsg_usec"), found.get("ecc_uncorrected")
    if found.get("job") != job_id or not (usec is None or _count(usec)) \
            or not isinstance(ecc, dict) or not all(_count(v) for v in ecc.values()):
        raise RecordLost(f"{what} is not one gpuguard's prolog wrote")
    return found


def forget_job(state_dir: Path, job_id: str) -> None:
    with contextlib.suppress(OSError, RecordLost):
        _unlink(_job_file(state_dir, job_id), "the note")


def prune(state_dir: Path) -> None:
    cutoff = time.time() - KEEP_JOBS_S
    for path in (state_dir / "slurm").glob("job-*.json"):
        try:
            if path.lstat().st_mtime < cutoff:
                path.unlink()
        except OSError:
            continue


def record_failure(state_dir: Path, script: str, node: str, job_id: str,
                   findings: list[dict[str, Any]], gpus: list[int],
                   slurmctld_time: float | None = None) -> None:
    """A prolog or epilog failed on this node: Slurm drains it next ("Prolog error"). The
    time on this node's clock, and on slurmctld's where the brake read it: Slurm's reason
    time is slurmctld's, and that is what the drain is matched with."""
    write_text(folder(state_dir) / FAILURE, json.dumps(
        {"script": script, "node": node, "job": job_id, "time": time.time(),
         "slurmctld_time": slurmctld_time, "findings": findings, "gpus": gpus}), 0o600)


def _time(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) \
        and math.isfinite(value)


def _finding(found: Any) -> bool:
    """A finding as the scripts record it: a rule id and an action gpuguard has (a reason
    made of it is one gpuguard owns), and what the plan reads of it of its type."""
    if not isinstance(found, dict) or not isinstance(found.get("rule"), str) \
            or re.fullmatch(RULE_ID_PATTERN, found["rule"]) is None:
        return False
    if found.get("action", "none") not in ACTIONS or \
            not all(isinstance(found.get(k, ""), str) for k in ("status", "message")):
        return False
    gpu = found.get("gpu")
    return gpu is None or (isinstance(gpu, dict) and (gpu.get("index") is None
                                                      or _count(gpu.get("index"))))


def failure(state_dir: Path, node: str) -> dict[str, Any] | None:
    """The recorded prolog/epilog failure of this node (None: none); RecordLost for one
    that cannot be used, whole (a part of a failure is no evidence of it)."""
    what = "the script-failure record"
    found = _read(state_dir / "slurm" / FAILURE, what)
    if found is None:
        return None
    when, findings, gpus = found.get("time"), found.get("findings"), found.get("gpus")
    if found.get("node") != node:
        raise AnotherNodesRecord(f"{what} is another node's ({str(found.get('node'))[:40]!r}), "
                         f"not {node}'s")
    ctld = found.get("slurmctld_time")
    if found.get("script") not in SCRIPTS or not isinstance(found.get("job"), str) \
            or not _time(when) or not (ctld is None or _time(ctld)) \
            or not isinstance(findings, list) \
            or not all(_finding(f) for f in findings) or not isinstance(gpus, list) \
            or not all(_count(g) for g in gpus):
        raise RecordLost(f"{what} is not one gpuguard's prolog or epilog wrote")
    return found


def clear_failure(state_dir: Path) -> None:
    _unlink(state_dir / "slurm" / FAILURE, "the script-failure record")


def save_drain(state_dir: Path, node: str, record: DrainRecord) -> None:
    """What health drained for (OSError when it cannot be written: the caller says so)."""
    write_text(folder(state_dir) / DRAIN, json.dumps({"node": node, **record.to_json()}),
               0o600)


def drain_record(state_dir: Path, node: str) -> DrainRecord | None:
    """What health drained for (None: no record); RecordLost for one that cannot be used
    (no resume without it: a person resumes)."""
    what = "the drain record"
    found = _read(state_dir / "slurm" / DRAIN, what)
    if found is None:
        return None
    if found.get("node") != node:
        raise AnotherNodesRecord(f"{what} is another node's ({str(found.get('node'))[:40]!r}), "
                         f"not {node}'s")
    record = DrainRecord.from_json(found)
    if record is None:
        raise RecordLost(f"{what} is not one this gpuguard wrote")
    return record


def clear_drain(state_dir: Path) -> None:
    _unlink(state_dir / "slurm" / DRAIN, "the drain record")
