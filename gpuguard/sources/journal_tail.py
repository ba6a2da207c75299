"""A systemd service's own log: `journalctl -u UNIT --after-cursor -o json`, the cursor the
last read ended at (gpuguard/sources/service_logs.py has the other backends and what is
common)."""

from __future__ import annotations

import json
import re
import subprocess

from gpuguard.sources.log_scan import MAX_SCAN, TAIL_LINES, LogError, Patterns, Scan


class JournalTail:
    """journalctl with a cursor shows the FIRST entries after it (`-n` counts from the
    cursor; only without one does it count back from the end): a read takes at most
    TAIL_LINES entries and MAX_SCAN bytes, and the next continues after the last taken,
    so a burst is read over a few cycles, never skipped (journald's default rate limit,
    10,000 a unit in 30 s, keeps a unit below 2,000 entries in a 5 s cycle)."""

    def __init__(self, unit: str, from_start: bool = False) -> None:
        self.unit = unit
        self._cursor: str | None = None
        # the first read found the unit's journal empty: the next takes all it holds
        self._empty = False
        # a variant the daemon saw start (a failover): until a cursor, the entries of the
        # unit's current run (its InvocationID), not only those after the first read
        self.from_start = from_start
        self._run: str | None = None
        self.skipped: str | None = None
        self.count = 0

    def _args(self, deadline_s: float) -> list[str]:
        # --all: without it `-o json` gives a field over 4096 bytes as null (a long line's
        # error lost); MESSAGE only (and the cursor, always there): less to move and parse
        args = ["journalctl", "--no-pager", "--quiet", "-o", "json", "--all",
                "--output-fields=MESSAGE", "--show-cursor"]
        if self._cursor is not None:
            return [*args, "-u", self.unit, "--after-cursor", self._cursor,
                    "-n", str(TAIL_LINES)]
        if self.from_start and not self._empty:
            self._run = _invocation(self.unit, deadline_s)
            self._empty = self._run is not None
        if self._run is not None:  # this run's own output, the newest (one more: below)
            return [*args, f"_SYSTEMD_INVOCATION_ID={self._run}", "-n", str(TAIL_LINES + 1)]
        # the newest entries (one more: when it comes, older ones were not read)
        return [*args, "-u", self.unit, "-n", str(TAIL_LINES + 1) if self._empty else "0"]

    def read(self, deadline_s: float, keep: Patterns | None = None) -> list[str]:
        args = self._args(deadline_s)
        try:
            proc = subprocess.run(args, capture_output=True, timeout=deadline_s, check=False,
                                  stdin=subprocess.DEVNULL)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise LogError(f"journalctl: {exc}") from exc
        if proc.returncode != 0:
            raise LogError(f"journalctl exited {proc.returncode}: "
                           f"{proc.stderr.decode(errors='replace')[-200:]}")
        self.skipped, self.count = None, 0
        entries, end = _journal_entries(proc.stdout)
        first = self._cursor is None and not self._empty
        if self._cursor is None and len(entries) > TAIL_LINES:
            self.skipped = (f"more than {TAIL_LINES} entries of the journal of {self.unit} "
                            "since the first read: the older not read")
            entries = entries[-TAIL_LINES:]
        taken = _within_bound(entries)
        if taken < len(entries):
            end = entries[taken - 1][1] or end
        if end is None:
            self._empty = self._cursor is None
        else:
            self._cursor = end
        if first:
            return []
        scan = Scan(keep)
        scan.add(b"".join(message + b"\n" for message, _ in entries[:taken]))
        self.count = scan.count
        return scan.lines


def _invocation(unit: str, deadline_s: float) -> str | None:
    """The unit's current InvocationID (new at every start); None when it has none (not
    running) or systemctl does not answer: then the first read marks the end, as ever."""
    try:
        proc = subprocess.run(["systemctl", "show", "-p", "InvocationID", "--value", unit],
                              capture_output=True, text=True, timeout=deadline_s,
                              check=False, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired):
        return None
    run = proc.stdout.strip()
    return run if proc.returncode == 0 and re.fullmatch(r"[0-9a-f]{32}", run) else None


def _within_bound(entries: list[tuple[bytes, str | None]]) -> int:
    """How many of the entries fit in MAX_SCAN bytes (one at least): the rest are read
    at the next read, after the last one taken."""
    taken, size = 0, 0
    for message, _ in entries:
        size += len(message) + 1
        if size > MAX_SCAN and taken:
            break
        taken += 1
    return taken


def _journal_entries(out: bytes) -> tuple[list[tuple[bytes, str | None]], str | None]:
    """Each entry's MESSAGE and cursor (`-o json`, one a line), and the cursor after the
    last (`--show-cursor`)."""
    entries: list[tuple[bytes, str | None]] = []
    end = None
    for line in out.splitlines():
        if line.startswith(b"-- cursor: "):
            end = line[len(b"-- cursor: "):].decode(errors="replace")
            continue
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if not isinstance(entry, dict):
            continue
        message = entry.get("MESSAGE")
        if isinstance(message, list):  # not UTF-8: journalctl gives its bytes
            message = bytes(b & 0xFF for b in message if isinstance(b, int))
        elif isinstance(message, str):
            message = message.encode()
        else:
            message = b""
        cursor = entry.get("__CURSOR")
        # a message of several lines is one entry: each of its lines is matched
        entries.append((message.rstrip(b"\n"), cursor if isinstance(cursor, str) else None))
        end = entries[-1][1] or end
    return entries, end
