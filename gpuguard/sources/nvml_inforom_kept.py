"""The InfoROM validity that `gpuguard check` keeps per boot (issue 32).

Why: nvmlDeviceValidateInforom takes 68 ms on an H200 and NVML holds the device for all
of it, so a cold `check` that validates cannot be as fast as `nvidia-smi -q` (which does
not validate). The InfoROM's checksum is a property of the board: it changes with a
reflash (a new image version), and breaks when the driver cannot write it, which the
driver reports in the kernel log. So a successful validation is kept, in
`--state-dir`/inforom-valid.json, and reused while all of these hold:

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
"""

from __future__ import annotations

import json
import os
import stat
import threading
import time
from pathlib import Path
from typing import Any

from gpuguard.sources.kmsg_driver_marks import DriverMarks, read_marks

KEPT_FILE = "inforom-valid.json"
# An hour: long enough that a preflight or a health check every few minutes validates
# once in a while, short enough that a corruption the driver did not log is found within
# the hour by `check` (the daemon validates every slow interval regardless).
MAX_AGE_S = 3600.0
MAX_FILE_BYTES = 64 * 1024
MAX_GPUS = 1024
READ_DEADLINE_S = 2.0


def boot_clock() -> float:
    return time.clock_gettime(time.CLOCK_BOOTTIME)


class KeptInforom:
    """The kept validations of one `check`: `valid(uuid, image)` says whether a GPU's may
    be reused, `learnt()` records this run's answers, `save()` writes what changed.
    `valid` waits until the kernel log and the file are read (start() runs that in a
    thread, beside nvmlInit)."""

    def __init__(self, state_dir: str, kmsg: str, boot_id_file: str,
                 clock: Any = boot_clock) -> None:
        self.path = Path(state_dir) / KEPT_FILE
        self.kmsg, self.boot_id_file = kmsg, boot_id_file
        self.clock = clock
        self.boot: str | None = None
        self.marks: DriverMarks | None = None
        self.entries: dict[str, dict[str, Any]] = {}
        self.changed = False
        self._lock = threading.Lock()
        self._ready = threading.Event()

    def start(self) -> None:
        threading.Thread(target=self.load, daemon=True).start()

    def load(self) -> None:
        try:
            self.boot = _boot_id(self.boot_id_file)
            self.marks = read_marks(self.kmsg, READ_DEADLINE_S)
            if self.boot is not None and self.marks is not None:
                self.entries = _entries(self.path, self.boot)
        finally:
            self._ready.set()

    def valid(self, uuid: str, image: str, driver: str) -> bool:
        self._ready.wait()
        entry = self.entries.get(uuid)
        if entry is None or self.marks is None or not uuid or not image or not driver:
            return False
        age = self.clock() - entry["at"]
        return (entry["image"] == image and entry["driver"] == driver
                and 0.0 <= age < MAX_AGE_S and self.marks.quiet_since(entry["seq"]))

    def learnt(self, uuid: str, image: str, driver: str, code: int) -> None:
        """This run's validation of a GPU: kept when it passed, forgotten when not."""
        self._ready.wait()
        with self._lock:
            if code != 0 or self.marks is None or not uuid or not image or not driver:
                self.changed |= self.entries.pop(uuid, None) is not None
                return
            # the log's newest record before the validation: a driver record after it,
            # even one the validation itself caused, asks again next time
            self.entries[uuid] = {"image": image, "driver": driver, "at": self.clock(),
                                  "seq": self.marks.last_seq}
            self.changed = True

    def save(self) -> None:
        """Write the file if anything changed (each GPU's thread calls it after its
        validation, before its answer goes out: the process may end right after)."""
        from gpuguard.io.atomic import write_text

        with self._lock:
            if not self.changed or self.boot is None:
                return
            self.changed = False
            doc = {"boot_id": self.boot, "gpus": [
                {"uuid": uuid, **entry} for uuid, entry in sorted(self.entries.items())
            ][:MAX_GPUS]}
            try:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                write_text(self.path, json.dumps(doc) + "\n", mode=0o644, durable=False)
            except OSError:
                pass  # not kept: the next run validates, as it would have


def _boot_id(path: str) -> str | None:
    try:
        with open(path, "rb") as handle:
            text = handle.read(128).decode("ascii", errors="replace").strip()
    except OSError:
        return None
    return text or None


def _entries(path: Path, boot: str) -> dict[str, dict[str, Any]]:
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
    finally:
        os.close(fd)
    try:
        doc = json.loads(raw)
    except (ValueError, RecursionError):
        return {}
    if not isinstance(doc, dict) or doc.get("boot_id") != boot \
            or not isinstance(doc.get("gpus"), list):
        return {}
    return {entry["uuid"]: entry for entry in doc["gpus"][:MAX_GPUS] if _good(entry)}


def _good(entry: Any) -> bool:
    return (isinstance(entry, dict)
            and all(isinstance(entry.get(k), str) and entry[k]
                    for k in ("uuid", "image", "driver"))
            and isinstance(entry.get("at"), (int, float))
            and not isinstance(entry.get("at"), bool) and entry["at"] == entry["at"]
            and isinstance(entry.get("seq"), int) and not isinstance(entry["seq"], bool))
