"""What `gpuguard qualify` expects of one GPU model (issue 29, item 5): the floors and
shares it judges a run against, each with the document it comes from, as rules/gpus/*.yaml
hold them (gpuguard/config/gpu_targets.py loads them). A model gpuguard has no file for is
measured and reported, and only the judgements that need no target are made."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

# The targets a qualify run is judged against, in the order the reading lists them.
# power_share: least share of the enforced power limit a full tensor-core load reaches;
# hbm_gbps: device-to-device copy, bytes read + bytes written per second; h2d/d2h_gbps:
# pinned copies, one direction; p2p_gbps: peer copy, one direction of one pair;
# correctable_ecc_per_hour: most correctable ECC errors per hour of the run;
# sm_clock_mhz: least SM clock under the load.
JUDGED = ("power_share", "hbm_gbps", "h2d_gbps", "d2h_gbps", "p2p_gbps",
          "correctable_ecc_per_hour", "sm_clock_mhz")
# Facts of the data sheet, each with its source: they explain the targets (a floor is
# a share of one of them) and are never judged.
SPEC = ("tdp_w", "hbm_spec_gbps", "pcie_gen", "pcie_lanes", "nvlink_links", "nvlink_gbps")


@dataclass(frozen=True)
class Target:
    value: float
    # where the number comes from: a document and its table or field, or a URL
    source: str
    # why this value, and how the source's measurement relates to gpuguard's
    note: str | None = None


@dataclass(frozen=True)
class GpuTargets:
    model: str  # the file's stem: h200-sxm
    title: str
    # the product names NVML reports for this model (nvmlDeviceGetName), exactly
    names: tuple[str, ...]
    targets: Mapping[str, Target]  # keys of JUDGED
    origin: str  # the file it was read from
    spec: Mapping[str, Target] = field(default_factory=dict)  # keys of SPEC
    # a judged key this model has no target for -> why (no source gives one, no NVLink)
    not_judged: Mapping[str, str] = field(default_factory=dict)

    def to_reading(self) -> dict[str, Any]:
        """The `targets` dict of the qualify reading: the model and each judged key's value
        and source (docs/qualify-targets.md; the spec of issue 29)."""
        out: dict[str, Any] = {"model": self.model}
        for key in JUDGED:
            target = self.targets.get(key)
            if target is not None:
                out[key] = {"value": target.value, "source": target.source}
        return out


@dataclass(frozen=True)
class TargetCatalog:
    """Every model's targets, and which model each NVML product name is."""

    models: Mapping[str, GpuTargets] = field(default_factory=dict)
    by_name: Mapping[str, str] = field(default_factory=dict)  # NVML name -> model

    def for_name(self, nvml_name: str | None) -> GpuTargets | None:
        """The targets of the model NVML names so (surrounding blanks aside), or None."""
        model = self.by_name.get(nvml_name.strip()) if nvml_name else None
        return self.models[model] if model is not None else None
