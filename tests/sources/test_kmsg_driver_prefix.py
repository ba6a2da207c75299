"""Only the driver's own records are the driver's lines (issue 28, item 1): every line shape
gpuguard reads, quoted inside another subsystem's record, in every format it reads, changes
no verdict (hypothesis); the same line as the driver's own record counts in every format;
a record userspace wrote (a facility that is not the kernel's) never counts as the
driver's."""

from __future__ import annotations

import copy
import time
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from gpuguard.judge.engine import evaluate
from gpuguard.model.profile import Profile
from gpuguard.model.snapshot import Reading, Snapshot
from gpuguard.sources import kmsg
from tests.conftest import with_gpus
from tests.sources.kmsg_verdicts import ranked

UUID0 = "GPU-00000000-0000-0000-0000-000000000000"
LOAD = ("NVRM: loading NVIDIA UNIX Open Kernel Module for x86_64  580.159.04  Release Build  "
        "(nixbld@)")
# Every line shape gpuguard reads from the driver (and the reset job), at GPU 0 (18:00).
DRIVER = {
    "xid48": "NVRM: Xid (PCI:0000:18:00): 48, pid='<unknown>', name=<unknown>, An "
             "uncorrectable double bit error (DBE) has been detected on GPU in the framebuffer "
             "at partition 6, subpartition 0.",
    "xid79": "NVRM: Xid (PCI:0000:18:00): 79, pid=1234, name=python3, GPU has fallen off the "
             "bus.",
    "xid149": "NVRM: Xid (PCI:0000:18:00): 149, NETIR Fatal XC0 i0 Link -1 (0x000fe406 "
              "0x00000000 0x00000000 0x00000000 0x00000000 0x00000000)",
    "fallen": "NVRM: GPU 0000:18:00.0: GPU has fallen off the bus.",
    "fallen-at": "NVRM: GPU at PCI:0000:18:00: GPU has fallen off the bus.",
    "fallen-bare": "NVRM: GPU has fallen off the bus.",
    "load-open": LOAD,
    "load-proprietary": "NVRM: loading NVIDIA UNIX x86_64 Kernel Module  470.57.02  Tue Jul 13 "
                        "16:14:05 UTC 2021",
    "gsp-rpc": "NVRM: Rate limiting GSP RPC error prints for GPU at PCI:0000:18:00 (printing 1 "
               "of every 30).  The GPU likely needs to be reset.",
    "gsp-crash": "NVRM: GPU0 kgspHealthCheck_TU102: ****************************** "
                 "GSP-CrashCat Report *******************************",
    "gsp-wpr2": "NVRM: GPU0 _kgspBootGspRm: unexpected WPR2 already up, cannot proceed with "
                "booting GSP",
    "gsp-init": "NVRM: GPU0 RmInitAdapter: Cannot initialize GSP firmware RM",
    "mismatch-client": "NVRM: API mismatch: the client has the version 580.95.05, but",
    "mismatch-module": "NVRM: this kernel module has the version 570.133.20.  Please",
    "mismatch-named": "NVRM: API mismatch: the client 'nvidia-powerd' (pid 849)",
    "probe-gpu": "NVRM: The NVIDIA GPU 0000:18:00.0",
    "probe-fallen": "NVRM: fallen off the bus and is not responding to commands.",
    "mismatch-later": "NVRM: has the version 570.133.07, but this kernel module has",
    "mismatch-later-module": "NVRM: the version 575.51.02.  Please make sure that this",
    "sxid-data": "nvidia-nvswitch0: SXid (PCI:0000:05:00.0): 20034, Data {0x00000000, "
                 "0x00000000}",
    "sxid-fatal": "nvidia-nvswitch0: SXid (PCI:0000:05:00.0): 20034, Fatal, Link 14 LTSSM "
                  "Fault Up",
    "reset": f"GPU reset occurred: {UUID0}",
    "reset-tagged": "nvsentinel[42]: GPU reset occurred: 0000:18:00.0",
}
# lines of a record of several lines, read only together (test_multi_line_driver_records)
PARTS = {"mismatch-named", "probe-gpu", "probe-fallen", "mismatch-later",
         "mismatch-later-module"}
MULTI = {
    # NVIDIA/NVSentinel#155 (570.158.01): the probe finds the GPU gone, no Xid
    "probe": (["probe-gpu"], "NVRM: (PCI ID: 10de:2335) installed in this system has",
              ["probe-fallen"]),
    # NVIDIA/open-gpu-kernel-modules#829 (575.51.02): the client named
    "mismatch-575": (["mismatch-named", "mismatch-later", "mismatch-later-module"], None, []),
}
# Other subsystems' records that quote a line ({q}), the kernel's own (facility 0) unless
# `user`; a comm-led one starts with the quote's first 15 characters (a process's name).
Quote = tuple[str, Callable[[str], str], bool]
OTHERS: list[Quote] = [
    ("input", lambda q: f"input: {q} as /devices/virtual/input/input7", False),
    ("usb-product", lambda q: f"usb 1-1: Product: {q}", False),
    ("usb-maker", lambda q: f"usb 3-2.4: Manufacturer: {q}", False),
    ("hid", lambda q: f"hid-generic 0003:046D:C52B.0003: input,hidraw0: USB HID v1.11 "
                      f"Keyboard [{q}] on usb-0000:00:14.0-1/input0", False),
    ("audit", lambda q: f'audit: type=1400 audit(1700000000.123:42): apparmor="DENIED" '
                        f'operation="open" profile="{q}" name="/dev/nvidia0" comm="python3"',
     False),
    ("segfault-file", lambda q: f"python3[4242]: segfault at 0 ip 00007f0000001000 sp "
                                f"00007ffd00000000 error 4 in {q}[7f0000000000+1000]", False),
    ("segfault-comm", lambda q: f"{q[:15]}[4242]: segfault at 0 ip 00007f0000001000 sp "
                                f"00007ffd00000000 error 4 in {q}[7f0000000000+1000]", False),
    ("systemd", lambda q: f"systemd[1]: {q}", True),
    ("container", lambda q: f'containerd[812]: time="2026-12-01T10:00:00Z" level=info '
                            f'msg="{q}"', True),
    ("echoed", lambda q: q, True),  # a container's log line echoed into /dev/kmsg as is
]


Rec = tuple[list[str], int, int]  # its lines, its facility, its time (s since boot)


def render(fmt: str, records: list[Rec]) -> list[str]:
    """The records as `fmt` prints them."""
    out: list[str] = []
    for i, (lines, facility, sec) in enumerate(records):
        level = 4
        first, rest = lines[0], lines[1:]
        if fmt == "kmsg":
            out.append(f"{facility * 8 + level},{i},{sec * 1_000_000},-;"
                       + "\\x0a".join(lines))
            continue
        head = {"dmesg": f"[{sec:5d}.000000] ",
                "dmesg-r": f"<{facility * 8 + level}>[{sec:5d}.000000] ",
                "dmesg-t": "",
                "dmesg-T": time.strftime("[%a %b %e %H:%M:%S 2026] ", time.gmtime(sec)),
                "dmesg-x": f"{'kern' if facility == 0 else 'user':<6}:warn  : "
                           f"[{sec:5d}.000000] ",
                "journal": "Dec 01 10:00:00 node7 kernel: ",
                "journal-full": "Tue 2026-12-01 10:00:00.123456 UTC node7 kernel: ",
                "journal-monotonic": f"[{sec:5d}.000000] node7 kernel: ",
                "kern-log": f"Dec  1 10:00:00 node7 kernel: [{sec:5d}.000000] "}[fmt]
        out.append(head + first)
        out.extend(" " * len(head) + line if head else line for line in rest)
    return out


FORMATS = ["kmsg", "dmesg", "dmesg-r", "dmesg-t", "dmesg-T", "dmesg-x", "journal",
           "journal-full", "journal-monotonic", "kern-log"]
# where a record's boundary and its writer show: dmesg -t has neither
CARRIES_FACILITY = {"kmsg", "dmesg-r", "dmesg-x"}
# journalctl -k shows the kernel's records only (a userspace one is not "kernel:")
SHOWS_USER_RECORDS = {f for f in FORMATS if not f.startswith(("journal", "kern-log"))}


def summary(lines: list[str]) -> dict[str, Any]:
    # read at a fixed time, as a live read is: a record put in at the end moves no age
    return kmsg.summarise(kmsg.parse_lines(lines), "fuzz", 10_000 * 1_000_000)


def verdict(snapshot: Snapshot, rules: Any, log: dict[str, Any]) -> list[tuple[Any, ...]]:
    snap = copy.deepcopy(snapshot)
    snap.host.kernel_log = Reading.ok(log)
    snap.host.__post_init__()
    results = evaluate(snap, rules, Profile(), only=[
        "xid.recent", "sxid.recent", "gsp.firmware", "driver.loaded", "driver.module_match"])
    return sorted((r.rule, r.gpu.index if r.gpu else -1, r.status.value, r.message, r.action)
                  for r in results)


KEPT = ("xids", "sxids", "gsp", "driver_loads", "repairs", "api_mismatch", "ooms",
        "unsigned_module_rejected")


def kept(log: dict[str, Any]) -> dict[str, Any]:
    """What the kernel-log rules read of a summary, without times and places (a record put
    in moves the ones after it)."""
    out = ranked({"summary": {k: copy.deepcopy(log[k]) for k in KEPT}})["summary"]
    return {k: [{f: v for f, v in e.items() if f not in ("seq", "usec")} for e in out[k]]
            if isinstance(out[k], list) else out[k] for k in KEPT}


@pytest.fixture(scope="module")
def one_gpu(h200_base: Snapshot) -> Snapshot:
    return with_gpus(copy.deepcopy(h200_base), ["00000000:18:00.0"])


# A host's log before the quotes: the boot's load, a fatal Xid 48 on GPU 0, an ethernet line.
BASE: list[Rec] = [([LOAD], 0, 1000), ([DRIVER["xid48"]], 0, 2000), (["eth0: link up"], 0, 3000)]


def quoted_case(fmt: str, name: str, other: Quote, where: int,
                continuation: bool) -> list[Rec] | None:
    """BASE with another subsystem's record quoting the driver's line `name` put in at
    `where` (the quote on its first line, or on a continuation line of it); None where the
    case says nothing: what the format cannot show, or a case that is the writer's own."""
    label, shape, user = other
    if user and fmt not in SHOWS_USER_RECORDS:
        return None
    if label == "echoed" and fmt not in CARRIES_FACILITY:
        return None  # the driver's line as a whole record: nothing but the facility tells
    if name.startswith("reset") and label in ("systemd", "echoed"):
        return None  # the whole record of a userspace writer, at most behind its tag: a reset
    if continuation and fmt == "dmesg-t":
        return None  # no boundary: a continuation line is a line of its own there
    lines = [shape(DRIVER[name])]
    if continuation:
        lines = ["lirc_dev: IR Remote Control driver registered", shape(DRIVER[name])]
    return [*BASE[:where], (lines, 1 if user else 0, 1000 * where + 500), *BASE[where:]]


def same_verdict(snapshot: Snapshot, rules: Any, fmt: str, quoted: list[Rec],
                 why: tuple[Any, ...]) -> None:
    before, after = summary(render(fmt, BASE)), summary(render(fmt, quoted))
    assert kept(after) == kept(before), why
    assert verdict(snapshot, rules, after) == verdict(snapshot, rules, before), why


@pytest.mark.parametrize("fmt", FORMATS)
def test_every_quoted_driver_line_in_every_shape_changes_no_verdict(one_gpu, default_rules,
                                                                   fmt):
    """Every driver line x every other subsystem's shape x first or continuation line, in
    this format: the summary and the verdict of a fatal Xid 48's host as without it (each
    case at one place in the log, turning through them; the hypothesis test below tries
    the places at random)."""
    cases = 0
    for i, (name, other, continuation) in enumerate(
            (n, o, c) for n in sorted(DRIVER) for o in OTHERS for c in (False, True)):
        quoted = quoted_case(fmt, name, other, i % (len(BASE) + 1), continuation)
        if quoted is not None:
            same_verdict(one_gpu, default_rules, fmt, quoted, (name, other[0], continuation))
            cases += 1
    assert cases >= 200, cases


@settings(max_examples=300, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(fmt=st.sampled_from(FORMATS), name=st.sampled_from(sorted(DRIVER)),
       other=st.sampled_from(OTHERS), where=st.integers(0, len(BASE)),
       continuation=st.booleans())
def test_a_quoted_driver_line_changes_no_verdict(one_gpu, default_rules, fmt, name, other,
                                                 where, continuation):
    """A fatal Xid 48's host; another subsystem's record quoting a driver line anywhere in
    the log: the same verdict as without it."""
    quoted = quoted_case(fmt, name, other, where, continuation)
    assume(quoted is not None)
    assert quoted is not None
    same_verdict(one_gpu, default_rules, fmt, quoted, (fmt, name, other[0], where))


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("name", sorted(set(DRIVER) - PARTS))
def test_the_drivers_own_line_counts_in_every_format(fmt, name):
    """The other side: each line as its writer's own record is read, in every format."""
    facility = 1 if name.startswith("reset") else 0
    if facility and fmt not in SHOWS_USER_RECORDS:
        return
    log = summary(render(fmt, [([LOAD], 0, 1), ([DRIVER[name]], facility, 2)]))
    found = {k: v for k, v in kept(log).items() if v}
    assert found.keys() - {"driver_loads"} or name.startswith("load"), (fmt, name, found)
    if name.startswith("load"):
        assert len(log["driver_loads"]) == 2 and log["repairs"][0]["kind"] == "driver_reload"


@pytest.mark.parametrize("fmt", sorted(CARRIES_FACILITY))
@pytest.mark.parametrize("name", sorted(n for n in DRIVER if not n.startswith("reset")))
def test_a_record_userspace_wrote_is_never_the_drivers(fmt, name):
    """`echo 'NVRM: Xid ...' > /dev/kmsg` is a facility-1 record: not the driver's, not
    anyone's the kernel-log rules read."""
    log = summary(render(fmt, [([LOAD], 0, 1), ([DRIVER[name]], 1, 2)]))
    assert kept(log) == kept(summary(render(fmt, [([LOAD], 0, 1)])))


@pytest.mark.parametrize("fmt", FORMATS)
def test_multi_line_driver_records(fmt):
    """The driver's records of several lines: the probe's "fallen off the bus" (Xid 79 for
    the GPU its first line names) and the 575+ API mismatch, in every format (in dmesg -t
    their lines stand alone, still in order)."""
    first, middle, last = MULTI["probe"]
    lines = [DRIVER[first[0]], middle, DRIVER[last[0]]]
    log = summary(render(fmt, [([LOAD], 0, 1), (lines, 0, 2)]))
    assert [(x["xid"], x["pci"]) for x in log["xids"]] == [(79, "0000:18:00.0")], fmt
    names, _, _ = MULTI["mismatch-575"]
    log = summary(render(fmt, [([DRIVER[n] for n in names], 0, 1)]))
    assert log["api_mismatch"] == {"client": "570.133.07", "kernel": "575.51.02"}, fmt


def test_continuation_lines_are_their_records(tmp_path):
    """A driver record's further lines are the driver's (the API mismatch, in dmesg's indented
    lines and in /dev/kmsg's escaped newlines alike); another's record's are not."""
    mismatch = [DRIVER["mismatch-client"], DRIVER["mismatch-module"]]
    for fmt in FORMATS:
        log = summary(render(fmt, [(mismatch, 0, 1)]))
        assert log["api_mismatch"] == {"client": "580.95.05", "kernel": "570.133.20"}, fmt
    from gpuguard.sources.kmsg_records import writer

    records = list(kmsg.parse_lines(render("kmsg", [(["usb 1-1: x", DRIVER["xid79"]], 0, 1)])))
    assert [(r.text[:9], r.head, writer(r)) for r in records] == [
        ("usb 1-1: ", None, "kernel"), ("NVRM: Xid", "usb 1-1: x", "kernel")]
    assert summary(render("dmesg", [(["usb 1-1: x", DRIVER["xid79"]], 0, 1)]))["xids"] == []
