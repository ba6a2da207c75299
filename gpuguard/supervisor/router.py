"""The nginx router: the upstream file names the active variant, then `nginx -s reload`
(graceful: old workers finish their requests, new ones use the new upstream)."""

from __future__ import annotations

import re
import subprocess
import time

from gpuguard.io.atomic import write_text
from gpuguard.supervisor.config import Nginx

_SERVER = re.compile(r"^\s*server\s+(\S+?);", re.MULTILINE)


class RouterError(Exception):
    pass


def upstream_name(service: str) -> str:
    return "gpuguard_" + re.sub(r"[^A-Za-z0-9_]", "_", service)


def route(service: str, cfg: Nginx, variant: str) -> None:
    address = cfg.gpu if variant == "gpu" else cfg.cpu
    text = (f"# written by gpuguard for service {service}: the {variant} variant serves\n"
            f"upstream {upstream_name(service)} {{\n    server {address};\n}}\n")
    cfg.upstream_file.parent.mkdir(parents=True, exist_ok=True)
    write_text(cfg.upstream_file, text)
    proc = subprocess.run(cfg.reload, capture_output=True, text=True, timeout=30, check=False)
    if proc.returncode != 0:
        raise RouterError(f"{' '.join(cfg.reload)} failed: {proc.stderr.strip()[-300:]}")
    time.sleep(cfg.drain)


def routed(cfg: Nginx) -> str | None:
    """Which variant the upstream file points at, or None."""
    try:
        match = _SERVER.search(cfg.upstream_file.read_text())
    except OSError:
        return None
    if not match:
        return None
    return {cfg.gpu: "gpu", cfg.cpu: "cpu"}.get(match.group(1))
