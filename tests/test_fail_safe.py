"""Fail safe (issue 9), `gpuguard check` side: when gpuguard cannot tell it says unknown,
a fact it can tell (a lost GPU, a missing GPU) is never hidden by a slow or broken source,
and no input (a FIFO with no writer, /dev/zero, a hostile replay) hangs or crashes it."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from gpuguard.config.ruleset import load_ruleset
from gpuguard.model.identity import GpuId
from gpuguard.model.results import Result, Status
from gpuguard.supervisor import policy
from tests.conftest import FIXTURES, gpuguard

LIVE = FIXTURES / "h200-live" / "idle-snapshot.json"


def results_of(proc) -> dict[tuple[str, int | None], dict]:
    doc = json.loads(proc.stdout)
    return {(r["rule"], (r["gpu"] or {}).get("index")): r for r in doc["results"]}


def fifo(tmp_path: Path, name: str = "fifo") -> Path:
    path = tmp_path / name
    os.mkfifo(path)
    return path


def test_a_slow_host_source_leaves_nvml_facts_alone(tmp_path, fake_env, host_args):
    """--kmsg-file on a FIFO nobody writes: the kernel log is unknown, and only it; the
    profile's gpu_count of 2 against NVML's one GPU is still critical."""
    profile = tmp_path / "profile.yaml"
    profile.write_text("gpu_count: 2\n")
    started = time.monotonic()
    proc = gpuguard("check", *host_args, "--format", "json", "--fail-on", "critical",
                    "--timeout", "2",
                    "--profile", str(profile), "--kmsg-file", str(fifo(tmp_path)),
                    env=fake_env(gpus=1), timeout=30)
    took = time.monotonic() - started
    assert proc.returncode == 2, proc.stdout + proc.stderr
    results = results_of(proc)
    assert results[("gpu.count", None)]["status"] == "critical"
    assert results[("driver.loaded", None)]["status"] == "ok"
    xid = results[("xid.recent", None)]
    assert xid["status"] == "unknown" and "no end of data" in xid["message"], xid
    assert results[("driver.module_match", None)]["status"] != "unknown"  # procfs answered
    assert took < 10, took  # bounded by --timeout, not by the FIFO


def test_a_lost_gpu_is_critical_and_counted_by_the_supervisor(tmp_path, fake_env, host_args):
    profile = tmp_path / "profile.yaml"
    profile.write_text("gpu_count: 2\n")
    proc = gpuguard("check", *host_args, "--format", "json", "--profile", str(profile),
                    env=fake_env(gpus=2, lost_gpu=1))
    assert proc.returncode == 2, proc.stdout + proc.stderr
    results = results_of(proc)
    assert results[("gpu.lost", 1)]["status"] == "critical"
    assert results[("gpu.lost", 0)]["status"] == "ok"
    assert results[("thermal.margin", 1)]["status"] == "unknown"  # the rest of it: unknown

    # The supervisor's policy sees the same results and fails the cycle.
    tagged = {r.id for r in load_ruleset().rules.values() if "failover" in r.tags}
    as_results = [Result(r["rule"], Status(r["status"]), Status(r["severity"]), r["message"],
                         GpuId(**r["gpu"]) if r["gpu"] else None)
                  for r in json.loads(proc.stdout)["results"]]
    outcome, why = policy.outcome(as_results, None, tagged, None)
    assert outcome == "failed" and [r.rule for r in why] == ["gpu.lost"]
    # ... and a service pinned to GPU 0 is not failed over for GPU 1 (its GPU results;
    # host rules such as driver.nouveau depend on the machine the test runs on).
    per_gpu = [r for r in as_results if r.gpu is not None]
    assert policy.outcome(per_gpu, None, tagged, [1])[0] == "failed"
    assert policy.outcome(per_gpu, None, tagged, [0])[0] == "passed"


def test_a_hung_gpu_keeps_its_rules_as_unknown_naming_the_hang(fake_env, host_args):
    proc = gpuguard("check", *host_args, "--format", "json", "--timeout", "1.5",
                    env=fake_env(gpus=2, hang="nvmlDeviceGetTemperature", hang_gpu=1))
    results = results_of(proc)
    assert results[("driver.responsive", None)]["status"] == "critical"
    assert results[("thermal.margin", 0)]["status"] == "ok"
    hung = results[("thermal.margin", 1)]
    assert hung["status"] == "unknown"
    assert "nvmlDeviceGetTemperature (GPU 1)" in hung["message"], hung
    # every GPU rule that GPU 0 has, GPU 1 has too: none vanished
    assert {rule for rule, gpu in results if gpu == 0} == {rule for rule, gpu in results
                                                           if gpu == 1}


def bad_snapshot(tmp_path: Path, **changes) -> Path:
    raw = json.loads(LIVE.read_text())
    for key, value in changes.items():
        scope, name = key.split("__")
        (raw["host"] if scope == "host" else raw["gpus"][0])[name] = value
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(raw))
    return path


def test_replayed_values_are_type_checked(tmp_path):
    cases = {
        "gpu__temperature_tlimit_margin_c": (float("nan"), "thermal.margin", 0),
        "host__gpu_count": (-3, "gpu.count", None),
        "gpu__clock_event_reasons": ("0x1", "clocks.hw_slowdown", 0),
        "gpu__power_limit_enforced_w": (float("inf"), "power.limit", 0),
    }
    for key, (value, rule, gpu) in cases.items():
        proc = gpuguard("check", "--format", "json", "--input", str(bad_snapshot(
            tmp_path, **{key: value})))
        result = results_of(proc)[(rule, gpu)]
        assert result["status"] == "unknown", (key, result)
        assert "invalid" in result["message"], (key, result)
    proc = gpuguard("check", "--format", "json", "--input",
                    str(bad_snapshot(tmp_path, host__gpu_count="eight")))
    assert results_of(proc)[("gpu.count", None)]["status"] == "unknown"


def test_a_list_as_pci_bus_id_is_an_error_reading_in_every_format(tmp_path):
    path = bad_snapshot(tmp_path, gpu__pci_bus_id=["00000000:18:00.0"])
    for fmt in ("table", "json", "prometheus"):
        proc = gpuguard("check", "--format", fmt, "--input", str(path))
        # the same verdict in every format (unknown: gpu.identity cannot compare an
        # address it could not read), and never a crash
        assert proc.returncode == 3 and "Traceback" not in proc.stderr, proc.stderr
    assert 'pci_bus_id=""' in gpuguard("check", "--format", "prometheus", "--input",
                                       str(path)).stdout
    unknown = [r for r in json.loads(gpuguard("check", "--format", "json", "--input",
                                              str(path)).stdout)["results"]
               if r["status"] == "unknown"]
    assert [r["rule"] for r in unknown] == ["gpu.identity"]


def test_two_gpus_with_one_uuid_both_show_and_are_a_finding(tmp_path):
    raw = json.loads(LIVE.read_text())
    twin = dict(raw["gpus"][0], index=1, pci_bus_id="00000000:28:00.0")
    raw["gpus"].append(twin)
    raw["host"]["gpu_count"] = 2
    path = tmp_path / "twins.json"
    path.write_text(json.dumps(raw))
    proc = gpuguard("check", "--format", "json", "--input", str(path))
    results = results_of(proc)
    assert results[("gpu.identity", None)]["status"] == "critical"
    assert ("thermal.margin", 0) in results and ("thermal.margin", 1) in results


def test_inputs_that_never_end_are_refused_in_time(tmp_path):
    cases = [("--input", str(fifo(tmp_path, "in")), "no end of data"),
             ("--input", "/dev/zero", "larger than"),
             ("--input", str(tmp_path), "directory")]
    for option, path, words in cases:
        started = time.monotonic()
        proc = gpuguard("check", option, path, "--timeout", "1", timeout=30)
        assert proc.returncode == 3, (path, proc.stdout, proc.stderr)
        assert words in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
        assert time.monotonic() - started < 8


def test_a_kernel_log_that_never_ends_is_unknown_not_gigabytes(tmp_path):
    started = time.monotonic()
    proc = gpuguard("check", "--format", "json", "--input", str(LIVE), "--kmsg-file",
                    "/dev/zero", "--state-dir", str(tmp_path), "--timeout", "3", timeout=60)
    xid = results_of(proc)[("xid.recent", None)]
    assert xid["status"] == "unknown", xid
    assert time.monotonic() - started < 20


def test_a_kernel_log_line_with_a_huge_number_is_text(tmp_path):
    log = tmp_path / "dmesg.txt"
    log.write_text("[  1.000000] NVRM: Xid (PCI:0000:18:00): " + "9" * 5000 + ", pid=1\n"
                   "[  2.000000] NVRM: Xid (PCI:0000:18:00): 79, pid=1, name=x, GPU has "
                   "fallen off the bus.\n")
    proc = gpuguard("check", "--format", "json", "--input", str(LIVE), "--kmsg-file", str(log))
    xid = results_of(proc)[("xid.recent", None)]
    assert xid["status"] == "critical" and xid["observed"]["counted"] == 1, xid


def test_each_source_reports_its_own_success(tmp_path, fake_env, host_args):
    proc = gpuguard("check", *host_args, "--format", "prometheus", "--timeout", "2", "--kmsg-file",
                    str(fifo(tmp_path)), env=fake_env(gpus=1), timeout=30)
    lines = proc.stdout.splitlines()
    assert 'gpuguard_source_success{source="kernel_log"} 0.0' in lines
    assert 'gpuguard_source_success{source="nvml"} 1.0' in lines
    assert any(line.startswith('gpuguard_source_duration_seconds{source="nvml"}')
               for line in lines)


def test_a_replay_that_counts_gpus_it_does_not_list_never_passes(tmp_path):
    """gpu_count 2 and no GPU listed (issue 20): the input is inconsistent, never exit 0."""
    raw = json.loads(LIVE.read_text())
    raw["host"]["gpu_count"] = 2
    raw["gpus"] = []
    snap = tmp_path / "two-counted-none-listed.json"
    snap.write_text(json.dumps(raw))
    proc = gpuguard("check", "--format", "json", "--input", str(snap))
    assert proc.returncode == 3, proc.stdout
    count = results_of(proc)[("gpu.count", None)]
    assert count["status"] == "unknown" and "inconsistent" in count["message"]
