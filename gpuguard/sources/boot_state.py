"""What this boot's state says: its id (a reboot starts history, acks and the GPUs seen
afresh) and the kernel log's acknowledged sequence number (`gpuguard xid ack`), which
counts only in the boot it was taken in."""

from __future__ import annotations

import json
import os
from pathlib import Path

from gpuguard.io.paths import Paths

XID_ACK_FILE = "xid-ack.json"


def boot_id(paths: Paths) -> str | None:
    try:
        return paths.boot_id_file.read_text().strip()
    except OSError:
        return None


def read_xid_ack(state_dir: Path, paths: Paths) -> int | None:
    """The last acknowledged kmsg sequence number, if it was taken in this boot."""
    from gpuguard.io.bounded import read_text

    try:
        raw = json.loads(read_text(state_dir / XID_ACK_FILE, 4096, 1.0))
    except (OSError, ValueError, RecursionError):
        return None  # no ack, or a bad file: count everything (never hide an Xid)
    if not isinstance(raw, dict) or raw.get("boot_id") != boot_id(paths):
        return None
    seq = raw.get("seq")
    return seq if isinstance(seq, int) else None


def write_xid_ack(state_dir: Path, paths: Paths, seq: int) -> None:
    from gpuguard.io.atomic import write_text

    os.makedirs(state_dir, exist_ok=True)
    write_text(state_dir / XID_ACK_FILE,
               json.dumps({"boot_id": boot_id(paths), "seq": seq}) + "\n")
