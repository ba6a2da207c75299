"""The CUDA driver API through ctypes: libcuda.so.1 only (no cuda-bindings, no PyTorch).

The `_v2` entry points used here are the driver's stable ABI from driver 535 to 580, so
nothing is shipped beyond what the driver installs (docs/active-probe.md). Loaded only in
the active probe's forked workers (gpuguard/sources/active/): the parent process
never loads libcuda, so a hang or crash inside it costs only a worker.

CUresult codes are named in one place, ERRORS, with what each most often means on an
inference host.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable

# code: (name, what it usually means). The codes are cuda.h's CUresult values.
ERRORS: dict[int, tuple[str, str]] = {
    1: ("CUDA_ERROR_INVALID_VALUE", "an argument was rejected"),
    2: ("CUDA_ERROR_OUT_OF_MEMORY", "the GPU has no room for the probe's buffers"),
    3: ("CUDA_ERROR_NOT_INITIALIZED", "the driver is not initialised"),
    4: ("CUDA_ERROR_DEINITIALIZED", "the driver is shutting down"),
    35: ("CUDA_ERROR_INSUFFICIENT_DRIVER", "the driver is older than the CUDA it is asked for"),
    46: ("CUDA_ERROR_DEVICES_UNAVAILABLE",
         "the GPU is busy or unavailable (exclusive-process compute mode held by another "
         "process, or prohibited)"),
    100: ("CUDA_ERROR_NO_DEVICE", "the driver finds no usable CUDA device"),
    101: ("CUDA_ERROR_INVALID_DEVICE", "no such device (bus id unknown to CUDA)"),
    200: ("CUDA_ERROR_INVALID_IMAGE", "the kernel image was rejected"),
    201: ("CUDA_ERROR_INVALID_CONTEXT", "no valid context"),
    209: ("CUDA_ERROR_NO_BINARY_FOR_GPU", "no kernel image for this GPU"),
    214: ("CUDA_ERROR_ECC_UNCORRECTABLE", "an uncorrectable ECC error was detected"),
    218: ("CUDA_ERROR_INVALID_PTX", "the PTX kernel did not compile"),
    222: ("CUDA_ERROR_UNSUPPORTED_PTX_VERSION", "the driver's PTX compiler is too old"),
    700: ("CUDA_ERROR_ILLEGAL_ADDRESS", "a kernel touched an illegal address (page fault)"),
    701: ("CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES", "the launch asked for too many resources"),
    702: ("CUDA_ERROR_LAUNCH_TIMEOUT", "the kernel ran past the watchdog"),
    704: ("CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED", "peer access already enabled"),
    709: ("CUDA_ERROR_CONTEXT_IS_DESTROYED", "the context was destroyed"),
    710: ("CUDA_ERROR_ASSERT", "a device-side assert fired"),
    711: ("CUDA_ERROR_TOO_MANY_PEERS", "too many peers"),
    719: ("CUDA_ERROR_LAUNCH_FAILED", "the kernel failed while running (an Xid follows)"),
    720: ("CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE", "cooperative launch too large"),
    802: ("CUDA_ERROR_SYSTEM_NOT_READY",
          "system not yet initialised: on NVSwitch/NVLink-fabric systems the fabric manager "
          "has not (yet) set up the fabric; check nvidia-fabricmanager and fabric.state"),
    803: ("CUDA_ERROR_SYSTEM_DRIVER_MISMATCH",
          "the kernel module and the user-space driver (libcuda) are different versions"),
    804: ("CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE",
          "a CUDA forward-compatibility libcuda is in use on a GPU it does not support"),
    805: ("CUDA_ERROR_MPS_CONNECTION_FAILED", "the MPS control daemon cannot be reached"),
    999: ("CUDA_ERROR_UNKNOWN",
          "unknown error: often a GPU in a bad state (look for Xids); a reset may be needed"),
}


def describe(code: int) -> str:
    """`802 CUDA_ERROR_SYSTEM_NOT_READY (what it usually means)`."""
    name, meaning = ERRORS.get(code, (f"CUDA error {code}", "not in gpuguard's table"))
    return f"{code} {name} ({meaning})"


class CudaError(Exception):
    def __init__(self, call: str, code: int) -> None:
        self.call = call
        self.code = code
        super().__init__(f"{call} returned {describe(code)}")


class Driver:
    """libcuda.so.1, each call checked: a non-zero CUresult raises CudaError naming it.
    `before(call)` is told every call's name first (the worker's progress board)."""

    def __init__(self, before: Callable[[str], None] | None = None,
                 library: str = "libcuda.so.1") -> None:
        self.lib = ctypes.CDLL(library)
        self._before = before

    def before(self, note: str) -> None:
        """Say what the worker does now (outside any CUDA call)."""
        if self._before is not None:
            self._before(note)

    def call(self, name: str, *args: object, allow: tuple[int, ...] = ()) -> int:
        if self._before is not None:
            self._before(name)
        code = int(getattr(self.lib, name)(*args))
        if code != 0 and code not in allow:
            raise CudaError(name, code)
        return code


# The PTX of the compute phase: word i of the buffer becomes seed + i (address in data,
# offset by a per-run seed so that a kernel that did not run cannot pass on what an earlier
# run left). sm_52 / PTX 7.0: every driver from 450 compiles it for any GPU since Maxwell.
FILL_PTX = b"""
.version 7.0
.target sm_52
.address_size 64
.visible .entry fill(.param .u64 p, .param .u32 n, .param .u32 seed)
{
  .reg .pred %p<2>; .reg .b32 %r<8>; .reg .b64 %rd<5>;
  ld.param.u64 %rd1, [p];
  ld.param.u32 %r1, [n];
  ld.param.u32 %r7, [seed];
  mov.u32 %r2, %ctaid.x; mov.u32 %r3, %ntid.x; mov.u32 %r4, %tid.x;
  mad.lo.s32 %r5, %r2, %r3, %r4;
  setp.ge.u32 %p1, %r5, %r1;
  @%p1 bra DONE;
  cvta.to.global.u64 %rd2, %rd1;
  mul.wide.u32 %rd3, %r5, 4;
  add.s64 %rd4, %rd2, %rd3;
  add.s32 %r6, %r5, %r7;
  st.global.u32 [%rd4], %r6;
DONE:
  ret;
}
\0"""
