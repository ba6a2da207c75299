"""How NVIDIA's resolution buckets map onto gpuguard's grades: the one table of it.

NVIDIA's Xid catalog ("Analyzing Xid Errors with the Xid Catalog") gives each code an
immediate and an investigatory resolution bucket; the Fabric Manager guide files each
NVSwitch SXid as non-fatal, fatal (as its line says), always fatal or other. rules/xid.yaml
and rules/sxid.yaml hold every code with its buckets and its grade; where the grade is not
what this table says, the entry carries its `reason` (tests/test_xid_catalog.py and
tests/test_sxid_catalog.py hold the data to the table and to the saved catalogs), and
docs/rules.md prints the table (scripts/gen_rules_doc.py).

A grade is (severity, action word of the catalog); `follow_text` means the line carries
its own grade (the NVLink5 Xids' Fatal / Nonfatal, Xid 154's recovery action, an SXid's
Fatal / Non-fatal: judge/xids.py, judge/sxids.py), with the severity given here standing
where the line says neither.
"""

from __future__ import annotations

Grade = tuple[str, str]
BY_LINE: Grade = ("critical", "follow_text")

# Immediate bucket -> grade. "CONTACT_SUPPORT" depends on whether the code is in use
# (grade_xid); a bucket mapped to None is a workflow the line does not settle, graded in
# the data with its reason.
XID_BUCKETS: dict[str, Grade | None] = {
    "IGNORE": ("ignore", "ignore"),
    # the application's fault, not the GPU's
    "RESTART_APP": ("warning", "restart_app"),
    "CHECK_APP/CUDA": ("warning", "restart_app"),
    "RESET_GPU": ("critical", "reset_gpu"),
    "RESTART_BM": ("critical", "reboot"),
    "RESTART_VM": ("critical", "reboot"),
    "CHECK_MECHANICALS": ("critical", "inspect_hardware"),
    # software or firmware to update: the board is not at fault
    "UPDATE_SWFW": ("warning", "update_software"),
    "CHECK_UVM": ("warning", "update_software"),
    "WORKFLOW_NVLINK5_ERR": BY_LINE,
    "XID_154": BY_LINE,
    "WORKFLOW_XID_45": None,
    "WORKFLOW_XID_48": None,
    "WORKFLOW_NVLINK_ERR": None,
}
CONTACT_SUPPORT_IN_USE: Grade = ("critical", "inspect_hardware")
CONTACT_SUPPORT_UNUSED: Grade = ("warning", "inspect_hardware")
# No bucket NVIDIA names, or one this table does not know: a person looks at it.
NO_BUCKET: Grade = ("warning", "inspect_hardware")


def grade_xid(immediate: str, investigatory: str, in_use: bool) -> Grade | None:
    """The grade the table gives a catalog code; None for a workflow graded in the data.
    A code in use without an immediate bucket takes its investigatory bucket's grade."""
    bucket = immediate or investigatory
    if bucket == "CONTACT_SUPPORT":
        return CONTACT_SUPPORT_IN_USE if in_use else CONTACT_SUPPORT_UNUSED
    if bucket in XID_BUCKETS:
        return XID_BUCKETS[bucket]
    return NO_BUCKET


# The Fabric Manager guide's SXid classes (appendix D) -> grade. A fatal SXid takes the
# switch's links down until the NVSwitches and GPUs are reset: on a bare-metal host, a reboot.
SXID_CLASSES: dict[str, Grade] = {
    "non-fatal": ("warning", "inspect_hardware"),
    "potentially-fatal": ("critical", "follow_text"),
    "always-fatal": ("critical", "reboot"),
    "other": ("warning", "inspect_hardware"),
}


def grade_sxid(kind: str) -> Grade:
    return SXID_CLASSES.get(kind, NO_BUCKET)
