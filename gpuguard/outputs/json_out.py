"""The JSON document of `gpuguard check --format json` (and the daemon's /status)."""

from __future__ import annotations

import json
from typing import Any

from gpuguard import __version__
from gpuguard.model.results import Verdict
from gpuguard.model.snapshot import Snapshot

SCHEMA = 1


def document(snapshot: Snapshot, verdict: Verdict) -> dict[str, Any]:
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
        "results": [r.to_json() for r in verdict.results],
        "summary": {**verdict.summary(), "exit_code": verdict.code,
                    "fail_on": verdict.fail_on},
        **({"notes": list(verdict.notes)} if verdict.notes else {}),
    }


def render(snapshot: Snapshot, verdict: Verdict) -> str:
    return json.dumps(document(snapshot, verdict), indent=2) + "\n"
