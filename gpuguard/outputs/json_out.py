"""The JSON document of `gpuguard check --format json` (and the daemon's /status)."""

from __future__ import annotations

import json
from typing import Any

from gpuguard import __version__
from gpuguard.results import Result, exit_code, summary
from gpuguard.snapshot import Snapshot

SCHEMA = 1


def document(snapshot: Snapshot, results: list[Result]) -> dict[str, Any]:
    host = snapshot.host
    return {
        "schema": SCHEMA,
        "gpuguard_version": __version__,
        "host": {
            "hostname": host.hostname,
            "source": host.source,
            "collected_at": host.collected_at,
            "driver_version": host.driver_version.value,
            "cuda_driver_version": host.cuda_driver_version.value,
            "nvml_version": host.nvml_version.value,
            "gpu_count": host.gpu_count.value,
        },
        "results": [r.to_json() for r in results],
        "summary": {**summary(results), "exit_code": exit_code(results)},
    }


def render(snapshot: Snapshot, results: list[Result]) -> str:
    return json.dumps(document(snapshot, results), indent=2) + "\n"
