"""The command line as users and units run it: exit codes, formats, replay, bad input."""

import json
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from gpuguard.config.ruleset import load_ruleset
from tests.conftest import FIXTURES, H200_XML, gpuguard

V11 = FIXTURES / "nvidia-smi-v11-two-gpus.xml"


def test_h200_xml_checks_clean():
    proc = gpuguard("check", "--input", str(H200_XML))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "0 critical, 0 warning, 0 unknown" in proc.stdout


def test_snapshot_made_from_the_h200_checks_clean(tmp_path):
    snap = tmp_path / "h200.json"
    made = gpuguard("snapshot", "--input", str(H200_XML), "-o", str(snap))
    assert made.returncode == 0, made.stderr
    proc = gpuguard("check", "--input", str(snap), "--format", "json")
    assert proc.returncode == 0, proc.stdout
    doc = json.loads(proc.stdout)
    assert doc["summary"]["critical"] == doc["summary"]["warning"] == 0


def test_nvml_probe_recording_checks_clean(tmp_path, h200_from_probe):
    proc = gpuguard("check", "--input", str(h200_from_probe))
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_faulty_host_exit_code_and_every_fault_reported():
    proc = gpuguard("check", "--input", str(V11), "--format", "json")
    assert proc.returncode == 2
    doc = json.loads(proc.stdout)
    bad = {(r["rule"], r["gpu"]["index"] if r["gpu"] else None): r["status"]
           for r in doc["results"] if r["status"] not in ("ok", "skipped")}
    # the faults this dump holds, each found with its status (a rule added later may find
    # more on it: the healthy recordings, not this one, hold every rule to no false alarm)
    assert bad.items() >= {
        ("clocks.hw_slowdown", 1): "critical",
        ("ecc.uncorrected", 1): "critical",
        ("pcie.link_width", 1): "critical",   # x8 at 97% utilization
        ("memory.retired_pages", 1): "warning",
        ("memory.row_remap", 1): "warning",
        ("persistence.mode", 1): "warning",
        ("power.limit", 1): "warning",
        ("thermal.margin", 1): "unknown",     # nvidia-smi printed [Unknown Error]
        ("vbios.consistent", None): "warning",
    }.items()


def test_json_shape():
    doc = json.loads(gpuguard("check", "--input", str(V11), "--format", "json").stdout)
    assert doc["schema"] == 1
    assert set(doc["host"]) >= {"hostname", "driver_version", "cuda_driver_version", "gpu_count"}
    for r in doc["results"]:
        assert set(r) >= {"rule", "status", "gpu", "message", "remediation", "observed"}
        assert r["status"] in ("ok", "warning", "critical", "unknown", "skipped")
        assert r["gpu"] is None or set(r["gpu"]) == {"index", "uuid", "pci_bus_id"}
        if r["status"] in ("warning", "critical"):
            assert r["remediation"]
    counted = sum(doc["summary"][s] for s in ("ok", "warning", "critical", "unknown", "skipped"))
    assert counted == len(doc["results"])
    assert doc["summary"]["exit_code"] == 2


@pytest.mark.parametrize(
    ("args", "code"),
    [
        (["--only", "persistence.mode"], 1),
        (["--only", "pcie.*", "--skip", "pcie.link_width"], 0),
        (["--only", "thermal.margin"], 3),
        (["--skip", "clocks.*", "--skip", "ecc.*", "--skip", "pcie.*"], 1),
    ],
)
def test_exit_codes_follow_the_worst_result(args, code):
    proc = gpuguard("check", "--input", str(V11), *args)
    assert proc.returncode == code, proc.stdout


def test_quiet_prints_nothing_when_all_is_well():
    proc = gpuguard("check", "--input", str(H200_XML), "--quiet")
    assert (proc.returncode, proc.stdout) == (0, "")
    proc = gpuguard("check", "--input", str(V11), "--quiet")
    assert "ecc.uncorrected" in proc.stdout and "OK " not in proc.stdout


def test_table_has_no_colour_when_not_a_tty():
    proc = gpuguard("check", "--input", str(V11), env={"NO_COLOR": ""})
    assert "\033[" not in proc.stdout


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool missing: the README's "
                    "test command installs Debian's prometheus package")
def test_prometheus_text_passes_promtool(tmp_path):
    out = tmp_path / "gpuguard.prom"
    proc = gpuguard("check", "--input", str(V11), "--format", "prometheus", "--output", str(out))
    assert proc.returncode == 2
    text = out.read_text()
    lint = subprocess.run(["promtool", "check", "metrics"], input=text, capture_output=True,
                          text=True, check=False)
    assert lint.returncode == 0, lint.stdout + lint.stderr
    line = next(li for li in text.splitlines()
                if li.startswith("gpuguard_rule_status{") and 'rule="ecc.uncorrected"' in li
                and 'gpu="1"' in li)
    assert line.endswith(" 2.0")
    assert 'gpuguard_check_exit_code 2.0' in text
    # atomic write: only the final file is left behind
    assert [p.name for p in tmp_path.iterdir()] == ["gpuguard.prom"]


def test_output_replaces_atomically(tmp_path):
    out = tmp_path / "check.json"
    out.write_text("old")
    gpuguard("check", "--input", str(H200_XML), "--format", "json", "-o", str(out))
    assert json.loads(out.read_text())["summary"]["exit_code"] == 0


def test_bad_rule_file_is_reported_with_file_and_line(tmp_path):
    rules = tmp_path / "rules.d"
    rules.mkdir()
    (rules / "site.yaml").write_text("overrides:\n  pcie.replays:\n    thresholds:\n"
                                     "      max_replays: many\n")
    proc = gpuguard("check", "--input", str(H200_XML), "--rules", str(rules))
    assert proc.returncode == 3
    assert proc.stdout == ""
    assert f"{rules / 'site.yaml'}:4: pcie.replays: threshold 'max_replays' must be a number" \
        in proc.stderr
    assert "Traceback" not in proc.stderr


def test_bad_input_file(tmp_path):
    bad = tmp_path / "dump.xml"
    bad.write_text("<nvidia_smi_log><gpu>")
    proc = gpuguard("check", "--input", str(bad))
    assert proc.returncode == 3
    assert "dump.xml:1:" in proc.stderr and "Traceback" not in proc.stderr


def test_profile_on_the_command_line(tmp_path):
    profile = tmp_path / "profile.yaml"
    profile.write_text("gpu_count: 8\n")
    proc = gpuguard("check", "--input", str(H200_XML), "--profile", str(profile), "-q")
    assert proc.returncode == 2
    assert "1 GPU(s) visible, the profile expects 8" in proc.stdout


def test_rules_list_and_explain(tmp_path):
    listed = gpuguard("rules", "list")
    assert listed.returncode == 0
    listed_ids = {li.split()[0] for li in listed.stdout.splitlines()[1:] if li.strip()}
    assert listed_ids == set(load_ruleset().rules)  # the registry's list, not a count
    profile = tmp_path / "profile.yaml"
    profile.write_text("rules:\n  pcie.link_width:\n"
                       "    thresholds: {busy_utilization_percent: 50}\n")
    explained = gpuguard("rules", "explain", "pcie.link_width", "--profile", str(profile))
    assert explained.returncode == 0
    assert "busy_utilization_percent=50" in explained.stdout
    assert f"changed at:  {profile}:2" in explained.stdout
    assert "lspci" in explained.stdout
    nope = gpuguard("rules", "explain", "pcie.nope")
    # a usage error like every other: exit 3, gpuguard's own words (not click's "Error:")
    assert nope.returncode == 3 and nope.stderr.startswith("gpuguard: no rule 'pcie.nope'")


# --- live NVML path, through the fake libnvidia-ml ------------------------------------


def test_no_driver_says_so_clearly(fake_env, host_args):
    proc = gpuguard("check", *host_args, env=fake_env(init_error=9))
    assert proc.returncode == 2
    assert "CRITICAL  driver.loaded" in proc.stdout
    assert "kernel module is not loaded" in proc.stdout


def test_library_missing_says_so_clearly(tmp_path, host_args):
    import ctypes.util

    if ctypes.util.find_library("nvidia-ml"):
        pytest.skip("this machine has a real libnvidia-ml")
    proc = gpuguard("check", *host_args, env={"LD_LIBRARY_PATH": str(tmp_path)})
    assert proc.returncode == 2
    assert "libnvidia-ml.so.1" in proc.stdout and "not installed" in proc.stdout


def test_live_check_through_fake_nvml(fake_env, host_args):
    proc = gpuguard("check", *host_args, "--format", "json", env=fake_env(gpus=2, width=8, util=90))
    doc = json.loads(proc.stdout)
    assert proc.returncode == 2
    widths = [r for r in doc["results"] if r["rule"] == "pcie.link_width"]
    assert [r["status"] for r in widths] == ["critical", "critical"]
    responsive = next(r for r in doc["results"] if r["rule"] == "driver.responsive")
    assert responsive["status"] == "ok"


@pytest.mark.parametrize(("hang", "gpu", "named"), [
    ("nvmlDeviceGetTemperature", 1, "nvmlDeviceGetTemperature (GPU 1)"),
    ("nvmlInit", -1, "nvmlInit"),
])
def test_hung_nvml_call_still_returns_in_time(fake_env, hang, gpu, named, host_args):
    timeout = 1.5
    started = time.monotonic()
    proc = gpuguard("check", *host_args, "--timeout", str(timeout), "--format", "json",
                    env=fake_env(gpus=2, hang=hang, hang_gpu=gpu), timeout=30)
    took = time.monotonic() - started
    assert proc.returncode == 2
    # Python start-up is outside gpuguard's control; 2 s of slack keeps slow CI honest.
    assert took < timeout + 2.0
    doc = json.loads(proc.stdout)
    responsive = next(r for r in doc["results"] if r["rule"] == "driver.responsive")
    assert responsive["status"] == "critical"
    assert named in responsive["message"]
    if gpu == 1:  # the GPU that answered is judged; the hung one is listed, unknown
        statuses = {r["gpu"]["index"]: r["status"] for r in doc["results"]
                    if r["gpu"] and r["rule"] == "thermal.margin"}
        assert statuses == {0: "ok", 1: "unknown"}


def test_hung_worker_is_not_left_behind(fake_env, host_args):
    gpuguard("check", *host_args, "--timeout", "0.5", env=fake_env(hang="nvmlDeviceGetTemperature"))
    time.sleep(0.2)
    left = subprocess.run(["pgrep", "-f", "gpuguard check --timeout 0.5"], capture_output=True,
                          text=True, check=False)
    assert left.stdout.strip() == ""


def test_textfile_dir_does_not_exist(tmp_path):
    proc = gpuguard("check", "--input", str(H200_XML), "--format", "prometheus", "-o",
                    str(Path(tmp_path) / "missing" / "gpuguard.prom"))
    assert proc.returncode == 3
    assert "cannot write" in proc.stderr and "Traceback" not in proc.stderr


def test_a_lost_gpu_is_a_result_not_a_crash(fake_env, host_args):
    proc = gpuguard("check", *host_args, "--format", "json", env=fake_env(gpus=2, lost_gpu=1))
    assert "Traceback" not in proc.stderr
    doc = json.loads(proc.stdout)
    lost = {r["rule"]: r for r in doc["results"] if r["gpu"] and r["gpu"]["index"] == 1}
    assert lost["thermal.margin"]["status"] == "unknown"
    assert "GPU is lost" in lost["thermal.margin"]["message"]
    assert lost["pcie.link_width"]["status"] == "unknown"
    healthy = {r["rule"]: r for r in doc["results"] if r["gpu"] and r["gpu"]["index"] == 0}
    assert healthy["thermal.margin"]["status"] == "ok"
    # NVML's "GPU is lost" is a fact: that GPU is critical (gpu.lost), and so is the exit.
    assert lost["gpu.lost"]["status"] == "critical" and doc["summary"]["critical"] == 1
    assert proc.returncode == 2


def test_every_output_prints_the_exit_code_the_process_returns():
    warn_only = ("--input", str(FIXTURES / "nvidia-smi-v11-two-gpus.xml"), "--only",
                 "persistence.mode", "--fail-on", "critical")
    table = gpuguard("check", *warn_only)
    assert table.returncode == 0
    assert "(exit 0 under --fail-on critical; 1 without)" in table.stdout
    as_json = gpuguard("check", "--format", "json", *warn_only)
    assert as_json.returncode == 0 and json.loads(as_json.stdout)["summary"]["exit_code"] == 0
    prom = gpuguard("check", "--format", "prometheus", *warn_only)
    assert prom.returncode == 0 and "gpuguard_check_exit_code 0.0" in prom.stdout
    plain = gpuguard("check", *warn_only[:-2])
    assert plain.returncode == 1 and "(exit 1)" in plain.stdout


def test_a_filter_that_leaves_nothing_does_not_pass():
    typo = gpuguard("check", "--input", str(H200_XML), "--only", "pcie.lnk*")
    assert typo.returncode == 3 and "--only 'pcie.lnk*' matches no rule" in typo.stderr
    none = gpuguard("check", "--input", str(H200_XML), "--only", "pcie.*", "--skip", "pcie.*")
    assert none.returncode == 3 and "no rule gave a result" in none.stdout


def test_check_leaves_the_nvlink_counters_to_the_daemon_and_snapshot_keeps_them(fake_env,
                                                                                host_args):
    env = fake_env(gpus=2, nvlinks=18)
    proc = gpuguard("check", *host_args, "--format", "json", "--only", "nvlink.*", env=env)
    results = {(r["rule"], r["gpu"]["index"]): r for r in json.loads(proc.stdout)["results"]}
    assert results[("nvlink.state", 0)]["status"] == "ok"
    errors = results[("nvlink.errors", 1)]
    assert errors["status"] == "skipped" and "check` leaves them out" in errors["message"]
    snap = json.loads(gpuguard("snapshot", *host_args, env=env).stdout)
    links = snap["gpus"][0]["nvlink_links"]
    assert len(links) == 18 and all(isinstance(link["crc_data"], int) for link in links)
