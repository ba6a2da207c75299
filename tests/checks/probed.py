"""A snapshot as the active probe leaves it, with the numbers the real H200s gave
(tests/fixtures/h200x2/cuda-driver-api-probe.json: 55.4 / 55.2 GB/s host<->device; the
PyTorch device-to-device and peer copies: ~4300 and 392 GB/s)."""

from __future__ import annotations

from typing import Any

from gpuguard.model.snapshot import Snapshot
from tests.conftest import set_gpu

PHASES = {"init": 497.0, "context": 127.6, "alloc": 174.1, "compute": 114.6, "pattern": 40.0,
          "pcie": 30.0, "memory": 1.0, "release": 20.0}


def probed(snapshot: Snapshot, index: int = 0, **values: Any) -> Snapshot:
    """GPU `index` probed and healthy, but for `values` (snapshot fields)."""
    fields: dict[str, Any] = {
        "probe_skipped": "",
        "probe_compute": {"error": None, "mismatches": 0, "words": 262144,
                          "phases_ms": PHASES, "elapsed_s": 1.1},
        "probe_pattern": {"error": None, "mismatches": 0, "bytes": 128 << 20},
        "probe_pcie": {"h2d_gbps": 55.4, "d2h_gbps": 55.2, "bytes": 256 << 20},
        "probe_memory": 4300.0,
        "probe_peers": [],
    }
    fields.update(values)
    return set_gpu(snapshot, index, **fields)
