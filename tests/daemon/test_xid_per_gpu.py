"""Issue 21, item 2: Xids on two GPUs and one line naming no GPU, through the daemon and
`check`: a result per GPU, a host result for the line without a bus id, and the Xid
metrics with each GPU's labels."""

from __future__ import annotations

import json
from typing import Any

from tests.conftest import FIXTURES, gpuguard
from tests.daemon.conftest import host_snapshot, write_snapshot

LOG = FIXTURES / "kmsg" / "two-gpus.kmsg"  # Xid 48 on GPU 0, 13 twice on GPU 1, 79 on none


def test_the_daemon_gives_each_gpu_its_xid_result_and_metrics(start_daemon, tmp_path):
    snap = tmp_path / "host.json"
    write_snapshot(snap, host_snapshot(3))  # GPUs at 18:00, 28:00, 38:00
    daemon = start_daemon("--input", str(snap), "--fast-interval", "0.3",
                          "--kmsg-file", str(LOG))
    daemon.wait_for(lambda: daemon.result("xid.recent", 0) is not None, what="xid results")
    gpu0, gpu1, gpu2 = (daemon.result("xid.recent", i) for i in (0, 1, 2))
    host = daemon.result("xid.recent", None)
    assert (gpu0["status"], gpu0["action"]) == ("critical", "reset_gpu")
    assert gpu0["message"].startswith("Xid 48 (double-bit ECC error)")
    assert (gpu1["status"], gpu1["action"]) == ("warning", "restart_app")
    assert gpu1["message"].startswith("Xid 13 x2 (graphics engine exception")
    assert gpu2["status"] == "ok"
    assert (host["status"], host["action"]) == ("critical", "reboot")
    assert host["message"].startswith("no address (not among the GPUs NVML lists): Xid 79")
    text = daemon.metrics()
    uuid1 = "GPU-00000000-0000-0000-0000-000000000001"
    assert ('gpuguard_rule_status{gpu="1",pci_bus_id="00000000:28:00.0",rule="xid.recent",'
            f'severity="critical",uuid="{uuid1}"}} 1.0') in text
    assert 'gpuguard_rule_status{gpu="",pci_bus_id="",rule="xid.recent",severity="critical",' \
           'uuid=""} 2.0' in text
    assert ('gpuguard_xid_events_total{gpu="1",pci_bus_id="00000000:28:00.0",'
            f'severity="warning",uuid="{uuid1}",xid="13"}} 2.0') in text
    assert 'gpuguard_xid_events_total{gpu="",pci_bus_id="",severity="critical",uuid="",' \
           'xid="79"} 1.0' in text
    assert 'gpuguard_suggested_action{action="restart_app",gpu="1"} 1.0' in text


def test_check_gives_the_same_results(tmp_path):
    snap = tmp_path / "host.json"
    write_snapshot(snap, host_snapshot(3))
    proc = gpuguard("check", "--input", str(snap), "--kmsg-file", str(LOG), "--format",
                    "json", "--only", "xid.recent")
    assert proc.returncode == 2, proc.stderr
    found = {"host" if r["gpu"] is None else r["gpu"]["index"]: r["status"]
             for r in json.loads(proc.stdout)["results"]}
    assert found == {0: "critical", 1: "warning", 2: "ok", "host": "critical"}


def test_the_xid_age_is_the_kernel_logs_not_the_wall_clocks(start_daemon, tmp_path,
                                                           wall_clock):
    """A host clock two hours behind Prometheus's made `time() - last_seen_timestamp` say a
    fresh fatal Xid was two hours old: GPUGuardFatalXid never fired. The age is exported
    instead, from the kernel log's clock and the daemon's monotonic clock."""
    import re

    wall_clock.set(-2 * 3600)
    snap = tmp_path / "host.json"
    write_snapshot(snap, host_snapshot(3))
    daemon = start_daemon("--input", str(snap), "--fast-interval", "0.3",
                          "--kmsg-file", str(LOG), env=wall_clock.env)
    daemon.wait_for(lambda: "gpuguard_xid_last_seen_age_seconds{" in daemon.metrics(),
                    what="the Xid ages")
    ages = {m[0]: float(m[1]) for m in re.findall(
        r'gpuguard_xid_last_seen_age_seconds\{[^}]*xid="(\d+)"\} (\S+)', daemon.metrics())}
    # the fixture's lines are seconds apart, the last one "now" by the log's own clock
    assert set(ages) == {"48", "13", "79"} and all(0 <= age < 600 for age in ages.values()), ages


def test_an_unlisted_gpus_xid_is_labelled_as_nvml_spells_its_address(start_daemon, tmp_path):
    """The kernel log writes 0000:9b:00; NVML (and the GPU's own series while it was
    listed) 00000000:9B:00.0: one spelling, so the two series are one GPU's."""
    log = tmp_path / "kmsg.log"
    log.write_text("4,100,1000000,-;NVRM: Xid (PCI:0000:9b:00): 79, pid='<unknown>', "
                   "name=<unknown>, GPU has fallen off the bus.\n")
    snap = tmp_path / "host.json"
    write_snapshot(snap, host_snapshot(1))
    daemon = start_daemon("--input", str(snap), "--fast-interval", "0.3",
                          "--kmsg-file", str(log))
    text = daemon.wait_for(lambda: (m := daemon.metrics()) and "gpuguard_xid_events_total{" in m
                           and m, what="the Xid metric")
    assert ('gpuguard_xid_events_total{gpu="",pci_bus_id="00000000:9B:00.0",'
            'severity="critical",uuid="",xid="79"} 1.0') in text, text


def xid_log(path, lines: list[tuple[str, int, str]]) -> None:
    """A kernel log of Xid lines (the kernel's address spelling, the code, the line's
    text), numbered and a millisecond apart."""
    path.write_text("".join(
        f"4,{100 + n},{1_000_000 + n * 1000},-;NVRM: Xid (PCI:{pci}): {code}, pid=1234, "
        f"name=python3, {text}\n" for n, (pci, code, text) in enumerate(lines)))


def xid_series(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("gpuguard_xid_")]


def test_thousands_of_codes_on_one_gpu_fold_into_other_and_stay_in_the_store(
        start_daemon, tmp_path):
    """Issue 28, item 3: 3,000 codes the catalog does not hold, on one GPU, made 6,000
    gpuguard_xid_* series (the 8-GPU host's whole budget is 600). Per GPU at most
    XID_CODES_PER_GPU codes have series of their own; the rest count under xid="other";
    every line is still an event in the store, with its code."""
    codes = range(1000, 4000)
    log = tmp_path / "kmsg.log"
    xid_log(log, [("0000:18:00", code, "made-up fault") for code in codes])
    snap = tmp_path / "host.json"
    write_snapshot(snap, host_snapshot(1))
    daemon = start_daemon("--input", str(snap), "--fast-interval", "0.3",
                          "--kmsg-file", str(log))
    text = daemon.wait_for(lambda: xid_count(m := daemon.metrics()) == 3000 and m,
                           timeout=30, what="the 3,000 Xids counted")
    series = xid_series(text)
    assert len(series) == 2 * (3 + 1), series  # 3 codes and one "other", each 2 families
    gpu0 = 'gpu="0",pci_bus_id="00000000:18:00.0",severity="warning",' \
        'uuid="GPU-00000000-0000-0000-0000-000000000000"'
    counts = {line.split('xid="')[1].split('"')[0]: float(line.rsplit(" ", 1)[1])
              for line in series if line.startswith("gpuguard_xid_events_total{")}
    assert counts == {"1000": 1, "1001": 1, "1002": 1, "other": 2997}, counts
    assert f'gpuguard_xid_events_total{{{gpu0},xid="other"}} 2997.0' in text
    # the codes the metric folded are in the event store, each line once
    stored = daemon.wait_for(lambda: len(got := store_xids(tmp_path / "state")) >= 3000
                             and got, timeout=30, what="the store's Xid events")
    assert sorted(e["code"] for e in stored) == list(codes)


def xid_count(text: str) -> float:
    return sum(float(line.rsplit(" ", 1)[1]) for line in xid_series(text)
               if line.startswith("gpuguard_xid_events_total{"))


def store_xids(state) -> list[dict[str, Any]]:
    out = gpuguard("events", "--state-dir", str(state), "--kind", "xid", "--format", "json",
                   "--limit", "100000")
    assert out.returncode == 0, out.stderr
    return list(json.loads(out.stdout)["events"])


def test_xids_at_thousands_of_unlisted_addresses_share_one_bound(start_daemon, tmp_path):
    """An Xid at an address NVML does not list keeps the line's address (a GPU that fell
    off the bus alerts apart), so a garbled or hostile log naming 2,000 addresses made
    4,000 series. The unlisted addresses share one bound: their first codes keep their
    address, the rest count under xid="other" with no address."""
    log = tmp_path / "kmsg.log"
    xid_log(log, [(f"0000:{bus >> 8:02x}:{bus & 0xff:02x}", 79, "GPU has fallen off the bus.")
                  for bus in range(0x100, 0x100 + 2000)])
    snap = tmp_path / "host.json"
    write_snapshot(snap, host_snapshot(1))  # GPU 0 at 18:00, not among them
    daemon = start_daemon("--input", str(snap), "--fast-interval", "0.3",
                          "--kmsg-file", str(log))
    text = daemon.wait_for(lambda: xid_count(m := daemon.metrics()) == 2000 and m,
                           timeout=30, what="the 2,000 Xids counted")
    series = xid_series(text)
    assert len(series) == 2 * (3 + 1), series
    assert 'gpuguard_xid_events_total{gpu="",pci_bus_id="",severity="critical",uuid="",' \
        'xid="other"} 1997.0' in text
