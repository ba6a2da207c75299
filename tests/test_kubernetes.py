"""Kubernetes (issue 22, item 3): node-problem-detector's custom-plugin contract kept by
gpuguard's POSIX sh plugin under dash (every exit code, the length, staleness), the real
daemon's verdict files read by it, and the manifests validated offline against the
Kubernetes OpenAPI schemas (kubernetes-validate from PyPI bundles them) and promtool."""

from __future__ import annotations

import copy
import json
import os
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpuguard.daemon.verdict_files import CONDITIONS, NOT_A_CONDITION, boottime
from tests.conftest import REPO
from tests.daemon.conftest import host_snapshot, start_daemon, write_snapshot

__all__ = ["start_daemon"]  # the real daemon's fixture, used below

K8S = REPO / "packaging" / "kubernetes"
PLUGIN = K8S / "gpuguard-npd-plugin.sh"
DASH = shutil.which("dash")
needs_dash = pytest.mark.skipif(DASH is None, reason="needs dash (Debian's /bin/sh)")


def plugin(path: Path, uptime: float | None = None, tmp: Path | None = None
           ) -> tuple[int, str]:
    """Run the plugin as NPD does (dash, an empty environment but the clock's file)."""
    env = {"PATH": "/usr/bin:/bin"}
    if uptime is not None:
        assert tmp is not None
        clock = tmp / "uptime"
        clock.write_text(f"{uptime:.2f} 1234.00\n")
        env["GPUGUARD_UPTIME_FILE"] = str(clock)
    assert DASH is not None
    done = subprocess.run([DASH, str(PLUGIN), str(path)], capture_output=True, text=True,
                          env=env, timeout=10, check=False)
    return done.returncode, done.stdout


def verdict(tmp: Path, status: str, message: str, written: int = 1000, max_age: int = 10,
            name: str = "gpu-hardware") -> Path:
    path = tmp / name
    path.write_text(f"status={status}\nmessage={message}\nboottime={written}\n"
                    f"max_age_s={max_age}\n")
    return path


LONG = ("critical: xid.recent GPU 3 (+2 more): GPU 3 (0000:3b:00.0): Xid 79 (GPU has fallen "
        "off the bus), last 4s ago: reboot; it keeps coming back: contact NVIDIA support")


@needs_dash
@pytest.mark.parametrize(("status", "code"), [("ok", 0), ("warning", 0), ("critical", 1),
                                              ("unknown", 2), ("bogus", 2), ("", 2)])
def test_each_status_gives_npds_exit_code(tmp_path: Path, status: str, code: int) -> None:
    got, out = plugin(verdict(tmp_path, status, f"{status}: thermal.margin GPU 0: x"),
                      uptime=1005.5, tmp=tmp_path)
    assert got == code
    assert out.count("\n") == 1 and out.startswith("gpuguard: ")


@needs_dash
def test_the_message_is_one_line_of_at_most_80_characters_naming_rule_and_gpu(
        tmp_path: Path) -> None:
    code, out = plugin(verdict(tmp_path, "critical", LONG), uptime=1001, tmp=tmp_path)
    assert code == 1
    line = out.rstrip("\n")
    assert "\n" not in line and len(line) <= 80 and len(line) == 80
    assert "xid.recent GPU 3" in line


@needs_dash
@pytest.mark.parametrize(("uptime", "why"), [
    (1011, "11s old (max 10s): stale"),  # two cycles passed with no new file
    (999, "from before this boot"),  # written on a clock ahead of now: an earlier boot
])
def test_a_stale_verdict_is_unknown_never_its_old_ok(tmp_path: Path, uptime: float,
                                                     why: str) -> None:
    code, out = plugin(verdict(tmp_path, "ok", "ok: 29 result(s) ok"), uptime=uptime,
                       tmp=tmp_path)
    assert code == 2 and why in out
    fresh, _ = plugin(verdict(tmp_path, "ok", "ok"), uptime=1010, tmp=tmp_path)
    assert fresh == 0  # at the limit it is still the daemon's word


@needs_dash
def test_a_missing_malformed_or_odd_file_is_unknown_and_never_blocks(tmp_path: Path) -> None:
    assert plugin(tmp_path / "gpu-hardware", 1000, tmp_path)[0] == 2
    odd = tmp_path / "odd"
    odd.write_text("status=ok\nmessage=ok\nboottime=soon\nmax_age_s=10\n")
    assert plugin(odd, 1000, tmp_path)[0] == 2
    empty = tmp_path / "empty"
    empty.write_text("")
    assert plugin(empty, 1000, tmp_path)[0] == 2
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    started = time.monotonic()
    code, out = plugin(fifo, 1000, tmp_path)
    assert code == 2 and "no verdict" in out and time.monotonic() - started < 5
    assert plugin(tmp_path, 1000, tmp_path)[0] == 2  # a directory
    # the real clock (/proc/uptime) without the tests' file: a file written now is fresh
    now = verdict(tmp_path, "ok", "ok", written=int(boottime()))
    assert plugin(now)[0] == 0


@needs_dash
def test_the_daemons_files_drive_the_plugin(start_daemon: Any, tmp_path: Path) -> None:
    """A real daemon on a host whose GPU 0 runs past T.Limit: gpu-hardware is NonOK naming
    the rule and GPU, the others OK; once the daemon stops, they turn Unknown as they age."""
    snap = tmp_path / "hot.json"
    write_snapshot(snap, host_snapshot(2, {(0, "temperature_tlimit_margin_c"): -5}))
    npd = tmp_path / "npd"
    daemon = start_daemon("--input", str(snap), "--npd-dir", str(npd), "--fast-interval", "1")
    daemon.wait_for(lambda: all((npd / n).exists() for n in CONDITIONS), 20, "the files")
    code, out = plugin(npd / "gpu-hardware")
    assert code == 1 and "thermal.margin GPU 0" in out, out
    assert plugin(npd / "gpu-driver")[0] == 0
    daemon.stop()
    text = (npd / "gpu-hardware").read_text()
    written = int(text.split("boottime=")[1].split()[0])
    max_age = int(text.split("max_age_s=")[1].split()[0])
    # the daemon's stale_after (daemon/freshness.py): 2 x (1 s + NVML's 4 s + history's 1 s)
    assert max_age <= 12
    assert plugin(npd / "gpu-hardware", written + max_age, tmp_path)[0] == 1
    assert plugin(npd / "gpu-hardware", written + max_age + 2, tmp_path)[0] == 2


def manifests() -> list[dict[str, Any]]:
    docs = []
    for name in ("daemonset.yaml", "node-problem-detector.yaml", "servicemonitor.yaml"):
        docs += [d for d in yaml.safe_load_all((K8S / name).read_text()) if d]
    return docs


def test_core_manifests_match_the_kubernetes_schemas() -> None:
    """Every core object (DaemonSets, ConfigMap, Service) against the OpenAPI schemas
    kubernetes-validate bundles, strictly (an unknown field fails). The ServiceMonitor and
    PrometheusRule are custom resources it has no schema for: their rules go to promtool."""
    kubernetes_validate = pytest.importorskip("kubernetes_validate")
    checked = []
    for doc in manifests():
        if doc["apiVersion"].startswith("monitoring.coreos.com/"):
            continue
        kubernetes_validate.validate(doc, "1.30", strict=True)
        checked.append(doc["kind"])
    assert sorted(checked) == ["ConfigMap", "DaemonSet", "DaemonSet", "Service"]
    broken = copy.deepcopy(next(d for d in manifests() if d["kind"] == "DaemonSet"))
    broken["spec"]["template"]["spec"]["containers"][0]["volumeMount"] = []  # a typo
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, "1.30", strict=True)


def test_the_prometheusrule_passes_promtool(tmp_path: Path) -> None:
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("needs promtool (scripts/test.sh installs prometheus)")
    rule = yaml.safe_load((K8S / "prometheusrule.yaml").read_text())
    rules = tmp_path / "rules.yaml"
    rules.write_text(yaml.safe_dump({"groups": rule["spec"]["groups"]}))
    done = subprocess.run([promtool, "check", "rules", str(rules)], capture_output=True,
                          text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stdout + done.stderr


def test_npd_config_ships_the_plugin_and_a_rule_per_condition_file() -> None:
    config = next(d for d in manifests() if d["kind"] == "ConfigMap")
    assert config["data"]["gpuguard-npd-plugin.sh"] == PLUGIN.read_text()
    monitor = json.loads(config["data"]["gpuguard-monitor.json"])
    assert monitor["plugin"] == "custom"
    assert monitor["pluginConfig"]["max_output_length"] == 80
    files = sorted(Path(r["args"][0]).name for r in monitor["rules"])
    assert files == sorted(CONDITIONS)
    assert all(r["type"] == "permanent" and r["timeout"] == "5s" for r in monitor["rules"])
    npd = next(d for d in manifests() if d["metadata"]["name"] == "node-problem-detector")
    args = npd["spec"]["template"]["spec"]["containers"][0]["command"]
    assert "--config.custom-plugin-monitor=/config/gpuguard/gpuguard-monitor.json" in args
    gpuguard = next(d for d in manifests() if d["metadata"]["name"] == "gpuguard"
                    and d["kind"] == "DaemonSet")
    assert "--npd-dir" in gpuguard["spec"]["template"]["spec"]["containers"][0]["args"]


def test_every_rule_family_is_in_a_condition_or_left_out_saying_why() -> None:
    """gsp.firmware and devices.* (issue 21) were in no condition: a GSP crash that
    `gpuguard status` called critical left every node condition OK."""
    from gpuguard.judge.registry import FAMILIES

    placed = [f for families in CONDITIONS.values() for f in families]
    assert len(placed) == len(set(placed)), "a family in two conditions"
    assert set(FAMILIES) == set(placed) | set(NOT_A_CONDITION), \
        set(FAMILIES) ^ (set(placed) | set(NOT_A_CONDITION))
    assert not set(placed) & set(NOT_A_CONDITION)
