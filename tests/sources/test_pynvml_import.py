"""sources/pynvml_import.py: pynvml imported without ctypes.util (issue 32), in a fresh
interpreter as a worker is: none of ctypes.util's imports come with it, nothing of the
stand-in is left, and pynvml's find_library still answers as the real one does."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.conftest import REPO

PROBE = """
import json, sys
from gpuguard.sources.pynvml_import import import_pynvml
nv = import_pynvml()
after = {m: m in sys.modules for m in ("ctypes.util", "subprocess", "shutil")}
found = nv.find_library("c")
import ctypes.util
print(json.dumps({"after": after, "found": found, "real": ctypes.util.find_library("c"),
                  "real_is_module_file": ctypes.util.__file__ is not None,
                  "init": hasattr(nv, "nvmlInit")}))
"""


def test_pynvml_comes_without_ctypes_util_and_leaves_nothing_behind() -> None:
    done = subprocess.run([sys.executable, "-c", PROBE], cwd=REPO, capture_output=True,
                          text=True, timeout=60, check=True)
    got = json.loads(done.stdout)
    assert got["after"] == {"ctypes.util": False, "subprocess": False, "shutil": False}
    assert got["init"] and got["real_is_module_file"]
    assert got["found"] == got["real"] and got["found"]  # e.g. libc.so.6
