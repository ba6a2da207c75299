"""The GPUs the daemon has seen since boot, so that one that disappears from NVML is a
finding (gpu.count), not a host with one GPU fewer that looks healthy: the shipped profile
sets no gpu_count to compare with.

A GPU is known by its UUID, or by its bus address where the UUID was not read. The set is
kept in the state dir with the boot id, so a restart of the daemon within one boot keeps
it and a reboot starts it afresh. Only a sweep that answered updates it: when NVML does
not answer, which GPUs are there cannot be told. A missing GPU stays missing until it
comes back, the host reboots, or an ack of gpu.count covering exactly the missing set
makes the daemon forget it (forget()).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import structlog

from gpuguard.io import bounded
from gpuguard.io.atomic import write_text
from gpuguard.model.derived import missing_gpu_name
from gpuguard.model.results import Result, names_of
from gpuguard.model.snapshot import GpuSnapshot, Snapshot

log = structlog.get_logger("gpuguard.daemon")

FILE = "gpus-seen.json"
RULE = "gpu.count"
ACKED = "acknowledged at"  # an ack's words in observed (events/acks.py), not auto_clear's
MAX_FILE_BYTES = 1 << 20


class SeenGpus:
    def __init__(self, state_dir: Path | None, boot_id: str | None) -> None:
        self.path = state_dir / FILE if state_dir is not None else None
        self.boot_id = boot_id
        self.gpus: list[dict[str, Any]] = self._load()

    def _load(self) -> list[dict[str, Any]]:
        if self.path is None or not self.path.exists():
            return []
        try:
            raw = json.loads(bounded.read_text(self.path, MAX_FILE_BYTES, 1.0))
        except (OSError, ValueError) as exc:
            log.warning("gpus_seen_unreadable", file=str(self.path), error=str(exc),
                        action="starts afresh from this sweep")
            return []
        if not isinstance(raw, dict) or raw.get("boot_id") != self.boot_id or \
                not isinstance(raw.get("gpus"), list):
            return []  # another boot (or not ours): what was seen then says nothing now
        return [g for g in raw["gpus"] if isinstance(g, dict)
                and isinstance(g.get("uuid"), str | None)
                and isinstance(g.get("pci_bus_id"), str | None)]

    def update(self, snap: Snapshot) -> list[dict[str, Any]] | None:
        """The GPUs seen since boot that this sweep does not list; None when the sweep
        cannot tell (NVML did not start, hung or stopped early)."""
        nvml = snap.nvml
        if nvml.init_error or nvml.hung_call or nvml.sweep_error:
            return None
        present = [_entry(gpu) for gpu in snap.gpus]
        changed = False
        for entry in present:
            if entry["uuid"] is None and entry["pci_bus_id"] is None:
                continue
            if not any(_same(entry, seen) for seen in self.gpus):
                self.gpus.append(entry)
                changed = True
        if changed:
            self._save()
        return [seen for seen in self.gpus if not any(_same(entry, seen) for entry in present)]

    def forget(self, names: set[str]) -> None:
        """An ack of gpu.count covering exactly these missing GPUs: they are not expected
        any more (taken out on purpose)."""
        kept = [g for g in self.gpus if missing_gpu_name(g) not in names]
        if len(kept) != len(self.gpus):
            log.info("gpus_seen_forgotten", gpus=sorted(names), why="an ack of gpu.count")
            self.gpus = kept
            self._save()

    def forget_acknowledged(self, results: list[Result]) -> None:
        """The GPUs an ack of gpu.count in force covers (events/acks.py matched exactly the
        set it was given for): taken out on purpose, so gpu.count clears next cycle. An
        auto-clear is no ack: a GPU gone for long is still gone."""
        for r in results:
            why = r.observed.get("acknowledged")
            if r.rule == RULE and isinstance(why, str) and why.startswith(ACKED) \
                    and r.observed.get("missing"):
                self.forget(set(names_of(r.observed)))

    def _save(self) -> None:
        if self.path is None:
            return
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            write_text(self.path, json.dumps({"boot_id": self.boot_id, "gpus": self.gpus}))
        except OSError as exc:  # kept in memory; a restart then starts afresh
            log.warning("gpus_seen_not_saved", file=str(self.path), error=str(exc))


def _entry(gpu: GpuSnapshot) -> dict[str, Any]:
    return {"uuid": gpu.uuid.get_or(None) or None,
            "pci_bus_id": gpu.pci_bus_id.get_or(None) or None,
            "index": gpu.index, "name": gpu.name.get_or(None)}


def _same(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """One GPU: by UUID where both were read, else by bus address."""
    if a.get("uuid") and b.get("uuid"):
        return bool(a["uuid"].lower() == b["uuid"].lower())
    return bool(a.get("pci_bus_id")) and str(a["pci_bus_id"]).lower() == \
        str(b.get("pci_bus_id") or "").lower()
