import sys, time, json
from pathlib import Path
sys.path.insert(0, ".")
from gpuguard.sources import kmsg
from gpuguard.sources.kmsg_tail import KernelLogTail
p = Path("/dev/kmsg")
tail = KernelLogTail()
out = []
for i in range(6):
    t0 = time.process_time(); a = tail.read(p, 5.0); t1 = time.process_time()
    b = kmsg.read_device(p); t2 = time.process_time()
    if not (a.is_ok and b.is_ok):
        out.append({"i": i, "a": a.error, "b": b.error}); break
    x, y = dict(a.get()), dict(b.get()); x.pop("now_usec"); y.pop("now_usec")
    out.append({"i": i, "same": x == y, "records": y["records"], "first_seq": y["first_seq"],
                "last_seq": y["last_seq"], "tail_ms": round((t1-t0)*1000, 3), "whole_ms": round((t2-t1)*1000, 3),
                "diff": [k for k in x if x[k] != y.get(k)]})
    time.sleep(0.5)
print(json.dumps(out))
