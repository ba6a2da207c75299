"""`import pynvml` in an NVML worker, without importing ctypes.util.

Why: pynvml does `from ctypes.util import find_library` and never calls it (it loads
libnvidia-ml.so.1 by name). ctypes.util pulls in subprocess, shutil and re: about 17 ms of
the 24-34 ms the import takes on an H200 host, on the critical path of a cold
`gpuguard check` (issue 32). For the import only, a stand-in module is in sys.modules
whose find_library imports the real one if anything ever calls it; it is removed right
after, so any later `import ctypes.util` gets the real module.
"""

from __future__ import annotations

import sys
import types

# typing and collections.abc only for the type checker: this module runs in the NVML
# worker before its first NVML call (typing is 5-7 ms there on the H200 host)
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any


def import_pynvml() -> Any:
    if "ctypes.util" in sys.modules:
        import pynvml

        return pynvml
    stand_in = types.ModuleType("ctypes.util", "gpuguard's stand-in during import pynvml")

    def find_library(name: str) -> str | None:
        if sys.modules.get("ctypes.util") is stand_in:
            del sys.modules["ctypes.util"]
        import ctypes.util

        return ctypes.util.find_library(name)

    stand_in.find_library = find_library  # type: ignore[attr-defined]
    sys.modules["ctypes.util"] = stand_in
    try:
        import pynvml
    finally:
        if sys.modules.get("ctypes.util") is stand_in:
            del sys.modules["ctypes.util"]
    return pynvml
