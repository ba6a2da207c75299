"""dcgm-exporter's series (issue 33): its names, types, units and labels, the last Xid's
value, the health status from the one verdict, off by default at no cost."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

from gpuguard.model.identity import GpuId
from gpuguard.model.results import Result, Status
from gpuguard.model.snapshot import Reading, Snapshot
from gpuguard.outputs import metrics_dcgm
from tests.checks.h200x2 import snapshot as h200x2
from tests.conftest import FIXTURES, REPO
from tests.daemon.test_metrics_doc import (
    DOC,
    every_catalog_code_on_8_gpus,
    hgx8,
    samples_of,
    xid_count,
)

# dcgm-exporter's GPU labels, in its order (render_metrics.go at metrics_dcgm's commit),
# then the counters file's one label field
LABELS = ["gpu", "UUID", "pci_bus_id", "device", "modelName", "Hostname",
          "DCGM_FI_DRIVER_VERSION"]
# dcgm-exporter's etc/default-counters.csv at metrics_dcgm's commit, copied whole (its
# README and licence beside it): the types, help texts and line numbers the module cites
# are read from it, so that the module's table cannot drift unseen
COUNTERS = FIXTURES / "dcgm" / "default-counters.csv"
# the fields gpuguard reads, so exports (docs/metrics.md's table); the rest of the file is
# named in the docs as not read
EXPORTED = {
    "DCGM_FI_DEV_SM_CLOCK", "DCGM_FI_DEV_MEM_CLOCK", "DCGM_FI_DEV_MEMORY_TEMP",
    "DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_POWER_USAGE", "DCGM_FI_DEV_PCIE_REPLAY_COUNTER",
    "DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_MEM_COPY_UTIL", "DCGM_FI_DEV_XID_ERRORS",
    "DCGM_FI_DEV_FB_FREE", "DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_RESERVED",
    "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
    "DCGM_FI_DEV_ECC_SBE_AGG_TOTAL", "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL",
    "DCGM_FI_DEV_RETIRED_SBE", "DCGM_FI_DEV_RETIRED_DBE", "DCGM_FI_DEV_RETIRED_PENDING",
    "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL",
    "DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL",
    "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL",
    "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL",
    "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS",
    "DCGM_FI_DEV_ROW_REMAP_FAILURE", "DCGM_EXP_GPU_HEALTH_STATUS",
    # not in the counters file: the DCGM field its clock-events collector watches
    "DCGM_FI_DEV_CLOCKS_EVENT_REASONS",
}


class Line(NamedTuple):
    number: int
    kind: str
    help: str
    commented: bool


def counters_file() -> dict[str, Line]:
    """Each field of the counters file: its line (the uncommented one where a field is on
    two, as DCGM_FI_PROF_PCIE_TX_BYTES), type and help; commented lines included, since
    they are fields dcgm-exporter defines and a fleet turns on."""
    out: dict[str, Line] = {}
    for number, text in enumerate(COUNTERS.read_text().splitlines(), 1):
        match = re.fullmatch(r"(# )?(DCGM_\w+)\s*,\s*(\w+)\s*,\s*(.*?)\s*", text)
        if match and (match[2] not in out or (out[match[2]].commented and not match[1])):
            out[match[2]] = Line(number, match[3], match[4], bool(match[1]))
    return out


CSV = counters_file()


def host() -> Snapshot:
    snap = h200x2()
    snap.host.hostname = "node-a"
    return snap


def parse(text: str) -> tuple[dict[str, str], list[tuple[str, list[tuple[str, str]], str]]]:
    """The TYPE of each family and each sample as (name, labels in order, value)."""
    types = dict(re.findall(r"^# TYPE (\S+) (\S+)$", text, re.MULTILINE))
    samples = []
    for line in text.splitlines():
        if line.startswith("#") or not line:
            continue
        name, rest = line.split("{", 1)
        labels, value = rest.rsplit("} ", 1)
        samples.append((name, re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', labels), value))
    return types, samples


def test_names_types_and_labels_are_dcgm_exporters():
    types, samples = parse(metrics_dcgm.render(host(), [], {}, lambda _: None))
    kinds = {n: CSV[n].kind if n in CSV else "gauge" for n in EXPORTED}  # the mask: gauge
    assert types == {n: t for n, t in kinds.items()
                     if n not in {"DCGM_FI_DEV_RETIRED_SBE", "DCGM_FI_DEV_RETIRED_DBE",
                                  "DCGM_FI_DEV_RETIRED_PENDING",
                                  "DCGM_EXP_GPU_HEALTH_STATUS"}}  # H200: no retired pages
    # counters keep their name: no `_total` a dashboard would not find
    assert {name for name, _, _ in samples} == set(types)
    for name, labels, _ in samples:
        extra = ["err_code", "err_msg"] if name == "DCGM_FI_DEV_XID_ERRORS" else []
        assert [k for k, _ in labels] == LABELS + extra, (name, labels)
    first, gpu = dict(samples[0][1]), host().gpus[0]
    assert first == {"gpu": "0", "UUID": gpu.uuid.get(), "pci_bus_id": gpu.pci_bus_id.get(),
                     "device": "nvidia0", "modelName": "NVIDIA H200", "Hostname": "node-a",
                     "DCGM_FI_DRIVER_VERSION": host().host.driver_version.get()}
    # DCGM's form of the address, as NVML gives it: 8-digit domain
    assert re.fullmatch(r"[0-9A-F]{8}:[0-9A-F]{2}:[0-9A-F]{2}\.[0-9]", first["pci_bus_id"])


def test_units_are_dcgm_exporters():
    """MHz, C, W and % as read; framebuffer in MiB (free = total - used - reserved, NVML's
    v2 memory info); ECC, row remap and NVLink counts as the GPU counts them."""
    snap = host()
    gpu = snap.gpus[0]
    gpu.memory_total_bytes = Reading.ok(143771 * 2**20)
    gpu.memory_used_bytes = Reading.ok(1000 * 2**20 + 5)
    gpu.memory_reserved_bytes = Reading.ok(616 * 2**20)
    gpu.power_draw_w = Reading.ok(81.99)
    gpu.ecc_volatile_uncorrected = Reading.ok(3)
    gpu.remapped_rows_failure = Reading.ok(True)
    _, samples = parse(metrics_dcgm.render(snap, [], {}, lambda _: None))
    of_gpu0 = {name: value for name, labels, value in samples if dict(labels)["gpu"] == "0"}
    assert of_gpu0["DCGM_FI_DEV_FB_USED"] == "1000"
    assert of_gpu0["DCGM_FI_DEV_FB_RESERVED"] == "616"
    assert of_gpu0["DCGM_FI_DEV_FB_FREE"] == str(143771 - 1000 - 616 - 1)  # whole MiB
    assert of_gpu0["DCGM_FI_DEV_POWER_USAGE"] == "81.99"
    assert of_gpu0["DCGM_FI_DEV_GPU_TEMP"] == str(gpu.temperature_c.get())
    assert of_gpu0["DCGM_FI_DEV_SM_CLOCK"] == str(gpu.clock_sm_mhz.get())
    assert of_gpu0["DCGM_FI_DEV_GPU_UTIL"] == str(gpu.utilization_gpu_percent.get())
    assert of_gpu0["DCGM_FI_DEV_ECC_DBE_VOL_TOTAL"] == "3"
    assert of_gpu0["DCGM_FI_DEV_ROW_REMAP_FAILURE"] == "1"
    crc = sum(link["crc_data"] for link in gpu.nvlink_links.get())
    assert of_gpu0["DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL"] == str(crc)


def test_a_field_not_read_has_no_series_as_dcgm_exporter_skips_a_blank():
    snap = host()
    snap.gpus[1].temperature_c = Reading.not_supported()
    snap.gpus[0].temperature_c = Reading.failed("GPU is lost")
    _, samples = parse(metrics_dcgm.render(snap, [], {}, lambda _: None))
    assert not [s for s in samples if s[0] == "DCGM_FI_DEV_GPU_TEMP"]


def test_the_health_status_is_the_verdicts_worst_per_watch():
    snap = host()
    gpu0, gpu1 = snap.gpus[0].identity(), snap.gpus[1].identity()

    def result(rule: str, status: Status, gpu: GpuId) -> Result:
        return Result(rule, status, Status.CRITICAL, "", gpu)

    results = [result("ecc.uncorrected", Status.CRITICAL, gpu1),
               result("ecc.corrected", Status.WARNING, gpu1),
               result("memory.row_remap", Status.OK, gpu1),
               result("pcie.replays", Status.WARNING, gpu0),
               result("thermal.margin", Status.OK, gpu0),
               result("nvlink.state", Status.UNKNOWN, gpu0),  # says nothing: no series
               result("gpu.identity", Status.CRITICAL, gpu0)]  # no DCGM watch of its own
    _, samples = parse(metrics_dcgm.render(snap, results, {}, lambda _: None))
    health = {(dict(labels)["gpu"], dict(labels)["health_watch"]):
              (dict(labels)["health_error_code"], value)
              for name, labels, value in samples if name == "DCGM_EXP_GPU_HEALTH_STATUS"}
    assert health == {("1", "MEM"): ("DCGM_FR_VOLATILE_DBE_DETECTED", "20"),
                      ("0", "PCIE"): ("DCGM_FR_PCIE_REPLAY_THRESHOLD_VIOLATION", "10"),
                      ("0", "THERMAL"): ("DCGM_FR_OK", "0")}


def test_every_field_cites_its_line_of_the_counters_file_with_its_type_and_help():
    fields = (*metrics_dcgm.FIELDS, metrics_dcgm.XID_ERRORS, metrics_dcgm.HEALTH)
    assert {f.name for f in fields} == EXPORTED
    section = DOC.split("## dcgm-exporter compatibility", 1)[1]
    table = {row.split("|")[1].strip(" `"): row for row in section.splitlines()
             if row.startswith("| `DCGM_")}
    for field in fields:
        if field.name not in CSV:  # the clock-events mask: cites the collector's source
            assert field.where.startswith("internal/pkg/collector/"), field
            continue
        line = CSV[field.name]
        assert field.where == f"{metrics_dcgm.CSV}:{line.number}" + (
            " (commented)" if line.commented else ""), (field.name, field.where, line)
        assert (field.kind, field.help) == (line.kind, line.help), field.name
        # the docs' row cites the same line, as the file has it
        row = table[field.name]
        assert f":{line.number}" in row and ("(commented)" in row) == line.commented, row
        assert row.split("|")[2].strip().startswith(line.kind), row
    assert metrics_dcgm.DCGM_EXPORTER_COMMIT in section
    assert metrics_dcgm.DCGM_EXPORTER_COMMIT.startswith("691c927")  # the fixture's commit


def test_the_counters_files_default_fields_gpuguard_does_not_read_are_named_in_the_docs():
    section = DOC.split("## dcgm-exporter compatibility", 1)[1]
    not_read = section.split("Fields of the counters file gpuguard does not read", 1)[1]
    not_read = not_read.split("**Series with compat on.**", 1)[0]
    for name, line in CSV.items():
        if line.kind != "label" and not line.commented and name not in EXPORTED:
            assert f"`{name}`" in not_read and f":{line.number}" in not_read, name
    assert "`DCGM_EXP_P2P_STATUS`" in not_read  # commented upstream, documented


def kmsg(path: Path, lines: list[tuple[int, int]]) -> Path:
    """Xid lines (bus, code), one a second, in /dev/kmsg's form."""
    path.write_text("".join(
        f"4,{100 + n},{1_000_000 * (n + 1)},-;NVRM: Xid (PCI:0000:{bus:02x}:00): {code}, "
        f"pid=1234, name=python3, an error\n" for n, (bus, code) in enumerate(lines)))
    return path


def test_the_xid_field_is_the_last_xids_code_not_a_count(start_daemon, tmp_path):
    """DCGM_FI_DEV_XID_ERRORS: "Value of the last XID error encountered" (the counters
    file), with err_code and err_msg (gpu_collector.go); 0, "No Error" before any."""
    log = kmsg(tmp_path / "kmsg.log", [(0x10, 13), (0x10, 79), (0x11, 31), (0x11, 31),
                                       (0x11, 31)])
    daemon = start_daemon("--input", str(hgx8(tmp_path)), "--fast-interval", "0.3",
                          "--kmsg-file", str(log), "--metrics-compat", "dcgm")
    text = daemon.wait_for(lambda: xid_count(m := daemon.metrics()) == 5 and m,
                           what="the five Xids counted")
    _, samples = parse(text[text.index("# HELP DCGM_"):])
    xids = {dict(labels)["gpu"]: (dict(labels)["err_code"], dict(labels)["err_msg"], value)
            for name, labels, value in samples if name == "DCGM_FI_DEV_XID_ERRORS"}
    assert xids["0"] == ("79", "GPU has fallen off the bus", "79")
    assert xids["1"][0::2] == ("31", "31")  # three of them: still 31, not 3
    assert {xids[str(i)] for i in range(2, 8)} == {("0", "No Error", "0")}


def test_off_by_default_no_series_and_no_import(start_daemon, tmp_path):
    daemon = start_daemon("--input", str(hgx8(tmp_path)), "--fast-interval", "0.3",
                          env={"PYTHONPROFILEIMPORTTIME": "1"})
    daemon.wait_for(lambda: "gpuguard_gpu_temperature_celsius{" in daemon.metrics(),
                    what="telemetry")
    assert "DCGM_" not in daemon.metrics()
    imported = {line.split("|")[-1].strip() for line in daemon.log.read_text().splitlines()
                if line.startswith("import time:")}
    assert "gpuguard.daemon.metrics" in imported  # the import log is the daemon's
    assert "gpuguard.outputs.metrics_dcgm" not in imported


def test_the_profile_key_turns_it_on_and_a_reload_off(start_daemon, tmp_path):
    profile = tmp_path / "profile.yaml"
    profile.write_text("metrics_compat: dcgm\n")
    daemon = start_daemon("--input", str(hgx8(tmp_path)), "--fast-interval", "0.3",
                          "--profile", str(profile))
    daemon.wait_for(lambda: "DCGM_FI_DEV_GPU_TEMP{" in daemon.metrics(), what="compat")
    # read again on SIGHUP, as the rest of the profile: off again without the key
    profile.write_text("gpu_count: 8\n")
    daemon.proc.send_signal(signal.SIGHUP)
    daemon.wait_for(lambda: "DCGM_" not in daemon.metrics(), what="compat off after reload")
    profile.write_text("metrics_compat: dcdm\n")
    run = subprocess.run([sys.executable, "-m", "gpuguard", "check", "--input",
                          str(hgx8(tmp_path)), "--profile", str(profile)],
                         capture_output=True, text=True, cwd=REPO, check=False, timeout=60)
    assert run.returncode == 3 and "metrics_compat" in run.stderr, run.stderr[-1000:]


# What compat adds per GPU, a fixed number (docs/metrics.md): the fields an H200 answers
# (all of FIELDS but the three retired-page ones, which only pre-Ampere GPUs answer), the
# last Xid (one series, whatever the Xids), and one health status per watch HEALTH_WATCH
# maps to. The budget with compat on is the budget without plus this per GPU.
H200_FIELDS = len(metrics_dcgm.FIELDS) - 3
WATCHES = len({watch for watch, _ in metrics_dcgm.HEALTH_WATCH.values()})
PER_GPU = H200_FIELDS + 1 + WATCHES
BUDGET_OFF = 600  # docs/metrics.md, for the budget's 8-GPU host
BUDGET_ON = BUDGET_OFF + 8 * PER_GPU


def test_the_docs_state_the_per_gpu_cost_and_the_budget_with_compat_on():
    assert (H200_FIELDS, WATCHES, PER_GPU, BUDGET_ON) == (23, 8, 32, 856)
    section = DOC.split("**Series with compat on.**", 1)[1].split("\n\n", 1)[0]
    assert "32 series per GPU" in section and "**856**" in section, section


def compat_series(start_daemon, tmp_path: Path, log: Path,
                  ready: Callable[[str], bool]) -> tuple[list[str], list[str]]:
    """Every sample of the budget's 8-GPU host with compat on, and the compat ones."""
    daemon = start_daemon("--input", str(hgx8(tmp_path)), "--fast-interval", "0.3",
                          "--kmsg-file", str(log), "--metrics-compat", "dcgm")
    text = daemon.wait_for(lambda: "DCGM_EXP_GPU_HEALTH_STATUS{" in (m := daemon.metrics())
                           and "gpuguard_gpu_nvlink_links{" in m and ready(m) and m,
                           timeout=30, what="compat")
    samples = samples_of(text)
    return samples, [line for line in samples if line.startswith("DCGM_")]


def test_the_series_budget_with_compat_on(start_daemon, tmp_path):
    """The ordinary case: docs/metrics.md's budget host, healthy (no Xid), at 490 without
    compat; compat adds 32 per GPU: 746. Exact, since the replayed host and its verdict
    are the same on every run (the off test allows a range for the active probe, which is
    off here as there)."""
    empty_log = tmp_path / "dmesg.txt"
    empty_log.write_text("")
    samples, dcgm = compat_series(start_daemon, tmp_path, empty_log, lambda _: True)
    assert len(dcgm) == 8 * PER_GPU, len(dcgm)
    assert len(samples) == 490 + 8 * PER_GPU == 746, len(samples)


def test_every_catalog_code_on_every_gpu_with_compat_on_stays_within_its_budget(
        start_daemon, tmp_path):
    """The worst case of docs/metrics.md's accounting (issue 28's Xid storm: every catalog
    code on every GPU, 594 of the 600 without compat) with compat on: the compat series do
    not grow with the Xids (the last Xid is one series per GPU), so 594 + 256 = 850, within
    the 856 stated for compat on."""
    log = tmp_path / "kmsg.log"
    total = every_catalog_code_on_8_gpus(log)
    samples, dcgm = compat_series(start_daemon, tmp_path, log,
                                  lambda m: xid_count(m) == total)
    assert len(dcgm) == 8 * PER_GPU, len(dcgm)
    assert len(samples) <= BUDGET_ON, len(samples)  # 850 measured
    assert len([line for line in dcgm if line.startswith("DCGM_FI_DEV_XID_ERRORS{")]) == 8


def test_every_rule_the_health_status_maps_is_a_shipped_rule():
    """A renamed rule would silently drop out of its DCGM health watch."""
    from gpuguard.config.ruleset import load_ruleset

    rules = load_ruleset().rules
    assert set(metrics_dcgm.HEALTH_WATCH) <= set(rules), set(metrics_dcgm.HEALTH_WATCH) - set(rules)
