"""Which GPU: the one identity every result, sample, metric and stored event names.

A GPU is its index (what the driver numbers it now), its UUID and bus address (what it is
and where it sits), and its serial (the board, across reboots and re-seating). Each use
takes one of three keys from here, never builds its own:

- `key`: the live identity, in the daemon's results and samples: index, UUID and bus
  address together, so that two GPUs that report the same UUID (itself a finding, see
  gpu.identity) stay two, neither hiding the other;
- `board_key`: the lasting identity, in the event store's transitions and acks: the UUID
  (history follows the board), the index only where the UUID was not read;
- `labels()`: the metric labels (gpu, uuid, pci_bus_id).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# The metric labels of a GPU, in the order labels() gives them.
LABELS = ("gpu", "uuid", "pci_bus_id")


@dataclass(frozen=True)
class GpuId:
    index: int
    uuid: str | None = None
    pci_bus_id: str | None = None
    serial: str | None = None

    @property
    def key(self) -> str:
        return f"{self.index}/{self.uuid or '-'}/{self.pci_bus_id or '-'}"

    @property
    def board_key(self) -> str:
        return self.uuid or f"index:{self.index}"

    def labels(self) -> list[str]:
        return [str(self.index), self.uuid or "", self.pci_bus_id or ""]

    def to_json(self) -> dict[str, Any]:
        """As results name their GPU in JSON (the serial is the store's, not the output's)."""
        return {"index": self.index, "uuid": self.uuid, "pci_bus_id": self.pci_bus_id}


def finding_key(rule: str, gpu: GpuId | None) -> tuple[str, str]:
    """A rule's finding on one board (or the host's, ""): how the event store keys the last
    status of a rule and the acks given for it."""
    return (rule, "" if gpu is None else gpu.board_key)


def labels_of(gpu: GpuId | None) -> list[str]:
    """The metric labels of a result's GPU; empty ones for a host result."""
    return ["", "", ""] if gpu is None else gpu.labels()


def stored(uuid: str | None, index: int | None) -> GpuId | None:
    """A GPU as the event store's columns hold it (None: a host event)."""
    if uuid is None and index is None:
        return None
    return GpuId(index=-1 if index is None else index, uuid=uuid)
