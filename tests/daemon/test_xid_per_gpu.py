"""Issue 21, item 2: Xids on two GPUs and one line naming no GPU, through the daemon and
`check`: a result per GPU, a host result for the line without a bus id, and the Xid
metrics with each GPU's labels."""

from __future__ import annotations

import json

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
