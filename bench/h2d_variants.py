"""Why qualify's pinned host-to-device copy read 28 GB/s where the probe read 55 on the
same H200 (issue 29): the same copy in variants, each in a fresh forked process:
python bench/h2d_variants.py OUT.json"""

from __future__ import annotations

import ctypes
import json
import os
import sys
import time
from pathlib import Path

MIB = 1 << 20


def measure(variant: str, bus: str, size: int, cpus: set[int] | None) -> dict[str, object]:
    if cpus and variant.startswith("local"):
        os.sched_setaffinity(0, cpus)
    cu = ctypes.CDLL("libcuda.so.1")
    dev, ctx, dptr, host = ctypes.c_int(), ctypes.c_void_p(), ctypes.c_uint64(), ctypes.c_void_p()
    assert cu.cuInit(0) == 0
    assert cu.cuDeviceGetByPCIBusId(ctypes.byref(dev), bus.encode()) == 0
    assert cu.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev) == 0
    assert cu.cuCtxSetCurrent(ctx) == 0
    assert cu.cuMemAlloc_v2(ctypes.byref(dptr), ctypes.c_size_t(size)) == 0
    if "wc" in variant:   # CU_MEMHOSTALLOC_WRITECOMBINED
        assert cu.cuMemHostAlloc(ctypes.byref(host), ctypes.c_size_t(size), 4) == 0
    else:
        assert cu.cuMemAllocHost_v2(ctypes.byref(host), ctypes.c_size_t(size)) == 0
    if "touched" in variant:
        ctypes.memset(host, 7, size)
    best = {"h2d": 0.0, "d2h": 0.0}
    for _ in range(6):
        for name, call, args in (("h2d", cu.cuMemcpyHtoD_v2, (dptr, host)),
                                 ("d2h", cu.cuMemcpyDtoH_v2, (host, dptr))):
            began = time.perf_counter()
            assert call(*args, ctypes.c_size_t(size)) == 0
            best[name] = max(best[name], size / (time.perf_counter() - began) / 1e9)
    return {"variant": variant, "mib": size // MIB, "cpu": os.sched_getaffinity(0).__len__(),
            **{k: round(v, 2) for k, v in best.items()}}


def main() -> None:
    import pynvml

    pynvml.nvmlInit()
    h = pynvml.nvmlDeviceGetHandleByIndex(0)
    bus = pynvml.nvmlDeviceGetPciInfo(h).busId
    bus = bus.decode() if isinstance(bus, bytes) else bus
    sysbus = bus.lower()[4:] if len(bus) > 12 else bus.lower()
    cpus = None
    for path in (f"/sys/bus/pci/devices/{sysbus}/local_cpulist",
                 f"/sys/bus/pci/devices/{bus.lower()}/local_cpulist"):
        if os.path.exists(path):
            text = Path(path).read_text().strip()
            cpus = set()
            for part in text.split(","):
                lo, _, hi = part.partition("-")
                cpus.update(range(int(lo), int(hi or lo) + 1))
    info = {"bus": bus, "local_cpus": sorted(cpus) if cpus else None,
            "numa": Path(f"/sys/bus/pci/devices/{sysbus}/numa_node").read_text().strip()
            if os.path.exists(f"/sys/bus/pci/devices/{sysbus}/numa_node") else None,
            "gen": pynvml.nvmlDeviceGetCurrPcieLinkGeneration(h),
            "width": pynvml.nvmlDeviceGetCurrPcieLinkWidth(h), "rows": []}
    pynvml.nvmlShutdown()
    for variant in ("plain", "touched", "local", "local_touched", "wc", "plain"):
        for size in (64 * MIB, 256 * MIB):
            r, w = os.pipe()
            pid = os.fork()
            if pid == 0:
                os.close(r)
                try:
                    row = measure(variant, bus, size, cpus)
                except Exception as exc:
                    row = {"variant": variant, "error": repr(exc)}
                os.write(w, json.dumps(row).encode())
                os._exit(0)
            os.close(w)
            data = b""
            while chunk := os.read(r, 65536):
                data += chunk
            os.waitpid(pid, 0)
            info["rows"].append(json.loads(data))
            print(info["rows"][-1], flush=True)
    with open(sys.argv[1], "w") as out:
        json.dump(info, out, indent=1)


if __name__ == "__main__":
    main()
