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
    rules:                 # overrides, same shape as a rule file's `overrides:`
      pcie.replays:
        thresholds: {max_replays: 500}
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from gpuguard.yamlfile import ConfigError, Mapping, load, short

PROFILE_KEYS = {"gpu_count", "driver", "vbios", "ecc", "rules", "xid_window", "docker"}


@dataclass
class Profile:
    path: Path | None = None
    gpu_count: int | None = None
    driver_min_version: str | None = None
    cuda_min_version: str | None = None
    vbios_allowed: dict[str, list[str]] = field(default_factory=dict)
    ecc_expected: bool | None = None
    # Seconds of kernel log in which an Xid counts; None: since boot.
    xid_window_s: float | None = None
    docker_required: bool = False
    rule_overrides: Mapping | None = None


def load_profile(path: Path) -> Profile:
    doc = load(path)
    profile = Profile(path=path)
    if doc is None:
        return profile
    if not isinstance(doc, Mapping):
        raise ConfigError(path, 1, "a profile is a mapping (gpu_count, driver, vbios, ecc, rules)")
    if (key := doc.first_unknown(PROFILE_KEYS)) is not None:
        allowed = ", ".join(sorted(PROFILE_KEYS))
        raise ConfigError(path, doc.line_of(key),
                          f"unknown profile key {key!r} (allowed: {allowed})")

    if "gpu_count" in doc:
        count = doc["gpu_count"]
        if isinstance(count, bool) or not isinstance(count, int) or count < 0:
            raise ConfigError(path, doc.line_of("gpu_count"),
                              f"gpu_count must be a whole number >= 0, not {short(count)}")
        profile.gpu_count = count

    driver = _section(path, doc, "driver", {"min_version", "min_cuda_version"})
    if driver is not None:
        profile.driver_min_version = _version(path, driver, "min_version")
        profile.cuda_min_version = _version(path, driver, "min_cuda_version")

    vbios = _section(path, doc, "vbios", {"allowed"})
    if vbios is not None and "allowed" in vbios:
        allowed = vbios["allowed"]
        if not isinstance(allowed, Mapping):
            raise ConfigError(path, vbios.line_of("allowed"),
                              "vbios.allowed maps a GPU model name to a list of VBIOS versions")
        for model, versions in allowed.items():
            if not isinstance(versions, list) or not all(isinstance(v, str) for v in versions):
                raise ConfigError(path, allowed.line_of(model),
                                  f"vbios.allowed[{model!r}] must be a list of quoted versions")
            profile.vbios_allowed[model] = [v.upper() for v in versions]

    if "ecc" in doc:
        ecc = doc["ecc"]
        # YAML reads a bare `on`/`off` as a boolean, so accept both spellings.
        if ecc in ("enabled", True):
            profile.ecc_expected = True
        elif ecc in ("disabled", False):
            profile.ecc_expected = False
        else:
            raise ConfigError(path, doc.line_of("ecc"),
                              f"ecc must be `enabled` or `disabled`, not {short(ecc)}")

    if "xid_window" in doc:
        try:
            profile.xid_window_s = parse_window(doc["xid_window"])
        except ValueError as exc:
            raise ConfigError(path, doc.line_of("xid_window"), str(exc)) from exc

    if "docker" in doc:
        if doc["docker"] not in ("required", "optional"):
            raise ConfigError(path, doc.line_of("docker"),
                              "docker must be `required` or `optional`, "
                              f"not {short(doc['docker'])}")
        profile.docker_required = doc["docker"] == "required"

    if "rules" in doc:
        if not isinstance(doc["rules"], Mapping):
            raise ConfigError(path, doc.line_of("rules"), "rules: must map rule ids to overrides")
        profile.rule_overrides = doc["rules"]
    return profile


def _section(path: Path, doc: Mapping, name: str, keys: set[str]) -> Mapping | None:
    if name not in doc:
        return None
    section = doc[name]
    if not isinstance(section, Mapping):
        raise ConfigError(path, doc.line_of(name), f"{name} must be a mapping")
    if (key := section.first_unknown(keys)) is not None:
        raise ConfigError(path, section.line_of(key),
                          f"unknown key {name}.{key} (allowed: {', '.join(sorted(keys))})")
    return section


def _version(path: Path, section: Mapping, key: str) -> str | None:
    if key not in section:
        return None
    value = section[key]
    if not isinstance(value, str):
        # 12.10 read as a number is 12.1: refuse rather than guess.
        raise ConfigError(path, section.line_of(key),
                          f"{key} must be a quoted version such as \"{value}\", not a number")
    try:
        parse_version(value)
    except ValueError as exc:
        raise ConfigError(path, section.line_of(key), str(exc)) from exc
    return value


def parse_version(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(part) for part in text.strip().split("."))
    except ValueError:
        raise ValueError(f"{short(text)} is not a dotted version such as 570.86.15") from None


_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_window(text: object) -> float | None:
    """`boot` (None: since boot), or a span such as 90s, 15m, 2h, 1d."""
    if text == "boot":
        return None
    if isinstance(text, str) and len(text) > 1 and text[-1] in _UNITS:
        try:
            value = float(text[:-1])
        except ValueError:
            value = -1
        if value > 0:
            return value * _UNITS[text[-1]]
    raise ValueError(f"xid window must be `boot` or a span such as 90s, 15m, 2h, 1d, "
                     f"not {short(text)}")
