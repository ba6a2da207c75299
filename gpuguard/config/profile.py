"""The host profile: what this machine should look like.

    gpu_count: 8
    driver:
      min_version: "570.86.15"
      min_cuda_version: "12.8"
    vbios:
      allowed:
        NVIDIA H200: ["96.00.A5.00.1A"]
    ecc: enabled
    xid_window: 2h         # or boot (the default)
    docker: required       # toolkit.docker is critical when the daemon is down
    nvlink_links_per_gpu: 18   # nvlink.state: links up on every GPU (default: its peers')
    p2p: {require_nvlink: true}  # p2p.status: every GPU pair peers over NVLink
    mig: disabled          # mig.mode: the MIG mode every GPU must be in
    uvm: required          # devices.uvm: nvidia-uvm loaded even before CUDA's first use
    gpudirect_rdma: true   # devices.peermem: nvidia-peermem and an RDMA device node
    disk_paths: [/var/lib/models]  # host.disk: free space here (and Docker's data root)
    status_page: true      # the daemon's page at / on a loopback listener (docs/status-page.md)
    metrics_compat: dcgm   # the daemon also exports dcgm-exporter's series (docs/metrics.md)
    active_probe:          # gpuguard check --active (docs/active-probe.md)
      buffer_mib: 256      # bandwidth copies; pattern_mib: 64 for memory.pattern
      floors_gbps:         # per GPU model, instead of the floors derived from link and SKU
        NVIDIA H200: {pcie: 40, memory: 2400, nvlink: 240}
    rules:                 # overrides, same shape as a rule file's `overrides:`
      pcie.replays:
        thresholds: {max_replays: 500}
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING

from gpuguard.config.yamlfile import ConfigError, Mapping, load, short
from gpuguard.model.profile import Profile

if TYPE_CHECKING:
    from gpuguard.config.shapes import ProfileFile

# The helpers below import `given` from gpuguard.config.shapes when they run, as
# load_profile does: importing this module must not load msgspec (see config_shapes).


def load_profile(path: Path) -> Profile:
    """The profile in `path`, checked whole against config_shapes.ProfileFile (an unknown
    key or a wrong type at any depth is `file:line: what is wrong`), then the values."""
    # msgspec and the shapes load here, not with the Profile model (see config_shapes)
    from gpuguard.config import schema
    from gpuguard.config.shapes import ProfileFile, given

    doc = load(path)
    profile = Profile(path=path)
    if doc is None:
        return profile
    if not isinstance(doc, Mapping):
        raise ConfigError(path, 1, "a profile is a mapping (gpu_count, driver, vbios, ecc, "
                          "xid_window, docker, nvlink_links_per_gpu, p2p, mig, uvm, "
                          "gpudirect_rdma, disk_paths, status_page, metrics_compat, active_probe, "
                          "rules)")
    spec = schema.convert(doc, ProfileFile, path)
    _read_gpu_expectations(profile, spec)
    # of two values wrong in a way the shapes cannot tell, the one written first in the
    # documented order is named: the driver's versions, the Xid window, the disk paths
    _read_driver(profile, path, doc, spec)
    profile.xid_window_s = _xid_window(path, doc, spec)
    profile.docker_required = spec.docker == "required"
    profile.disk_paths = _disk_paths(path, doc, spec)
    _read_active_probe(profile, spec)
    if given(spec.rules) is not None:
        profile.rule_overrides = doc["rules"]
    return profile


def _read_gpu_expectations(profile: Profile, spec: ProfileFile) -> None:
    """What each GPU must be: count, VBIOS, ECC and MIG modes, NVLink links, P2P."""
    from gpuguard.config.shapes import given

    profile.gpu_count = given(spec.gpu_count)
    if (vbios := given(spec.vbios)) is not None:
        profile.vbios_allowed = {model: [v.upper() for v in versions]
                                 for model, versions in vbios.allowed.items()}
    if (ecc := given(spec.ecc)) is not None:
        profile.ecc_expected = ecc in ("enabled", True)
    profile.nvlink_links_per_gpu = given(spec.nvlink_links_per_gpu)
    if (p2p := given(spec.p2p)) is not None:
        profile.p2p_require_nvlink = given(p2p.require_nvlink) is True
    if (mig := given(spec.mig)) is not None:
        profile.mig_expected = mig in ("enabled", True)
    profile.uvm_required = given(spec.uvm) == "required"
    profile.gpudirect_rdma = given(spec.gpudirect_rdma) is True
    profile.status_page = given(spec.status_page) is True
    profile.metrics_compat = given(spec.metrics_compat)


def _read_driver(profile: Profile, path: Path, doc: Mapping, spec: ProfileFile) -> None:
    from gpuguard.config.shapes import given

    if (driver := given(spec.driver)) is None:
        return
    lines = doc["driver"]
    profile.driver_min_version = _version(path, lines, "min_version",
                                          given(driver.min_version))
    profile.cuda_min_version = _version(path, lines, "min_cuda_version",
                                        given(driver.min_cuda_version))


def _xid_window(path: Path, doc: Mapping, spec: ProfileFile) -> float | None:
    """Seconds of kernel log in which an Xid counts; None: since boot (also when unset)."""
    from gpuguard.config.shapes import given

    if (window := given(spec.xid_window)) is None:
        return None
    try:
        return parse_window(window)
    except ValueError as exc:
        raise ConfigError(path, doc.line_of("xid_window"), str(exc)) from exc


def _disk_paths(path: Path, doc: Mapping, spec: ProfileFile) -> list[Path]:
    from gpuguard.config.shapes import given

    paths = []
    for text in given(spec.disk_paths) or []:
        if not text.startswith("/"):
            raise ConfigError(path, doc.line_of("disk_paths"),
                              f"disk_paths: {short(text)} is not an absolute path")
        paths.append(Path(text))
    return paths


def _read_active_probe(profile: Profile, spec: ProfileFile) -> None:
    """The settings and GB/s floors given; those left out keep the probe's defaults."""
    from gpuguard.config.shapes import given

    if (probe := given(spec.active_probe)) is None:
        return
    profile.probe_settings = {
        name: value for name in ("deadline_s", "buffer_mib", "pattern_mib",
                                 "max_memory_percent", "max_utilization_percent")
        if (value := given(getattr(probe, name))) is not None}
    profile.probe_floors_gbps = {
        model: {kind: value for kind in ("pcie", "memory", "nvlink")
                if (value := given(getattr(floors, kind))) is not None}
        for model, floors in (given(probe.floors_gbps) or {}).items()}


def _version(path: Path, section: Mapping, key: str, value: str | None) -> str | None:
    if value is not None:
        try:
            parse_version(value)
        except ValueError as exc:
            raise ConfigError(path, section.line_of(key), f"driver: {key}: {exc}") from exc
    return value


def parse_version(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(part) for part in text.strip().split("."))
    except ValueError:
        raise ValueError(f"{short(text)} is not a dotted version such as 570.86.15") from None


_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_span(text: object) -> float | None:
    """A span such as 90s, 15m, 2h, 1d in seconds; None for `boot` or anything else."""
    try:
        return parse_window(text)
    except ValueError:
        return None


def parse_window(text: object) -> float | None:
    """`boot` (None: since boot), or a span such as 90s, 15m, 2h, 1d."""
    if text == "boot":
        return None
    if isinstance(text, str) and len(text) > 1 and text[-1] in _UNITS:
        try:
            value = float(text[:-1])
        except ValueError:
            value = -1
        if value > 0 and math.isfinite(value):  # "infh" or "nanm" is no span
            return value * _UNITS[text[-1]]
    raise ValueError(f"xid window must be `boot` or a span such as 90s, 15m, 2h, 1d, "
                     f"not {short(text)}")
