"""The GPUs the daemon has seen, so that one that disappears from NVML is a finding
(gpu.count), not a host with one GPU fewer that looks healthy: the shipped profile sets no
gpu_count to compare with.

A GPU is known by its UUID, or by its bus address where the UUID was not read. The set is
kept in the state dir with the boot id, so a restart of the daemon within one boot keeps
it. A reboot keeps it too, as GPUs of an earlier boot known by their slot (bus address;
a board swapped in the same slot is not missing): a GPU that does not come back after
the reboot gpuguard asked for is the finding it was, not a smaller healthy host. Only a
sweep that answered updates it: when NVML does not answer, which GPUs are there cannot
be told. A missing GPU stays missing until it comes back, or an ack of gpu.count
covering exactly the missing set makes the daemon forget it (forget()).

A file that cannot be read (corrupt, too large, not ours) is doubt, not a fresh start:
gpu.count is unknown, saying so, for the rest of this boot (the doubt is kept in the file)
unless the profile's gpu_count confirms the count; deleting the file and restarting the
daemon accepts the GPUs present then.

The daemon keeps the set (it updates the file); every cold path (`check`, `status --cold`,
`slurm health` when no daemon answers) reads it without adding to it (keep=False): a GPU
the daemon saw and NVML no longer lists is missing there too, whichever path judges. An
ack of gpu.count is the one change a cold path writes: the GPUs it covers are forgotten
for every path, the daemon's too (taken out on purpose, said by a person).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Protocol

from gpuguard.io import bounded
from gpuguard.model.derived import missing_gpu_name
from gpuguard.model.results import Result, names_of
from gpuguard.model.snapshot import GpuSnapshot, Reading, Snapshot


class Log(Protocol):
    """Where the set's events go (the daemon's structlog logger); a cold path's reading
    says its doubt in the result itself."""

    def warning(self, event: str, **kw: Any) -> Any: ...

    def info(self, event: str, **kw: Any) -> Any: ...


class _Quiet:
    def warning(self, event: str, **kw: Any) -> None:
        pass

    def info(self, event: str, **kw: Any) -> None:
        pass

FILE = "gpus-seen.json"
RULE = "gpu.count"
EARLIER = "earlier_boot"  # a GPU seen in an earlier boot, not yet in this one
ACKED = "acknowledged at"  # an ack's words in observed (events/acks.py), not auto_clear's
MAX_FILE_BYTES = 1 << 20
MAX_FORGOTTEN = 256  # the newest kept: a board is forgotten once per ack


class SeenGpus:
    def __init__(self, state_dir: Path | None, boot_id: str | None, log: Log | None = None,
                 keep: bool = True) -> None:
        self.path = state_dir / FILE if state_dir is not None else None
        self.boot_id = boot_id
        self.log: Log = log if log is not None else _Quiet()
        self.keep = keep  # False: read the set, never write it (a cold path)
        # why the set cannot be trusted this boot (an unreadable file), or None
        self.doubt: str | None = None
        self._unsaved = True  # the boot id (or the doubt) is not in the file yet
        self._save_failed = False
        # the GPUs an ack of gpu.count took out (kept across boots: a drain that waited
        # for one of them waits no more, integrations/slurm/resume.py)
        self.forgotten: list[dict[str, Any]] = []
        self.gpus: list[dict[str, Any]] = self._load()

    def _load(self) -> list[dict[str, Any]]:
        if self.path is None or not self.path.exists():
            return []
        try:
            raw = json.loads(bounded.read_text(self.path, MAX_FILE_BYTES, 1.0))
        except (OSError, ValueError) as exc:
            return self._doubt(f"{self.path} cannot be read: {exc}")
        except RecursionError:  # not a ValueError: 100,000 `[` crashed every check
            return self._doubt(f"{self.path} cannot be read: JSON nested too deep")
        if not isinstance(raw, dict) or not isinstance(raw.get("gpus"), list) or \
                not all(_valid(g) for g in raw["gpus"]):
            return self._doubt(f"{self.path} is not a list of GPUs")
        forgotten = raw.get("forgotten")
        if isinstance(forgotten, list):
            self.forgotten = [g for g in forgotten if _valid(g)][:MAX_FORGOTTEN]
        if raw.get("boot_id") == self.boot_id:
            doubt = raw.get("doubt")
            self.doubt = doubt if isinstance(doubt, str) else None
            return list(raw["gpus"])
        # an earlier boot: its GPUs are expected back, known by their slot
        return [{**g, EARLIER: True} for g in raw["gpus"]]

    def _doubt(self, why: str) -> list[dict[str, Any]]:
        self.log.warning("gpus_seen_unreadable", why=why,
                    action="gpu.count unknown this boot (unless the profile's gpu_count "
                           "confirms it)")
        self.doubt = why
        return []

    def update(self, snap: Snapshot) -> list[dict[str, Any]] | None:
        """The GPUs seen since boot that this sweep does not list; None when the sweep
        cannot tell (NVML did not start, hung or stopped early)."""
        nvml = snap.nvml
        if nvml.init_error or nvml.hung_call or nvml.sweep_error:
            return None
        present = [_entry(gpu) for gpu in snap.gpus]
        changed = [self._add(entry) for entry in present
                   if entry["uuid"] is not None or entry["pci_bus_id"] is not None]
        if any(changed) or self._unsaved:
            self._save()
        return [seen for seen in self.gpus if not any(_same(entry, seen) for entry in present)]

    def _add(self, entry: dict[str, Any]) -> bool:
        """A GPU of this sweep into the set; whether the set changed."""
        matches = [i for i, seen in enumerate(self.gpus) if _same(entry, seen)]
        if not matches:
            self.gpus.append(entry)
            # back after it was forgotten: missed again if it goes again
            self.forgotten = [g for g in self.forgotten if not _same(entry, g)]
            return True
        if self.gpus[matches[0]].get(EARLIER):
            self.gpus[matches[0]] = entry  # back after the reboot: seen this boot
            return True
        return False

    def reading(self, snap: Snapshot) -> Reading[list[dict[str, Any]]] | None:
        """gpus_missing for the snapshot: the GPUs gone; where none is and the set is in
        doubt, a failed reading saying why (gpu.count unknown); None when the sweep
        cannot tell."""
        missing = self.update(snap)
        if missing is None:
            return None
        if not missing and self.doubt is not None:
            return Reading.failed(f"which GPUs this host had cannot be told: {self.doubt} "
                                  "(delete it and restart the daemon to accept the GPUs "
                                  "present, or set gpu_count in the profile)")
        return Reading.ok(missing)

    def forget(self, names: set[str]) -> None:
        """An ack of gpu.count covering exactly these missing GPUs: they are not expected
        any more (taken out on purpose)."""
        kept = [g for g in self.gpus if missing_gpu_name(g) not in names]
        if len(kept) != len(self.gpus):
            self.log.info("gpus_seen_forgotten", gpus=sorted(names), why="an ack of gpu.count")
            gone = [{k: v for k, v in g.items() if k != EARLIER} for g in self.gpus
                    if missing_gpu_name(g) in names]
            self.forgotten = [*self.forgotten, *gone][-MAX_FORGOTTEN:]
            self.gpus = kept
            self._save(forgetting=True)

    def forget_acknowledged(self, results: list[Result]) -> None:
        """The GPUs an ack of gpu.count in force covers (events/acks.py matched exactly the
        set it was given for): taken out on purpose, so gpu.count clears next cycle. An
        auto-clear is no ack: a GPU gone for long is still gone."""
        for r in results:
            why = r.observed.get("acknowledged")
            if r.rule == RULE and isinstance(why, str) and why.startswith(ACKED) \
                    and r.observed.get("missing"):
                self.forget(set(names_of(r.observed)))

    def _save(self, forgetting: bool = False) -> None:
        if self.path is None or not (self.keep or forgetting):
            return
        # imported here: only the daemon (or an ack's forgetting) writes, and atomic's
        # tempfile and shutil would cost every cold `check` (docs/benchmarks.md, issue 27)
        from gpuguard.io.atomic import write_text

        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            write_text(self.path, json.dumps({"boot_id": self.boot_id, "gpus": self.gpus,
                                              "doubt": self.doubt,
                                              "forgotten": self.forgotten}))
            self._unsaved = False
        except OSError as exc:  # kept in memory; a restart then starts afresh
            if not self._save_failed:  # once, not every cycle it keeps failing
                self.log.warning("gpus_seen_not_saved", file=str(self.path), error=str(exc))
            self._save_failed = True


def forgotten(state_dir: Path) -> list[dict[str, Any]]:
    """The GPUs an ack of gpu.count took out, read only (none: no file, or a bad one)."""
    if not (state_dir / FILE).is_file():
        return []
    return SeenGpus(state_dir, None, keep=False).forgotten


def _entry(gpu: GpuSnapshot) -> dict[str, Any]:
    return {"uuid": gpu.uuid.get_or(None) or None,
            "pci_bus_id": gpu.pci_bus_id.get_or(None) or None,
            "index": gpu.index, "name": gpu.name.get_or(None)}


def _valid(g: object) -> bool:
    return isinstance(g, dict) and isinstance(g.get("uuid"), str | None) \
        and isinstance(g.get("pci_bus_id"), str | None)


def _same(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """One GPU: by UUID where both were read, else by bus address; a GPU of an earlier
    boot by its slot too (a board swapped into it is the slot's GPU back)."""
    if (a.get(EARLIER) or b.get(EARLIER)) and a.get("pci_bus_id") and \
            str(a["pci_bus_id"]).lower() == str(b.get("pci_bus_id") or "").lower():
        return True
    if a.get("uuid") and b.get("uuid"):
        return bool(a["uuid"].lower() == b["uuid"].lower())
    return bool(a.get("pci_bus_id")) and str(a["pci_bus_id"]).lower() == \
        str(b.get("pci_bus_id") or "").lower()
