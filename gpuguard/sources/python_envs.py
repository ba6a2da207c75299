"""The CUDA version a Python environment's PyTorch was built for, read from its installed
files without importing torch (issue 24; image.cuda judges it, docs/image-cuda.md).

`torch/version.py`, which PyTorch's build writes: `__version__ = '2.7.0+cu128'` and
`cuda = '12.8'` (`cuda: Optional[str] = '12.8'` since 2.x; None in a CPU or ROCm build,
whose `hip` is then set). The wheel's `torch-<version>.dist-info` folder names the
version pip installed, a second witness. The environment is a virtualenv or prefix
(`lib*/python3*/site-packages`, Debian's `dist-packages`), its `lib*/python3.X` folder
(the parent of site-packages, as `python -c 'import sys; print(sys.prefix)'` users often
give it), or a site-packages folder.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path
from typing import Any

from gpuguard.io.bounded import read_text
from gpuguard.model.workload import Workload

_ASSIGNMENT = re.compile(r"^(__version__|cuda|hip)\s*(?::[^=]*)?=\s*(.{1,200}?)\s*$",
                         re.MULTILINE)
_MAX_FILE = 64 * 1024


def read(workload: Workload, deadline_s: float) -> dict[str, Any]:
    entry = workload.facts()
    path = Path(workload.name)
    if not path.is_dir():
        return {**entry, "error": f"{path} is not a directory"}
    site = site_packages(path)
    if site is None:
        return {**entry, "error": f"no site-packages with torch under {path}"}
    entry["site_packages"] = str(site)
    dist = sorted(site.glob("torch-*.dist-info"))
    if dist:
        entry["dist_info_version"] = dist[-1].name[len("torch-"):-len(".dist-info")]
    try:
        text = read_text(site / "torch" / "version.py", _MAX_FILE, deadline_s)
    except OSError as exc:
        return {**entry, "error": str(exc)}
    values = _assignments(text)
    if "__version__" not in values:
        return {**entry, "error": f"{site / 'torch' / 'version.py'} names no __version__"}
    entry.update(torch_version=values["__version__"], cuda=values.get("cuda"),
                 hip=values.get("hip"), **{"from": "torch/version.py"})
    return entry


def site_packages(path: Path) -> Path | None:
    """The folder that holds torch: `path` itself, the site-packages of the Python folder
    `path` is (`lib/python3.11`), or the newest Python's site-packages under it."""
    if (path / "torch").is_dir():
        return path
    found = [p.parent for pattern in ("site-packages/torch", "dist-packages/torch",
                                      "lib*/python3*/site-packages/torch",
                                      "lib*/python3*/dist-packages/torch",
                                      "local/lib/python3*/dist-packages/torch")
             for p in path.glob(pattern) if p.is_dir()]
    return max(found, key=lambda p: _python_minor(p), default=None)


def _python_minor(site: Path) -> int:
    match = re.search(r"python3\.(\d+)", str(site))
    return int(match.group(1)) if match else 0


def _assignments(text: str) -> dict[str, str | None]:
    """`NAME = 'text'` or `NAME = None` lines (other values are not PyTorch's)."""
    values: dict[str, str | None] = {}
    for name, raw in _ASSIGNMENT.findall(text):
        try:
            value = ast.literal_eval(raw)
        except (ValueError, SyntaxError):
            continue
        if value is None or isinstance(value, str):
            values.setdefault(name, value)
    return values
