#!/usr/bin/env python3
"""Compare a gpuguard snapshot (read through NVML) with `nvidia-smi -q -x` of the same moment.

    gpuguard snapshot -o snap.json & nvidia-smi -q -x > smi.xml; wait
    python scripts/compare_with_nvidia_smi.py snap.json smi.xml [--markdown out.md]

Every GPU and host field that both report is compared; fields that move from one
instant to the next (temperature, power, clocks, utilization, memory in use) are
compared within a tolerance. Exits 1 if any field disagrees.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from gpuguard.model.snapshot import GPU_READING_FIELDS, HOST_READING_FIELDS, Reading
from gpuguard.sources import replay

_MIB = 1024 * 1024
# field -> absolute tolerance for values sampled at slightly different instants
TOLERANCE: dict[str, float] = {
    "temperature_c": 3,
    "temperature_tlimit_margin_c": 3,
    "power_draw_w": 60,
    "clock_sm_mhz": 2000,
    "clock_mem_mhz": 50,
    "utilization_gpu_percent": 30,
    "utilization_memory_percent": 30,
    "memory_used_bytes": 64 * _MIB,
    # nvidia-smi prints whole MiB
    "memory_total_bytes": _MIB,
    "memory_reserved_bytes": _MIB,
    # nvidia-smi prints two decimals of watts
    "power_limit_enforced_w": 0.01,
    "power_limit_default_w": 0.01,
}


def _norm(name: str, value: Any) -> Any:
    if isinstance(value, str):
        return value.strip().lower()
    if name == "compute_processes" and isinstance(value, list):
        return sorted(p.pid for p in value)
    return value


def compare(a: Reading[Any], b: Reading[Any], name: str) -> tuple[str, str]:
    if not (a.is_ok and b.is_ok):
        if a.state == b.state:
            return "same-state", a.state
        return "one-side", f"nvml={a.describe()} smi={b.describe()}"
    va, vb = _norm(name, a.value), _norm(name, b.value)
    tol = TOLERANCE.get(name)
    if tol is not None and isinstance(va, int | float) and isinstance(vb, int | float):
        ok = abs(va - vb) <= tol
        return ("agree" if ok else "disagree"), f"nvml={a.value} smi={b.value} (tolerance {tol})"
    return ("agree" if va == vb else "disagree"), f"nvml={a.value!r} smi={b.value!r}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    parser.add_argument("snapshot", type=Path)
    parser.add_argument("smi_xml", type=Path)
    parser.add_argument("--markdown", type=Path)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    nvml = replay.load(args.snapshot)
    smi = replay.load(args.smi_xml)

    rows: list[tuple[str, str, str, str]] = []
    for name in HOST_READING_FIELDS:
        verdict, detail = compare(getattr(nvml.host, name), getattr(smi.host, name), name)
        rows.append(("host", name, verdict, detail))
    smi_by_bus = {g.pci_bus_id.get_or("").lower(): g for g in smi.gpus}
    for gpu in nvml.gpus:
        other = smi_by_bus.get(gpu.pci_bus_id.get_or("").lower())
        if other is None:
            rows.append((f"gpu{gpu.index}", "pci_bus_id", "disagree", "not in nvidia-smi output"))
            continue
        for name in GPU_READING_FIELDS:
            verdict, detail = compare(getattr(gpu, name), getattr(other, name), name)
            rows.append((f"gpu{gpu.index}", name, verdict, detail))

    counts: dict[str, int] = {}
    for row in rows:
        counts[row[2]] = counts.get(row[2], 0) + 1
    lines = ["| where | field | verdict | values |", "| --- | --- | --- | --- |"]
    lines += [f"| {w} | {f} | {v} | {d} |" for w, f, v, d in rows]
    lines.append("")
    lines.append("counts: " + ", ".join(f"{k} {n}" for k, n in sorted(counts.items())))
    text = "\n".join(lines)
    print(text)
    if args.markdown:
        args.markdown.write_text(text + "\n")
    if args.json:
        args.json.write_text(json.dumps({"rows": rows, "counts": counts}, indent=1))
    return 1 if counts.get("disagree") else 0


if __name__ == "__main__":
    sys.exit(main())
