"""Load the targets per GPU model of `gpuguard qualify` (rules/gpus/*.yaml, issue 29 item
5): one file per model naming the product names NVML reports for it and, for each target,
its value and where the value comes from. Checked whole when loaded: an unknown key, a
target without a source, a value that is not a positive number, a power share above 1, a
model that is not its file's name, a product name two files claim, a judged key neither
given nor explained under `not_judged` is `file:line: what is wrong`."""

from __future__ import annotations

import math
from functools import lru_cache
from pathlib import Path
from types import MappingProxyType
from typing import Annotated, Any, Literal

import msgspec

from gpuguard.config import schema
from gpuguard.config.ruleset import default_pack_dir
from gpuguard.config.yamlfile import ConfigError, Mapping, load
from gpuguard.model.gpu_target import JUDGED, GpuTargets, Target, TargetCatalog

Text = Annotated[str, msgspec.Meta(min_length=1)]
Positive = Annotated[float, msgspec.Meta(gt=0, description="a number above 0")]
Share = Annotated[float, msgspec.Meta(gt=0, le=1, description="a share above 0 and at "
                                                              "most 1, such as 0.9")]
ModelName = Annotated[str, msgspec.Meta(pattern=r"^[a-z0-9][a-z0-9-]{0,39}$",
                                        description="a lowercase model such as h200-sxm")]
JudgedKey = Literal["power_share", "hbm_gbps", "h2d_gbps", "d2h_gbps", "p2p_gbps",
                    "correctable_ecc_per_hour", "sm_clock_mhz"]


class _Strict(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    pass


class TargetSpec(_Strict):
    value: Positive
    # where the number comes from, precisely: a document and its table or field, or a URL
    source: Text
    note: Text | None = None


class ShareSpec(_Strict):
    value: Share
    source: Text
    note: Text | None = None


class TargetsSpec(_Strict):
    power_share: ShareSpec | None = None
    hbm_gbps: TargetSpec | None = None
    h2d_gbps: TargetSpec | None = None
    d2h_gbps: TargetSpec | None = None
    p2p_gbps: TargetSpec | None = None
    correctable_ecc_per_hour: TargetSpec | None = None
    sm_clock_mhz: TargetSpec | None = None


class SpecFacts(_Strict):
    """The data sheet's numbers the notes refer to; informational, never judged."""

    tdp_w: TargetSpec | None = None
    hbm_spec_gbps: TargetSpec | None = None
    pcie_gen: TargetSpec | None = None
    pcie_lanes: TargetSpec | None = None
    nvlink_links: TargetSpec | None = None
    nvlink_gbps: TargetSpec | None = None


class GpuFile(_Strict):
    model: ModelName
    title: Text
    names: Annotated[list[Text], msgspec.Meta(min_length=1)]
    targets: TargetsSpec
    spec: SpecFacts | None = None
    # a judged key left out on purpose -> why (no source gives one, no NVLink)
    not_judged: dict[JudgedKey, Text] | None = None


def gpus_dir() -> Path:
    return default_pack_dir() / "gpus"


@lru_cache(maxsize=4)
def load_targets(directory: Path | None = None) -> TargetCatalog:
    """Every model's targets; cached (they ship with gpuguard and never change while it
    runs)."""
    folder = directory or gpus_dir()
    models: dict[str, GpuTargets] = {}
    by_name: dict[str, str] = {}
    for path in sorted(folder.glob("*.yaml")):
        doc = load(path)
        targets = _targets(path, doc)
        for index, name in enumerate(targets.names):
            if name in by_name:
                other = models[by_name[name]].origin
                raise ConfigError(path, _name_line(doc), f"names[{index}]: {name!r} "
                                  f"is claimed by {by_name[name]} too ({other})")
            by_name[name] = targets.model
        models[targets.model] = targets
    if not models:
        raise ConfigError(folder, None, "no GPU target file found")
    return TargetCatalog(MappingProxyType(models), MappingProxyType(by_name))


def targets_for(nvml_name: str | None, directory: Path | None = None) -> GpuTargets | None:
    """The targets of the model NVML names so, or None for a model gpuguard has no file
    for: its measurements are then reported and only the judgements needing no target
    made."""
    return load_targets(directory).for_name(nvml_name)


def _targets(path: Path, doc: Any) -> GpuTargets:
    spec = schema.convert(doc, GpuFile, path)
    if spec.model != path.stem:
        raise ConfigError(path, doc.line_of("model"), f"model: {spec.model!r} is not the "
                          f"file's name ({path.stem}): the model is named by its file")
    names = tuple(name.strip() for name in spec.names)
    for index, name in enumerate(names):
        if name in names[:index]:
            raise ConfigError(path, _name_line(doc), f"names[{index}]: {name!r} "
                              "is listed twice")
    targets = _section(path, doc, "targets", spec.targets)
    facts = _section(path, doc, "spec", spec.spec) if spec.spec is not None else {}
    reasons: dict[str, str] = {str(k): v for k, v in (spec.not_judged or {}).items()}
    for key in reasons:
        if key in targets:
            raise ConfigError(path, doc["not_judged"].line_of(key), f"not_judged.{key}: "
                              f"{spec.model} has a target for {key}: judged or not, not both")
    # a target left out says why: a reader of the file (and of a qualify run's "not
    # judged") can tell a judgement no source supports from one forgotten
    unexplained = [key for key in JUDGED if key not in targets and key not in reasons]
    if unexplained:
        raise ConfigError(path, doc.line_of("targets"), f"targets: no {', '.join(unexplained)}"
                          " and no reason under not_judged: give a target or say why there "
                          "is none")
    return GpuTargets(spec.model, spec.title, names, MappingProxyType(targets), str(path),
                      MappingProxyType(facts), MappingProxyType(reasons))


def _section(path: Path, doc: Any, section: str, struct: msgspec.Struct) -> dict[str, Target]:
    """The set targets of one section, in the order JUDGED (or the struct) lists them; a
    value msgspec let through that is no finite number (`.inf`) is refused here."""
    found: dict[str, Target] = {}
    for key in struct.__struct_fields__:
        item = getattr(struct, key)
        if item is None:
            continue
        if not math.isfinite(item.value):
            raise ConfigError(path, doc[section][key].line_of("value"), f"{section}.{key}: "
                              f"value must be a finite number, not {item.value}")
        found[key] = Target(item.value, item.source.strip(), item.note)
    return found


def _name_line(doc: Any) -> int | None:
    """The line of `names:` (a scalar in a list has no line of its own; the message names
    the index)."""
    return doc.line_of("names") if isinstance(doc, Mapping) else None
