"""docs/metrics.md and what gpuguard exports name the same metrics, and they parse."""

import re
import shutil
import subprocess

from tests.conftest import FIXTURES, REPO, gpuguard
from tests.daemon.conftest import host_snapshot, write_snapshot

DOC = (REPO / "docs" / "metrics.md").read_text()


def documented(section: str) -> set[str]:
    part = DOC.split(section, 1)[1].split("\n## ", 1)[0]
    return set(re.findall(r"^\| `(gpuguard_[a-z_]+)`", part, re.MULTILINE))


def exported(text: str) -> set[str]:
    """Names of the samples (what PromQL sees), without the client's _created series."""
    names = {re.split(r"[{ ]", line, maxsplit=1)[0] for line in text.splitlines()
             if line and not line.startswith("#")}
    return {n for n in names if not n.endswith("_created")}


LINK = {"up": True, "version": 6, "remote_pci": "FFFFFFFF:FF:FF.0", "replay": 0,
        "recovery": 0, "crc_flit": 0, "crc_data": 23}
# A multi-GPU host's readings (issue 11), so that its per-GPU metrics are exported too.
NVLINK_HOST = {(i, name): value for i in (0, 1) for name, value in (
    ("nvlink_links", [{"link": n, **LINK} for n in range(2)]), ("fabric_state", "completed"),
    ("memory_temperature_c", 35))}


def test_daemon_exports_what_the_doc_lists(start_daemon, tmp_path):
    snap = tmp_path / "host.json"
    host = host_snapshot(2, {(0, "pci_bus_id"): "00000000:3B:00.0",
                             (1, "pci_bus_id"): "00000000:86:00.0", **NVLINK_HOST})
    write_snapshot(snap, host)
    daemon = start_daemon("--input", str(snap), "--fast-interval", "0.3",
                          "--kmsg-file", str(FIXTURES / "kmsg" / "dmesg.log"),
                          "--path.sysfs", str(FIXTURES / "sysfs-aer"))
    daemon.wait_for(lambda: "gpuguard_xid_events_total{" in daemon.metrics(), what="xids")
    text = daemon.metrics()
    # the failover metrics appear only with services (tests/supervisor checks them)
    daemon_metrics = {n for n in documented("## The daemon")
                      if not n.startswith("gpuguard_failover_")}
    assert exported(text) == daemon_metrics
    lint = subprocess.run([shutil.which("promtool") or "promtool", "check", "metrics"],
                          input=text, capture_output=True, text=True, check=False)
    assert lint.returncode == 0, lint.stdout + lint.stderr
    assert 'gpuguard_xid_events_total{gpu="",pci_bus_id="",severity="critical",xid="119"}' \
        in text
    # per GPU, summed over its links: 2 links x 23
    assert 'gpuguard_gpu_nvlink_errors_total{gpu="1",pci_bus_id="00000000:86:00.0",' \
        'type="crc_data",uuid="GPU-00000000-0000-0000-0000-000000000001"} 46.0' in text


def test_check_exports_what_the_doc_lists(tmp_path):
    snap = tmp_path / "host.json"
    write_snapshot(snap, host_snapshot(2, {(0, "pci_bus_id"): "00000000:3B:00.0",
                                           (1, "pci_bus_id"): "00000000:86:00.0",
                                           **NVLINK_HOST}))
    text = gpuguard("check", "--input", str(snap), "--format", "prometheus",
                    "--path.sysfs", str(FIXTURES / "sysfs-aer")).stdout
    assert exported(text) == documented("## `gpuguard check --format prometheus`")
