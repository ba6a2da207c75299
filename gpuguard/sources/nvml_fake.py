"""Is the NVML library that pynvml loaded the tests' fake (tests/fake_nvml)?

The fake exports a marker symbol no real libnvidia-ml has. A reader who ran the README's
fake-NVML recipe and kept its LD_LIBRARY_PATH would otherwise get four GPUs and a critical
from their next `gpuguard check`, with no sign that none of it is real (issue 28). Runs in
the NVML worker only, after nvmlInit; on a real driver it costs one failed dlsym.
"""

from __future__ import annotations

import ctypes
import os

# typing and collections.abc only for the type checker: this module runs in the NVML
# worker before its first NVML call (typing is 5-7 ms there on the H200 host)
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

MARKER = "gpuguard_fake_nvml_marker"


class _DlInfo(ctypes.Structure):
    _fields_ = [("dli_fname", ctypes.c_char_p), ("dli_fbase", ctypes.c_void_p),
                ("dli_sname", ctypes.c_char_p), ("dli_saddr", ctypes.c_void_p)]


def fake_library(nv: Any) -> dict[str, Any] | None:
    """{"t": "fake", "library": its path, "settings": the FAKE_NVML_* variables in force}
    when pynvml's library is the fake, else None."""
    lib = getattr(nv, "nvmlLib", None)
    marker = None if lib is None else marker_of(lib)
    if marker is None:
        return None
    settings = " ".join(f"{name}={value}" for name, value in sorted(os.environ.items())
                        if name.startswith("FAKE_NVML_"))
    return {"t": "fake", "library": _path_of(ctypes.addressof(marker), lib), "settings": settings}


def marker_of(lib: Any) -> Any:
    """The fake's marker symbol in a loaded library (ctypes.CDLL), or None: a real
    driver's library has no such symbol."""
    try:
        return ctypes.c_int.in_dll(lib, MARKER)
    except (ValueError, OSError):
        return None


def _path_of(address: int, lib: Any) -> str:
    """The file the symbol at `address` was loaded from (dladdr), else the name pynvml
    asked the loader for."""
    info = _DlInfo()
    try:
        found = ctypes.CDLL(None).dladdr(ctypes.c_void_p(address), ctypes.byref(info))
    except (AttributeError, OSError):
        found = 0
    name: bytes | None = info.dli_fname
    if found and name:
        return os.path.realpath(name.decode(errors="replace"))
    return str(getattr(lib, "_name", "libnvidia-ml.so.1"))
