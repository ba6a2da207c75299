"""A corrupt event store: moved aside for a post-mortem (`events.db.corrupt-<time>`),
and only the newest CORRUPT_KEPT copies kept."""

from __future__ import annotations

import contextlib
import os
import re
from pathlib import Path

from gpuguard.io.clock import utc_stamp

# Corrupt stores moved aside (events.db.corrupt-<time>) kept for a post-mortem, newest first
CORRUPT_KEPT = 3


def move_aside(path: Path) -> Path | None:
    """A corrupt store keeps its bytes for a post-mortem, out of the way; only the newest
    CORRUPT_KEPT copies stay (a failing disk corrupts again and again: up to 64 MiB each)."""
    stamp = utc_stamp()
    aside = path.with_name(f"{path.name}.corrupt-{stamp}")
    try:
        os.replace(path, aside)
    except FileNotFoundError:
        return None
    except OSError:
        return None
    for suffix in ("-wal", "-shm"):
        with contextlib.suppress(OSError):
            os.replace(f"{path}{suffix}", f"{aside}{suffix}")
    remove_old_copies(path)
    return aside


def remove_old_copies(path: Path, keep: int = CORRUPT_KEPT) -> None:
    """All but the newest `keep` corrupt copies of `path` (and their -wal/-shm) go. Only
    names move_aside makes are touched; the UTC stamp sorts by time."""
    pattern = re.compile(re.escape(path.name) + r"\.corrupt-(\d{8}T\d{6})(-wal|-shm)?")
    try:
        names = [p.name for p in path.parent.iterdir()]
    except OSError:
        return
    stamps = sorted({m.group(1) for m in map(pattern.fullmatch, names) if m}, reverse=True)
    old = set(stamps[keep:])
    for name in names:
        found = pattern.fullmatch(name)
        if found and found.group(1) in old:
            with contextlib.suppress(OSError):
                (path.parent / name).unlink()
