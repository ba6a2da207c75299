"""docs/metrics.md and what gpuguard exports name the same metrics, and they parse."""

import re
import shutil
import subprocess
from pathlib import Path

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
    # host resources (issue 14): a /proc with meminfo, a root with a Docker data root
    rootfs = tmp_path / "rootfs"
    (rootfs / "var" / "lib" / "docker").mkdir(parents=True)
    daemon = start_daemon("--input", str(snap), "--fast-interval", "0.3",
                          "--kmsg-file", str(FIXTURES / "kmsg" / "dmesg.log"),
                          "--path.sysfs", str(FIXTURES / "sysfs-aer"),
                          "--path.procfs", str(FIXTURES / "procfs-meminfo"),
                          "--path.rootfs", str(rootfs), "--status-page", env={"DOCKER_HOST": ""})
    daemon.wait_for(lambda: "gpuguard_xid_events_total{" in daemon.metrics() and
                    "gpuguard_disk_free_bytes{" in daemon.metrics(), what="xids and disks")
    text = daemon.metrics()
    # the failover and service metrics appear only with services (tests/supervisor and
    # tests/daemon/test_services.py check them)
    daemon_metrics = {n for n in documented("## The daemon")
                      if not n.startswith(("gpuguard_failover_", "gpuguard_service_"))}
    assert exported(text) == daemon_metrics
    lint = subprocess.run([shutil.which("promtool") or "promtool", "check", "metrics"],
                          input=text, capture_output=True, text=True, check=False)
    assert lint.returncode == 0, lint.stdout + lint.stderr
    # an Xid at an address NVML does not list keeps the line's address (issue 21)
    assert 'gpuguard_xid_events_total{gpu="",pci_bus_id="00000000:00:06.0",severity="critical",' \
        'uuid="",xid="119"}' \
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


def hgx8(tmp_path: Path) -> Path:
    """The 8-GPU NVLink host of the series budget, replayed: the H200 pair recorded live,
    copied to 8 GPUs at buses 10 to 17."""
    import copy

    from gpuguard.model.snapshot import Reading
    from tests.checks.h200x2 import snapshot

    snap = snapshot()
    gpus = []
    for i in range(8):
        gpu = copy.deepcopy(snap.gpus[i % 2])
        gpu.index = i
        gpu.uuid = Reading.ok(f"GPU-00000000-0000-0000-0000-{i:012d}")
        gpu.pci_bus_id = Reading.ok(f"00000000:{0x10 + i:02X}:00.0")
        gpu.p2p_status = Reading.ok([{"peer": j, "read": "ok", "write": "ok", "nvlink": "ok",
                                      "atomics": "ok"} for j in range(8) if j != i])
        gpu.__post_init__()
        gpus.append(gpu)
    snap.gpus = gpus
    snap.host.gpu_count = Reading.ok(8)
    snap.host.__post_init__()
    path = tmp_path / "hgx8.json"
    write_snapshot(path, snap.to_json())
    return path


def samples_of(text: str) -> list[str]:
    return [line for line in text.splitlines()
            if line and not line.startswith("#") and "_created" not in line]


def test_an_8_gpu_nvlink_host_stays_within_the_series_budget(start_daemon, tmp_path):
    """The series budget (docs/metrics.md): per GPU, not per link; skipped rules have no
    series. Issue 11 set 450; issues 12-14 raised it to 500; issue 21 (per-GPU Xid and GSP
    results, InfoROM, repeated app Xids) to 600: 490 here, about 530 with the daemon's
    active probe on (the accounting is in docs/metrics.md)."""
    empty_log = tmp_path / "dmesg.txt"  # a healthy host: no Xid series
    empty_log.write_text("")
    daemon = start_daemon("--input", str(hgx8(tmp_path)), "--fast-interval", "0.3",
                          "--kmsg-file", str(empty_log))
    daemon.wait_for(lambda: "gpuguard_gpu_nvlink_links{" in daemon.metrics(), what="NVLink")
    samples = samples_of(daemon.metrics())
    assert 450 < len(samples) < 500, len(samples)  # 490 measured: room for the probe's 40
    rules = {line.split('rule="')[1].split('"')[0] for line in samples
             if line.startswith("gpuguard_rule_status{")}
    per_gpu = [line for line in samples if line.startswith('gpuguard_rule_status{') and
               'rule="xid.recent"' in line]
    assert len(per_gpu) == 8 and {"gsp.firmware", "gpu.inforom", "xid.app_repeated"} <= rules


# K of docs/metrics.md (gpuguard.daemon.xid_counter.XID_CODES_PER_GPU: the test below
# holds the two equal)
XID_CODES_PER_GPU = 3


def test_the_doc_states_the_xid_series_bound_the_daemon_keeps():
    from gpuguard.daemon.xid_counter import XID_CODES_PER_GPU as kept

    assert kept == XID_CODES_PER_GPU
    assert f"**K = {kept}**" in DOC


# The line each catalog code is logged with: the plain one, and for the codes graded by
# their own line (NVLink5's Fatal / Nonfatal, Xid 154's recovery action) every grade, so
# that each GPU has every (code, severity) pair the catalog can give.
GRADED_BY_LINE = {**{code: ("Fatal XC0 i0 Link 00", "Nonfatal XC0 i0 Link 00")
                     for code in range(144, 151)},
                  154: ("GPU recovery action changed from 0x0 (None) to 0x1 (GPU Reset "
                        "Required)", "GPU recovery action changed from 0x1 (GPU Reset "
                        "Required) to 0x0 (None)", "GPU recovery action changed from 0x0 "
                        "(None) to 0x4 (Drain P2P)")}


def every_catalog_code_on_8_gpus(path: Path) -> int:
    from gpuguard.config.ruleset import load_ruleset

    catalog = load_ruleset().xid_catalog
    lines = []
    for gpu in range(8):
        for code in sorted(catalog):
            for text in ("an error", *GRADED_BY_LINE.get(code, ())):
                lines.append(f"NVRM: Xid (PCI:0000:{0x10 + gpu:02x}:00): {code}, pid=1234, "
                             f"name=python3, {text}")
    path.write_text("".join(f"4,{100 + n},{1_000_000 + n * 1000},-;{line}\n"
                            for n, line in enumerate(lines)))
    return len(lines)


def test_every_catalog_code_on_every_gpu_stays_within_the_series_budget(start_daemon,
                                                                       tmp_path):
    """Issue 28, item 3: each (Xid, severity, GPU) had two series of its own: the catalog's
    172 codes on the 8 GPUs of the budget's host made about 2,900 Xid series. At most
    XID_CODES_PER_GPU codes per GPU have their own; the rest count under xid="other", one
    per severity (the fatal-Xid alert selects on it): within the 600 of docs/metrics.md
    (594 measured), and promtool still reads it."""
    log = tmp_path / "kmsg.log"
    total = every_catalog_code_on_8_gpus(log)
    daemon = start_daemon("--input", str(hgx8(tmp_path)), "--fast-interval", "0.3",
                          "--kmsg-file", str(log))
    text = daemon.wait_for(lambda: xid_count(m := daemon.metrics()) == total and m,
                           timeout=30, what="every Xid counted")
    samples = samples_of(text)
    xids = [line for line in samples if line.startswith("gpuguard_xid_")]
    # per GPU: its first codes, and "other" for critical, warning and ignore; two families
    assert len(xids) <= 8 * 2 * (XID_CODES_PER_GPU + 3), len(xids)  # 96
    assert len(samples) <= 600, len(samples)  # 594 measured
    # the fatal-Xid alert still sees every GPU's critical Xids (its own or folded)
    critical_gpus = {line.split('gpu="')[1].split('"')[0] for line in xids
                     if 'severity="critical"' in line}
    assert critical_gpus == {str(i) for i in range(8)}
    others = [line for line in xids if line.startswith("gpuguard_xid_events_total{") and
              'xid="other"' in line]
    assert len(others) == 8 * 3, others
    lint = subprocess.run([shutil.which("promtool") or "promtool", "check", "metrics"],
                          input=text, capture_output=True, text=True, check=False)
    assert lint.returncode == 0, lint.stdout + lint.stderr


def xid_count(text: str) -> float:
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("gpuguard_xid_events_total{"))
