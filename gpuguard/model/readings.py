"""What a valid reading is: the types and ranges that the snapshot's fields declare
(gpuguard/model/snapshot.py: each field names its validator from here), checked whenever a
reading is set on a snapshot (from NVML's worker, a replayed file or an nvidia-smi dump).

A value that is not what its field says (a string where a number belongs, a NaN, a
negative GPU count, a list as a PCI address) becomes an error reading naming what was
wrong, so the rules that use it are unknown: a bad value is never judged as a value,
and never reaches the metrics or the daemon's history, where it could crash a cycle.

Standard library only: imported before `gpuguard check` forks its NVML worker.
"""

from __future__ import annotations

import math

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

    Validator = Callable[[Any], "str | None"]

# Text fields longer than this are not what any driver writes: a corrupt input.
MAX_TEXT = 4096
# Larger than any counter NVML keeps (64-bit) means the input is not a real reading.
MAX_COUNTER = 2**64
# What a GSP line without an Xid reports (sources/kmsg_gpu.py, checks/gsp.py).
GSP_KINDS = ("rpc_timeout", "crash", "boot_failed")


def whole(lo: float, hi: float) -> Validator:
    def check(value: Any) -> str | None:
        if isinstance(value, bool) or not isinstance(value, int):
            return f"must be a whole number, not {_show(value)}"
        if not lo <= value <= hi:
            return f"{value} is outside {lo:g}..{hi:g}"
        return None
    return check


def number(lo: float, hi: float) -> Validator:
    def check(value: Any) -> str | None:
        if isinstance(value, bool) or not isinstance(value, int | float):
            return f"must be a number, not {_show(value)}"
        if not math.isfinite(value):
            return f"must be a finite number, not {value}"
        if not lo <= value <= hi:
            return f"{value:g} is outside {lo:g}..{hi:g}"
        return None
    return check


def flag(value: Any) -> str | None:
    return None if isinstance(value, bool) else f"must be true or false, not {_show(value)}"


def text(value: Any) -> str | None:
    if not isinstance(value, str):
        return f"must be text, not {_show(value)}"
    if len(value) > MAX_TEXT:
        return f"text of {len(value)} characters is longer than any driver writes"
    return None


def text_list(value: Any) -> str | None:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        return f"must be a list of text, not {_show(value)}"
    return None


def mapping(value: Any) -> str | None:
    return None if isinstance(value, dict) else f"must be a mapping, not {_show(value)}"


def mapping_list(value: Any) -> str | None:
    if not isinstance(value, list) or not all(isinstance(v, dict) for v in value):
        return f"must be a list of mappings, not {_show(value)}"
    return None


def pci_gpus(value: Any) -> str | None:
    """[{"address": text, "driver": text or null, ...}] (sources/pci_gpus.py)."""
    if mapping_list(value):
        return mapping_list(value)
    for gpu in value:
        if not isinstance(gpu.get("address"), str) or \
                not (gpu.get("driver") is None or isinstance(gpu.get("driver"), str)):
            return f"a PCI GPU is not {{address, driver}}: {_show(gpu)}"
    return None


def _optional_int(value: Any, lo: int = 0) -> bool:
    return value is None or (isinstance(value, int) and not isinstance(value, bool)
                             and lo <= value < MAX_COUNTER)


def processes(value: Any) -> str | None:
    if not isinstance(value, list):
        return f"must be a list of processes, not {_show(value)}"
    for proc in value:
        pid = getattr(proc, "pid", None) if not isinstance(proc, dict) else proc.get("pid")
        used = (getattr(proc, "used_memory_bytes", None) if not isinstance(proc, dict)
                else proc.get("used_memory_bytes"))
        if not _optional_int(pid, 0) or pid is None or not _optional_int(used):
            return f"a process entry is not {{pid, used_memory_bytes, name}}: {_show(proc)}"
    return None


def aer(value: Any) -> str | None:
    if mapping_list(value):
        return mapping_list(value)
    for device in value:
        for kind in ("correctable", "nonfatal", "fatal"):
            counts = device.get(kind)
            if counts is None:
                continue
            if not isinstance(counts, dict) or not all(
                    isinstance(k, str) and _optional_int(v) and v is not None
                    for k, v in counts.items()):
                return f"AER counters of {_show(device.get('address'))} are not name: count"
    return None


def kernel_log(value: Any) -> str | None:
    if not isinstance(value, dict):
        return f"must be a kernel log summary, not {_show(value)}"
    if not isinstance(value.get("xids"), list):
        return "kernel log summary has no list of xids"
    # xids is a list by now; sxids and ooms came later and may be left out
    for key, event_problem in (("xids", _xid_event), ("sxids", _sxid_event),
                               ("ooms", _oom_kill), ("gsp", _gsp_line),
                               ("driver_loads", _driver_load), ("repairs", _repair)):
        events = value.get(key, [])
        if not isinstance(events, list):
            return f"kernel log summary's {key} is not a list"
        for event in events:
            if (problem := event_problem(event)) is not None:
                return problem
    for key in ("now_usec", "acked_seq", "xids_dropped", "sxids_dropped", "ooms_dropped",
                "gsp_dropped", "records_lost", "lost_before_seq", "lost_before_usec",
                "first_seq", "first_usec", "last_seq"):
        if not _optional_int(value.get(key)):
            return f"kernel log {key} is not a count: {_show(value.get(key))}"
    if not isinstance(value.get("cut_line", ""), str):
        return f"kernel log cut_line is not text: {_show(value.get('cut_line'))}"
    return None


def inforom(value: Any) -> str | None:
    """{"valid": true | false | null (validation not offered), "objects": {"oem" | "ecc" |
    "power": version}, "corrupted": [objects whose read said the InfoROM is corrupted]}."""
    if not isinstance(value, dict) or value.get("valid") not in (True, False, None):
        return f"must be an InfoROM state {{valid, objects, corrupted}}, not {_show(value)}"
    objects = value.get("objects")
    if not isinstance(objects, dict) or not all(isinstance(k, str) and isinstance(v, str)
                                                for k, v in objects.items()):
        return f"InfoROM objects must map a name to a version, not {_show(objects)}"
    return text_list(value.get("corrupted"))


def gpu_devices(value: Any) -> str | None:
    """{"stuck": {"processes": [{"pid", "comm", "devices", "off_cpu_s"}], "more",
    "unreadable": [...], "scanned"} or {"error"}, "modules": {name: state | null}, "rdma":
    [node]}: each part only where its root was read."""
    if not isinstance(value, dict):
        return f"must be a mapping of device facts, not {_show(value)}"
    stuck = value.get("stuck", {"processes": [], "unreadable": [], "more": 0})
    if not isinstance(stuck, dict):
        return f"stuck processes must be a mapping, not {_show(stuck)}"
    if "error" not in stuck:
        for key in ("processes", "unreadable"):
            listed = stuck.get(key)
            if not isinstance(listed, list) or not all(_stuck(p) for p in listed):
                return f"stuck {key} must be [{{pid, comm, off_cpu_s}}], not {_show(listed)}"
        if not _count(stuck.get("more")):
            return f"stuck processes' `more` is not a count: {_show(stuck.get('more'))}"
    modules = value.get("modules", {})
    if not isinstance(modules, dict) or not all(v is None or isinstance(v, str)
                                                for v in modules.values()):
        return f"modules must map a module to its state, not {_show(modules)}"
    return text_list(value.get("rdma", []))


def _stuck(p: Any) -> bool:
    off = p.get("off_cpu_s") if isinstance(p, dict) else "x"
    return (isinstance(p, dict) and _count(p.get("pid")) and _optional_texts(p, "comm")
            and (off is None or (isinstance(off, int | float) and not isinstance(off, bool)
                                 and math.isfinite(off)))
            and (p.get("devices") is None or text_list(p["devices"]) is None))


def _xid_event(event: Any) -> str | None:
    if not isinstance(event, dict) or not _count(event.get("xid")):
        return f"an Xid event is not {{xid: number, ...}}: {_show(event)}"
    if not _optional_counts(event, "seq", "usec", "n"):
        return f"an Xid event's seq/usec/n is not a count: {_show(event)}"
    if not _optional_texts(event, "pci"):
        return f"an Xid event's pci is not text: {_show(event)}"
    return None


def _sxid_event(event: Any) -> str | None:
    if not isinstance(event, dict) or not _count(event.get("sxid")):
        return f"an SXid event is not {{sxid: number, ...}}: {_show(event)}"
    if not _optional_counts(event, "seq", "usec", "link"):
        return f"an SXid event's seq/usec/link is not a count: {_show(event)}"
    if not _optional_texts(event, "switch"):
        return f"an SXid event's switch is not text: {_show(event)}"
    return None


def _gsp_line(event: Any) -> str | None:
    if not isinstance(event, dict) or event.get("kind") not in GSP_KINDS:
        return f"a GSP line is not {{kind: {'|'.join(GSP_KINDS)}, ...}}: {_show(event)}"
    if not _optional_counts(event, "seq", "usec", "rm_gpu", "n"):
        return f"a GSP line's seq/usec/rm_gpu/n is not a count: {_show(event)}"
    if not _optional_texts(event, "pci", "text"):
        return f"a GSP line's pci/text is not text: {_show(event)}"
    return None


def _driver_load(event: Any) -> str | None:
    if not isinstance(event, dict) or not _optional_counts(event, "seq", "usec") \
            or not _optional_texts(event, "version"):
        return f"a driver load is not {{version, seq, usec}}: {_show(event)}"
    return None


def _repair(event: Any) -> str | None:
    """A repair the kernel log shows (sources/kmsg_gpu.py): its place `n` decides what it
    clears, so it must be a count."""
    if not isinstance(event, dict) or event.get("kind") not in ("gpu_reset", "driver_reload") \
            or not _count(event.get("n")) or not _optional_counts(event, "seq", "usec") \
            or not _optional_texts(event, "uuid", "pci", "text"):
        return f"a repair is not {{kind: gpu_reset|driver_reload, n, ...}}: {_show(event)}"
    return None


def _oom_kill(event: Any) -> str | None:
    if not isinstance(event, dict) or not _count(event.get("pid")):
        return f"an OOM kill is not {{pid: number, ...}}: {_show(event)}"
    if not _optional_counts(event, "seq", "usec"):
        return f"an OOM kill's seq/usec is not a count: {_show(event)}"
    if not _optional_texts(event, "process", "scope", "cgroup"):
        return f"an OOM kill's process/scope/cgroup is not text: {_show(event)}"
    return None


def _count(value: Any) -> bool:
    """A count that must be there: a whole number 0 <= n < 2**64, not None."""
    return value is not None and _optional_int(value)


def _optional_counts(event: dict[str, Any], *keys: str) -> bool:
    return all(_optional_int(event.get(key)) for key in keys)


def _optional_texts(event: dict[str, Any], *keys: str) -> bool:
    return all(event.get(key) is None or isinstance(event.get(key), str) for key in keys)


HOST_MEMORY_KEYS = ("total_bytes", "available_bytes", "swap_total_bytes", "swap_used_bytes")


def host_memory(value: Any) -> str | None:
    if not isinstance(value, dict):
        return f"must be host memory sizes, not {_show(value)}"
    for key in HOST_MEMORY_KEYS:
        if not _optional_int(value.get(key)) or value.get(key) is None:
            return f"host memory {key} is not a size in bytes: {_show(value.get(key))}"
    if value["available_bytes"] > value["total_bytes"] or \
            value["swap_used_bytes"] > value["swap_total_bytes"]:
        return f"host memory sizes do not add up: {_show(value)}"
    return None


DISK_SIZE_KEYS = ("total_bytes", "free_bytes", "inodes_total", "inodes_free")


def disk_space(value: Any) -> str | None:
    if mapping_list(value):
        return mapping_list(value)
    for entry in value:
        if not isinstance(entry.get("path"), str) or entry.get("role") not in ("docker", "profile"):
            return f"a disk entry is not {{path: text, role: docker|profile, ...}}: {_show(entry)}"
        if entry.get("error") is not None:
            if not isinstance(entry["error"], str):
                return f"a disk entry's error is not text: {_show(entry)}"
            continue
        for key in DISK_SIZE_KEYS:
            if not _optional_int(entry.get(key)) or entry.get(key) is None:
                return f"disk {entry['path']} {key} is not a count: {_show(entry.get(key))}"
        if entry["free_bytes"] > entry["total_bytes"] or \
                entry["inodes_free"] > entry["inodes_total"]:
            return f"disk {entry['path']}: free is more than total"
    return None


FABRIC_STATES = ("not_started", "in_progress", "completed")
P2P_STATES = ("ok", "chipset_not_supported", "gpu_not_supported", "topology_not_supported",
              "disabled_by_regkey", "not_supported", "unknown")


def fabric_state(value: Any) -> str | None:
    if value not in FABRIC_STATES:
        return f"must be one of {', '.join(FABRIC_STATES)}, not {_show(value)}"
    return None


def nvlink_links(value: Any) -> str | None:
    if mapping_list(value):
        return mapping_list(value)
    for link in value:
        if not isinstance(link.get("link"), int) or isinstance(link.get("link"), bool) \
                or not isinstance(link.get("up"), bool):
            return f"an NVLink entry is not {{link: number, up: true|false, ...}}: {_show(link)}"
        for counter in ("version", "replay", "recovery", "crc_flit", "crc_data"):
            if not _optional_int(link.get(counter)):
                return f"NVLink {link['link']} {counter} is not a count: {_show(link)}"
        if link.get("remote_pci") is not None and not isinstance(link["remote_pci"], str):
            return f"NVLink {link['link']} remote_pci is not text"
    return None


def p2p(value: Any) -> str | None:
    if mapping_list(value):
        return mapping_list(value)
    for peer in value:
        if not _optional_int(peer.get("peer")) or peer.get("peer") is None:
            return f"a P2P entry has no peer index: {_show(peer)}"
        for kind in ("read", "write", "nvlink", "atomics"):
            if peer.get(kind) is not None and peer.get(kind) not in P2P_STATES:
                return f"P2P {kind} with GPU {peer['peer']} is {_show(peer.get(kind))}"
    return None


def _gbps(value: Any) -> bool:
    return not isinstance(value, bool) and isinstance(value, int | float) and \
        math.isfinite(value) and 0 <= value <= 1e6


def probe_check(value: Any) -> str | None:
    """An active probe's read-back: {"error": text|None, "mismatches": n|None, ...}."""
    if not isinstance(value, dict):
        return f"must be a probe result mapping, not {_show(value)}"
    if value.get("error") is not None and text(value["error"]):
        return f"a probe's error must be text, not {_show(value['error'])}"
    for key in ("mismatches", "words", "bytes"):
        if not _optional_int(value.get(key)):
            return f"a probe's {key} must be a count, not {_show(value.get(key))}"
    if value.get("error") is None and value.get("mismatches") is None:
        return "a probe result needs an error or a mismatch count"
    phases = value.get("phases_ms", {})
    if not isinstance(phases, dict) or not all(isinstance(k, str) and _gbps(v)
                                               for k, v in phases.items()):
        return f"a probe's phases_ms must map phases to milliseconds, not {_show(phases)}"
    return None


def probe_pcie(value: Any) -> str | None:
    if not isinstance(value, dict) or not all(_gbps(value.get(k))
                                              for k in ("h2d_gbps", "d2h_gbps")):
        return f"must be {{h2d_gbps, d2h_gbps}} in GB/s, not {_show(value)}"
    return None


def probe_peers(value: Any) -> str | None:
    if mapping_list(value):
        return mapping_list(value)
    for peer in value:
        if not _optional_int(peer.get("peer")) or peer.get("peer") is None:
            return f"a peer entry has no peer index: {_show(peer)}"
        if peer.get("access") not in (True, False, None):
            return f"a peer entry's access must be true, false or null: {_show(peer)}"
        for key in ("gbps", "reverse_gbps"):
            if peer.get(key) is not None and not _gbps(peer[key]):
                return f"a peer entry's {key} is not GB/s: {_show(peer)}"
        if peer.get("error") is not None and text(peer["error"]):
            return f"a peer entry's error is not text: {_show(peer)}"
    return None


CELSIUS = whole(-100, 250)
MHZ = whole(0, 100_000)
WATTS = number(0, 100_000)
PERCENT = whole(0, 100)

# Counters and sizes: ECC counts, retired pages, remapped rows, replays, memory bytes.
COUNT = whole(0, MAX_COUNTER)


def _show(value: Any) -> str:
    shown = repr(value)
    return shown if len(shown) <= 60 else shown[:57] + "..."
