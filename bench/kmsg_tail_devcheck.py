#!/usr/bin/env python3
"""On a lent GPU host (issue 32): the daemon's kernel-log reader (sources/kmsg_tail.py)
against a whole read of the real /dev/kmsg, six times half a second apart: the same
summary each time, and the CPU each read took. Reads only. Run from the checkout."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

sys.path.insert(0, ".")

from gpuguard.sources import kmsg
from gpuguard.sources.kmsg_tail import KernelLogTail


def main() -> None:
    device = Path("/dev/kmsg")
    tail = KernelLogTail()
    out = []
    for i in range(6):
        t0 = time.process_time()
        kept = tail.read(device, 5.0)
        t1 = time.process_time()
        whole = kmsg.read_device(device)
        t2 = time.process_time()
        if not (kept.is_ok and whole.is_ok):
            out.append({"i": i, "tail": kept.error, "whole": whole.error})
            break
        x, y = dict(kept.get()), dict(whole.get())
        x.pop("now_usec")
        y.pop("now_usec")
        out.append({"i": i, "same": x == y, "records": y["records"],
                    "first_seq": y["first_seq"], "last_seq": y["last_seq"],
                    "tail_ms": round((t1 - t0) * 1000, 3),
                    "whole_ms": round((t2 - t1) * 1000, 3),
                    "diff": [k for k in x if x[k] != y.get(k)]})
        time.sleep(0.5)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
