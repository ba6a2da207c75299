"""The InfoROM validity that `gpuguard check` keeps per boot (issue 32).

Why: nvmlDeviceValidateInforom takes 68 ms on an H200 and NVML holds the device for all
of it, so a cold `check` that validates cannot be as fast as `nvidia-smi -q` (which does
not validate). The InfoROM's checksum is a property of the board: it changes with a
reflash (a new image version), and breaks when the driver cannot write it, which the
driver reports in the kernel log. So a successful validation is kept, in
`--state-dir`/inforom-valid (a line per GPU), and reused while all of these hold:

- the same boot (boot id), driver version, GPU (UUID) and InfoROM image version;
- the kernel log has had no record of the driver and no reset line since the validation
  (sources/kmsg_driver_marks.py: a driver load, an Xid, a GPU off the bus, a reset), and
  still holds every record since (a ring that wrapped cannot tell);
- it is younger than MAX_AGE_S on the boot clock (CLOCK_BOOTTIME: the same in every
  process of one boot, and no wall-clock step moves it).

Anything else validates, as every `check` did before: a failed validation is never kept
(the next run asks again), nor one on a host whose kernel log cannot be read in its
record form. The file is trusted only when it is a regular file of root or of this user,
writable by no one else, and small; a bad one is ignored and rewritten. gpu.inforom still
judges every run: from the kept answer or a new one. The daemon does not use this file
(its worker validates once a slow interval: sources/nvml_inforom.py), and neither do
`qualify` nor `slurm health`, which validate every run.

This runs in the early process before its first NVML call, so it imports nothing that
costs: no json, pathlib, dataclasses or tempfile (41 ms on the H200 host when it did).
"""

from __future__ import annotations

import contextlib
import os
import stat
import threading
import time

from gpuguard.sources.kmsg_driver_marks import DriverMarks, read_marks

# typing and collections.abc only for the type checker: this module runs in the NVML
# worker before its first NVML call (typing is 5-7 ms there on the H200 host)
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

KEPT_FILE = "inforom-valid"
HEADER = "gpuguard inforom-valid 1"
# An hour: long enough that a preflight or a health check every few minutes validates
# once in a while, short enough that a corruption the driver did not log is found within
# the hour by `check` (the daemon validates every slow interval regardless).
MAX_AGE_S = 3600.0
MAX_FILE_BYTES = 64 * 1024
MAX_GPUS = 1024
READ_DEADLINE_S = 2.0
# How long a GPU whose validation is kept waits for the kernel log's read: a few ms on a
# host's usual log (360 records, 2-3 ms on the H200 host); a ring of 100k records can take
# longer than the 68 ms validation itself, and then validating is the faster answer.
LOG_WAIT_S = 0.05


def boot_clock() -> float:
    return time.clock_gettime(time.CLOCK_BOOTTIME)


class Entry:
    __slots__ = ("at", "driver", "image", "seq")

    def __init__(self, image: str, driver: str, at: float, seq: int) -> None:
        self.image, self.driver, self.at, self.seq = image, driver, at, seq


class KeptInforom:
    """The kept validations of one `check`: `valid(uuid, image, driver)` says whether a
    GPU's may be reused, `learnt()` records this run's answer, `save()` writes what
    changed. start() reads the file, then the kernel log, in a thread beside nvmlInit:
    `valid` waits for the file, and for the log only if the file has this GPU and at
    most LOG_WAIT_S; `learnt` for the file alone."""

    def __init__(self, state_dir: str, kmsg: str, boot_id_file: str,
                 clock: Any = boot_clock) -> None:
        self.path = os.path.join(state_dir, KEPT_FILE)
        self.kmsg, self.boot_id_file = kmsg, boot_id_file
        self.clock = clock
        self.boot: str | None = None
        self.marks: DriverMarks | None = None
        self.entries: dict[str, Entry] = {}
        self.changed = False
        self._lock = threading.Lock()
        self._file_read = threading.Event()
        self._log_read = threading.Event()

    def start(self) -> None:
        threading.Thread(target=self.load, daemon=True).start()

    def load(self) -> None:
        try:
            self.boot = _boot_id(self.boot_id_file)
            if self.boot is not None:
                self.entries = _entries(self.path, self.boot)
        finally:
            self._file_read.set()
        try:
            self.marks = read_marks(self.kmsg, READ_DEADLINE_S)
        finally:
            self._log_read.set()

    def valid(self, uuid: str, image: str, driver: str) -> bool:
        self._file_read.wait()
        entry = self.entries.get(uuid)
        if entry is None or not image or entry.image != image or entry.driver != driver:
            return False  # validated at once: the kernel log is not waited for
        if not self._log_read.wait(LOG_WAIT_S):
            return False
        age = self.clock() - entry.at
        return (self.marks is not None and 0.0 <= age < MAX_AGE_S
                and self.marks.quiet_since(entry.seq))

    def learnt(self, uuid: str, image: str, driver: str, code: int) -> None:
        """This run's validation of a GPU: kept when it passed, forgotten when not. The
        answer waits for nothing: a kernel log not read by now (the validation took its
        68 ms meanwhile) keeps nothing this run."""
        self._file_read.wait()
        log_read = self._log_read.is_set()
        with self._lock:
            if code != 0 or not log_read or self.marks is None or not _word(uuid) \
                    or not _word(image) or not _word(driver):
                self.changed |= self.entries.pop(uuid, None) is not None
                return
            # the log's newest record when it was read, before the validation ended: a
            # driver record after it, even one the validation caused, asks again next time
            self.entries[uuid] = Entry(image, driver, self.clock(), self.marks.last_seq)
            self.changed = True

    def save(self) -> None:
        """Write the file if anything changed (each GPU's thread calls it after its
        validation, before its answer goes out: the process may end right after).
        Whole or not at all for a reader: a new file renamed over the old."""
        with self._lock:
            if not self.changed or self.boot is None:
                return
            self.changed = False
            gpus = [f"gpu {uuid} {e.image} {e.driver} {e.at!r} {e.seq}"
                    for uuid, e in sorted(self.entries.items())]
            lines = [HEADER, f"boot {self.boot}", *gpus[:MAX_GPUS]]
            tmp = f"{self.path}.{os.getpid()}.tmp"
            try:
                os.makedirs(os.path.dirname(self.path) or ".", exist_ok=True)
                # O_EXCL: never into a file someone else left under this name
                fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
                             | os.O_CLOEXEC, 0o644)
            except OSError:
                return  # not kept: the next run validates, as it would have
            try:
                try:
                    os.write(fd, ("\n".join(lines) + "\n").encode())
                finally:
                    os.close(fd)
                os.replace(tmp, self.path)
            except OSError:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)  # ours: made above


def _word(text: str) -> bool:
    """A value the file's line form can hold: one word of printable ASCII."""
    return bool(text) and text.isascii() and text.isprintable() and " " not in text


def _boot_id(path: str) -> str | None:
    try:
        with open(path, "rb") as handle:
            text = handle.read(128).decode("ascii", errors="replace").strip()
    except OSError:
        return None
    return text if _word(text) else None


def _entries(path: str, boot: str) -> dict[str, Entry]:
    """The kept validations of this boot, or none when the file is missing, bad or not
    to be trusted (see the module's doc)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return {}
    try:
        info = os.fstat(fd)
        if (not stat.S_ISREG(info.st_mode) or info.st_uid not in (0, os.geteuid())
                or info.st_mode & 0o022 or info.st_size > MAX_FILE_BYTES):
            return {}
        raw = os.read(fd, MAX_FILE_BYTES + 1)
    except OSError:
        return {}
    finally:
        os.close(fd)
    lines = raw.decode("ascii", errors="replace").split("\n")
    if lines[:2] != [HEADER, f"boot {boot}"]:
        return {}  # another format, another boot, or not this file at all
    entries: dict[str, Entry] = {}
    for line in lines[2:MAX_GPUS + 2]:
        entry = _entry(line)
        if entry is not None:
            entries[entry[0]] = entry[1]
    return entries


def _entry(line: str) -> tuple[str, Entry] | None:
    words = line.split(" ")
    if len(words) != 6 or words[0] != "gpu" or not all(_word(w) for w in words):
        return None
    try:
        at, seq = float(words[4]), int(words[5])
    except ValueError:
        return None
    if at != at or seq < 0:  # NaN; an age of inf fails the age test by itself
        return None
    return words[1], Entry(words[2], words[3], at, seq)
