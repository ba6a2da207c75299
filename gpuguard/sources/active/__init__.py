"""The active probe: does each GPU compute and move data (docs/active-probe.md).

plan.py says which GPUs and how much; workers.py forks one worker per GPU and gathers
their lines by the deadline; child.py is what a worker runs; assemble.py turns the
lines into readings.

Runs after the NVML sweep, whose snapshot says which GPUs may be probed (an idle GPU
only, unless forced) and where each is (its PCI bus id, which CUDA finds it by: CUDA's
device order is not NVML's). One forked worker per GPU, forked before anything loads
libcuda (CUDA state must never cross a fork), all at once; the parent never loads
libcuda. Each worker streams one JSON line per phase started, finished and measured, so
a GPU that hangs (a call that never returns) or crashes its worker leaves the other GPUs'
results and makes only its own unknown, naming the phase and the call.

Phases of a worker: init (cuInit), device, context (the primary context), alloc,
compute (a PTX kernel writes seed + i into word i, the host reads it back), pattern
(walking ones and zeros written with cuMemsetD32 and read back), pcie (host to device
and back, pinned), memory (device-to-device copy), peer (copies to each later GPU with
peer access), release. The pcie and peer phases take a lock the workers share, one GPU
at a time: GPUs behind one PCIe switch, or copying into one NVSwitch port, would
otherwise share a link and each read low.

Standard library only at the top of each module; cuda_api (ctypes) is imported in the
workers.
"""
