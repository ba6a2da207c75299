"""The shapes of the profile and of rule files, declared once (checked by gpuguard.config.schema).

Each Struct forbids unknown fields, so a misspelled key at any depth is an error; each
field has its type, and where a bare type name would not tell a user what to write, a
description in words (gpuguard.config.schema puts it in the message). What spans keys (a
`when:` rule needs a `message`, an override's threshold must exist and keep its kind)
is checked in code, in gpuguard.config.profile and gpuguard.config.ruleset, on these parsed values.

Apart from gpuguard.config.profile so that importing the Profile model stays cheap: msgspec
loads only when a file is read, after `gpuguard check` has forked its NVML worker.
"""

from __future__ import annotations

from typing import Annotated, Literal, TypeVar

import msgspec

RULE_ID_PATTERN = r"^[a-z][a-z0-9_]*(\.[a-z0-9_]+)+$"

# gpuguard.model.results.SEVERITIES as values (a test holds the two together)
Severity = Literal["warning", "critical"]
XidSeverity = Literal["critical", "warning", "ignore"]
XidAction = Literal["restart_app", "update_software", "reset_gpu", "reboot", "inspect_hardware",
                    "contact_vendor", "ignore", "follow_text"]

# gpuguard.judge.actions.Action, by severity (a test holds the two together)
RuleAction = Literal["none", "restart_app", "update_software", "reset_gpu", "reboot",
                     "inspect_hardware"]
# gpuguard.model.rule.KINDS (a test holds the two together): only a hardware finding
# escalates after a reboot
FindingKind = Literal["hardware", "setting", "software", "resource"]
Span = Annotated[str, msgspec.Meta(pattern=r"^[0-9]+(\.[0-9]+)?[smhd]$",
                                   description="a span such as 90s, 15m, 24h, 7d")]

# A key left out is UNSET; a key written without a value (null) is a wrong type, as it
# was before these shapes: `ecc:` alone is a mistake, not "no expectation".
Unset = msgspec.UnsetType
UNSET = msgspec.UNSET

T = TypeVar("T")


def given(value: T | Unset) -> T | None:
    """A field's value, or None where the file left the key out."""
    return None if isinstance(value, msgspec.UnsetType) else value


Flag = Annotated[bool, msgspec.Meta(description="true or false")]
Text = Annotated[str, msgspec.Meta(description="text")]
# 12.10 read as a number is 12.1: a version is text, so the user must quote it
Version = Annotated[str, msgspec.Meta(description='a quoted version such as "570.86.15"')]
VbiosVersion = Annotated[str, msgspec.Meta(
    description='a quoted VBIOS version such as "96.00.A5.00.1A"')]
ThresholdItem = bool | int | float | str
Threshold = Annotated[
    ThresholdItem | list[ThresholdItem],
    msgspec.Meta(description="a number, text, true or false, or a list of them"),
]


class _Strict(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    pass


class OverrideSpec(_Strict):
    """A change to a rule: a rule file's `overrides:` and the profile's `rules:`."""

    severity: Severity | Unset = UNSET
    enabled: Flag | Unset = UNSET
    thresholds: dict[str, Threshold] | Unset = UNSET
    remediation: Text | Unset = UNSET
    action: RuleAction | Unset = UNSET


class EscalationSpec(_Strict):
    """The same fatal finding `count` times within `window` escalates to inspect_hardware."""

    count: Annotated[int, msgspec.Meta(ge=2, description="a whole number >= 2")]
    window: Span


class RuleSpec(_Strict):
    id: Annotated[str, msgspec.Meta(
        pattern=RULE_ID_PATTERN,
        description="a lowercase id such as `family.name` (letters, digits, _)")]
    scope: Literal["host", "gpu"]
    severity: Severity
    summary: Text
    problem: Text | Unset = UNSET
    message: Text | Unset = UNSET
    remediation: Text = ""
    thresholds: dict[str, Threshold] = msgspec.field(default_factory=dict)
    enabled: Flag = True
    tags: Annotated[list[str], msgspec.Meta(description="a list of words")] = \
        msgspec.field(default_factory=list)
    when: Annotated[str, msgspec.Meta(description="an expression in quotes")] | Unset = UNSET
    cadence: Literal["fast", "slow"] = "fast"
    action: RuleAction | Unset = UNSET
    kind: FindingKind | Unset = UNSET
    auto_clear: Span | Unset = UNSET
    escalate: EscalationSpec | Unset = UNSET


class XidSpec(_Strict):
    """One Xid's grading; an Xid the catalog does not know yet needs all three. The pack
    also names NVIDIA's mnemonic and buckets, and why it grades a code otherwise."""

    severity: XidSeverity | Unset = UNSET
    action: XidAction | Annotated[list[XidAction], msgspec.Meta(min_length=1)] | Unset = UNSET
    meaning: Text | Unset = UNSET
    mnemonic: Text | Unset = UNSET
    nvidia: Annotated[list[str], msgspec.Meta(max_length=2, description=(
        "NVIDIA's buckets: [immediate, investigatory]"))] | Unset = UNSET
    reason: Text | Unset = UNSET


class RulesFile(_Strict):
    rules: list[RuleSpec] = msgspec.field(default_factory=list)
    overrides: dict[str, OverrideSpec] = msgspec.field(default_factory=dict)
    xid_catalog: dict[int, XidSpec] = msgspec.field(default_factory=dict)
    # NVSwitch SXids: the same shape and actions as the Xid catalog (rules/sxid.yaml)
    sxid_catalog: dict[int, XidSpec] = msgspec.field(default_factory=dict)
    # Which catalog and of when: "NVIDIA's Xid catalog of 2025-10-29"
    xid_catalog_source: Text | Unset = UNSET
    sxid_catalog_source: Text | Unset = UNSET


class DriverSpec(_Strict):
    min_version: Version | Unset = UNSET
    min_cuda_version: Version | Unset = UNSET


class VbiosSpec(_Strict):
    # GPU model name (as NVML reports it) -> the VBIOS versions allowed on it
    allowed: dict[str, Annotated[list[VbiosVersion], msgspec.Meta(
        description="a list of quoted versions")]] = msgspec.field(default_factory=dict)


class P2pSpec(_Strict):
    # every GPU pair must have peer access over NVLink (a TP replica spans them all)
    require_nvlink: Flag | Unset = UNSET


Gbps = Annotated[float, msgspec.Meta(gt=0, description="GB/s, a number > 0")]


class ProbeFloorsSpec(_Strict):
    # GB/s floors for one GPU model, replacing the ones derived from its link and SKU
    pcie: Gbps | Unset = UNSET
    memory: Gbps | Unset = UNSET
    nvlink: Gbps | Unset = UNSET


class ActiveProbeSpec(_Strict):
    """`active_probe:` in the profile (gpuguard check --active, docs/active-probe.md)."""

    deadline_s: Annotated[float, msgspec.Meta(gt=0, le=600, description="seconds, 0-600")] \
        | Unset = UNSET
    buffer_mib: Annotated[int, msgspec.Meta(ge=1, le=16384, description="MiB, 1-16384")] \
        | Unset = UNSET
    pattern_mib: Annotated[int, msgspec.Meta(ge=1, le=16384, description="MiB, 1-16384")] \
        | Unset = UNSET
    max_memory_percent: Annotated[float, msgspec.Meta(ge=0, le=100,
                                                      description="percent, 0-100")] \
        | Unset = UNSET
    max_utilization_percent: Annotated[float, msgspec.Meta(ge=0, le=100,
                                                           description="percent, 0-100")] \
        | Unset = UNSET
    # GPU model name (as NVML reports it) -> its floors
    floors_gbps: dict[str, ProbeFloorsSpec] | Unset = UNSET


class ProfileFile(_Strict):
    gpu_count: Annotated[int, msgspec.Meta(ge=0, description="a whole number >= 0")] \
        | Unset = UNSET
    driver: DriverSpec | Unset = UNSET
    vbios: VbiosSpec | Unset = UNSET
    # YAML reads a bare `on`/`off` as a boolean, so both spellings are taken
    ecc: Literal["enabled", "disabled"] | bool | Unset = UNSET
    xid_window: Annotated[str, msgspec.Meta(
        description="`boot` or a span such as 90s, 15m, 2h, 1d")] | Unset = UNSET
    docker: Literal["required", "optional"] | Unset = UNSET
    nvlink_links_per_gpu: Annotated[int, msgspec.Meta(
        ge=0, description="a whole number >= 0")] | Unset = UNSET
    p2p: P2pSpec | Unset = UNSET
    mig: Literal["enabled", "disabled"] | bool | Unset = UNSET
    # devices.uvm: `required` (always) or `auto` (only while a CUDA process runs)
    uvm: Literal["required", "auto"] | Unset = UNSET
    # devices.peermem: GPUDirect RDMA through nvidia-peermem
    gpudirect_rdma: Flag | Unset = UNSET
    disk_paths: Annotated[list[Annotated[str, msgspec.Meta(min_length=1)]], msgspec.Meta(
        max_length=64, description="a list of absolute paths")] | Unset = UNSET
    active_probe: ActiveProbeSpec | Unset = UNSET
    # the daemon's status page at / (gpuguard/daemon/status_page.py), loopback only
    status_page: Flag | Unset = UNSET
    # the daemon's dcgm-exporter series beside its own (gpuguard/outputs/metrics_dcgm.py)
    metrics_compat: Literal["dcgm"] | Unset = UNSET
    rules: dict[str, OverrideSpec] | Unset = UNSET
