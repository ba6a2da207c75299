"""The real 2 x H200 NVLink host (/work/shared/fixtures/h200x2-2026-11-30, idle and
healthy) as a snapshot: nvidia-smi -q -x for what XML has, the NVML probe for the rest
(per-link NVLink, HBM temperature and maximum, application clocks, P2P), as the NVML
source will read them. Fabric: Completed / Success / clique 0, no fabric manager in the VM."""

from __future__ import annotations

import ast
import json
from pathlib import Path
from typing import Any

from gpuguard.model.snapshot import Reading, Snapshot
from gpuguard.sources import nvidia_smi_xml

# held in from /work/shared/fixtures/h200x2-2026-11-30 (its README says what each file is)
ROOT = Path(__file__).resolve().parent.parent / "fixtures" / "h200x2"
P2P_CODES = {0: "ok", 1: "chipset_not_supported", 2: "gpu_not_supported",
             3: "topology_not_supported", 4: "disabled_by_regkey", 5: "not_supported"}


def _p2p(raw: Any) -> str:
    # the probe's READ call raised in its nvidia-ml-py: a status it could not read
    return P2P_CODES.get(raw, "unknown") if isinstance(raw, int) else "unknown"


def snapshot() -> Snapshot:
    snap = nvidia_smi_xml.parse((ROOT / "nvidia-smi-q.xml").read_text(), "h200x2")
    probe = json.loads((ROOT / "nvml-nvlink-probe.json").read_text())
    pair = probe["p2p_0_1"]
    status = {kind: _p2p(pair[f"NVML_P2P_CAPS_INDEX_{kind.upper()}"])
              for kind in ("read", "write", "nvlink", "atomics")}
    for gpu, raw in zip(snap.gpus, probe["gpus"], strict=True):
        links = [{"link": int(n), "up": link["state"] == 1, "version": link["version"],
                  "remote_pci": link["remote"], "replay": link["replay"],
                  "recovery": link["recovery"], "crc_flit": link["crc_flit"],
                  "crc_data": link["crc_data"]} for n, link in raw["nvlink"].items()]
        [(_, mem_temp)] = ast.literal_eval(raw["memory_temp_fv"])
        sm_app, mem_app = raw["app_clocks"]
        values: dict[str, Any] = {
            "nvlink_links": links, "fabric_state": "completed", "fabric_status": "Success",
            "fabric_clique_id": 0, "memory_temperature_c": mem_temp,
            "memory_temperature_max_c": raw["temp_mem_max"],
            "clock_sm_app_mhz": sm_app, "clock_mem_app_mhz": mem_app,
            # nvidia-smi -q -x: default applications clocks 1980 / 3201 MHz
            "clock_sm_app_default_mhz": 1980, "clock_mem_app_default_mhz": 3201,
            "p2p_status": [{"peer": 1 - gpu.index, **status}],
        }
        for name, value in values.items():
            setattr(gpu, name, Reading.ok(value))
        gpu.__post_init__()
    snap.host.fabricmanager_running = Reading.ok(False)
    snap.host.kernel_log = Reading.ok({"source": "kmsg", "records": 0, "now_usec": 10**9,
                                       "xids": [], "sxids": [], "acked_seq": None})
    snap.host.__post_init__()
    return snap
