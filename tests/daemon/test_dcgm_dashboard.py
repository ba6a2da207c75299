"""Issue 33, item 3: dcgm-exporter's own Grafana dashboard, and a published set of DCGM
alert rules, against gpuguard's compat series (`--metrics-compat dcgm`).

The dashboard is NVIDIA/dcgm-exporter's grafana/dcgm-exporter-dashboard.json at 691c927
(tests/fixtures/dcgm, with its licence): every panel query runs, its variables substituted
with the label values Prometheus holds, against a real Prometheus scraping a gpuguard
daemon on a replayed 8-GPU host. The alert rules are the default alerts of the Amazon
SageMaker HyperPod observability add-on (tests/fixtures/dcgm/README.md names the page):
promtool evaluates them on the series gpuguard exported on a fault replay."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import time
import urllib.parse
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conftest import FIXTURES
from tests.daemon.conftest import get, write_snapshot
from tests.daemon.test_metrics_doc import hgx8

# the real Prometheus of the daemon's tests, scraping the daemon
from tests.daemon.test_prometheus import prometheus, query  # noqa: F401

DCGM = FIXTURES / "dcgm"
DASHBOARD = json.loads((DCGM / "dcgm-exporter-dashboard.json").read_text())
ALERTS = DCGM / "hyperpod-alerts.yaml"
# the panels whose field gpuguard does not read (docs/metrics.md says why): no data
NO_DATA = {"Tensor Core Utilization": "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE is DCGM's "
           "profiling module; gpuguard reads no profiling counter"}
MIB = 2**20


def busy_host(tmp_path: Path) -> Path:
    """The budget's 8-GPU H200 host, with values a unit mistake would show: busy GPUs of
    different temperatures, power, clocks and memory."""
    path = hgx8(tmp_path)
    doc = json.loads(path.read_text())
    doc["host"]["hostname"] = "node-a"
    for i, gpu in enumerate(doc["gpus"]):
        gpu.update(temperature_c=40 + i, power_draw_w=300.5 + i, clock_sm_mhz=1980 - i,
                   utilization_gpu_percent=50 + i, memory_used_bytes=(20000 + i) * MIB + 7)
    write_snapshot(path, doc)
    return path


def api(base: str, path: str, **params: str) -> Any:
    code, body = get(f"{base}/api/v1/{path}?{urllib.parse.urlencode(params)}")
    assert code == 200, body
    return json.loads(body)["data"]


def by_gpu(rows: list[dict[str, Any]]) -> dict[str, float]:
    return {row["metric"]["gpu"]: float(row["value"][1]) for row in rows}


def variables(base: str) -> dict[str, str]:
    """Each dashboard variable as Grafana would fill it with every value selected: its
    label_values() query asked of Prometheus, the values joined into a regex."""
    out = {}
    for var in DASHBOARD["templating"]["list"]:
        if var["type"] != "query":
            continue
        metric, label = re.fullmatch(r"label_values\((\w+), (\w+)\)", var["query"]).groups()
        values = api(base, f"label/{label}/values", **{"match[]": metric})
        assert values, (var["name"], "no values")
        # as Grafana writes a multi-value variable into PromQL: regex-escaped, inside a
        # string literal (its backslashes doubled)
        out[var["name"]] = "|".join(re.escape(v).replace("\\", "\\\\") for v in values)
    return out


def unit(panel: dict[str, Any]) -> str | None:
    """The panel's unit wherever the dashboard's schema keeps it: a graph panel on its left
    y axis (`yaxes`), a gauge or stat panel in `options.fieldOptions.defaults` (Grafana 6)
    or `fieldConfig.defaults` (Grafana 7 and later). Where more than one is set they must
    agree, or the check below would read only one of them."""
    found = {where: value for where, value in (
        ("yaxes", (panel.get("yaxes") or [{}])[0].get("format")),
        ("fieldOptions", panel.get("options", {}).get("fieldOptions", {})
         .get("defaults", {}).get("unit")),
        ("fieldConfig", panel.get("fieldConfig", {}).get("defaults", {}).get("unit")))
        if value}
    assert len(set(found.values())) <= 1, (panel["title"], found)
    return next(iter(found.values()), None)


def panels() -> list[tuple[str, str, str | None]]:
    """(title, query, unit) of every panel target."""
    out = []
    for panel in DASHBOARD["panels"]:
        out.extend((panel["title"], target["expr"], unit(panel))
                   for target in panel["targets"])
    return out


# Each panel's unit, as gpuguard's own series of the same field give it (the test below
# checks each value against that series): the dashboard must say the same
UNITS = {"GPU Temperature": "celsius", "GPU Avg. Temp": "celsius",  # _celsius
         "GPU Power Usage": "watt", "GPU Power Total": "watt",  # _watts
         "GPU SM Clocks": "hertz",  # the panel's MHz * 1e6
         "GPU Utilization": "percent",  # _ratio * 100
         "GPU Framebuffer Mem Used": "decmbytes",  # _bytes // MiB
         "Tensor Core Utilization": "percentunit"}  # no data (NO_DATA): as the dashboard


def test_every_panels_unit_is_read_and_is_gpuguards_units():
    units = {title: unit for title, _, unit in panels()}
    assert units == UNITS


def test_every_panel_of_dcgm_exporters_dashboard_against_gpuguard(
        start_daemon, prometheus, tmp_path):  # noqa: F811
    daemon = start_daemon("--input", str(busy_host(tmp_path)), "--fast-interval", "0.5",
                          "--metrics-compat", "dcgm")
    target = f"127.0.0.1:{daemon.port}"
    base = prometheus([target])
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if len(query(base, "DCGM_FI_DEV_GPU_TEMP")) == 8:
                break
        except (OSError, AssertionError):
            pass
        time.sleep(0.5)
    values = variables(base)
    assert values == {"instance": target.replace(".", r"\\."), "gpu": "0|1|2|3|4|5|6|7"}
    results = {}
    for title, expr, unit in panels():
        for name, value in values.items():
            expr = expr.replace(f"${name}", value)
        results[title] = (query(base, expr), unit)
    assert {t for t, (rows, _) in results.items() if not rows} == set(NO_DATA)
    assert len(results) == 8

    # the right units: each panel's value against gpuguard's own series of the same scrape
    own = {name: by_gpu(query(base, name)) for name in (
        "gpuguard_gpu_temperature_celsius", "gpuguard_gpu_power_draw_watts",
        "gpuguard_gpu_utilization_ratio", "gpuguard_gpu_memory_used_bytes")}
    temps, unit = results["GPU Temperature"]
    assert unit == "celsius" and by_gpu(temps) == own["gpuguard_gpu_temperature_celsius"]
    assert by_gpu(temps) == {str(i): 40.0 + i for i in range(8)}
    [avg], unit = results["GPU Avg. Temp"]
    assert unit == "celsius" and float(avg["value"][1]) == sum(40 + i for i in range(8)) / 8
    power, unit = results["GPU Power Usage"]
    assert unit == "watt" and by_gpu(power) == own["gpuguard_gpu_power_draw_watts"]
    [total], unit = results["GPU Power Total"]
    assert unit == "watt"
    assert float(total["value"][1]) == pytest.approx(sum(300.5 + i for i in range(8)))
    clocks, unit = results["GPU SM Clocks"]  # the panel's MHz * 1e6: hertz
    assert unit == "hertz" and by_gpu(clocks) == {str(i): (1980 - i) * 1e6 for i in range(8)}
    util, unit = results["GPU Utilization"]
    assert unit == "percent" and by_gpu(util) == {
        g: round(r * 100) for g, r in own["gpuguard_gpu_utilization_ratio"].items()}
    used, unit = results["GPU Framebuffer Mem Used"]  # decmbytes: MiB as DCGM counts them
    assert unit == "decmbytes" and by_gpu(used) == {
        g: float(int(b) // MIB) for g, b in own["gpuguard_gpu_memory_used_bytes"].items()}


# The faults, one GPU each, and the rules of the published set that should fire on them.
# Both branches of the two rules that have two: GPUMemoryErrorDetected on a volatile
# double-bit count (GPU 1) and on an aggregate one that rose within 5 minutes (GPU 4; GPU 0's
# aggregate count is old, held flat, and does not fire); NVLinkErrorsDetected on a recovery
# error (GPU 2) and on more than 10 replays (GPU 6; GPU 7's 10 do not fire).
FAULTS = {3: {"temperature_c": 90}, 1: {"ecc_volatile_uncorrected": 2},
          0: {"ecc_aggregate_uncorrected": 2}, 4: {"ecc_aggregate_uncorrected": 3}}
NVLINK_GPU, XID_GPU = 2, 5
REPLAYS = {6: 11, 7: 10}  # on link 0 of the GPU; the replayed host has none
AGG_RISING_GPU = 4  # its count before the fault: the replayed host's, 0
AGG = "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL"
FIRES = {"GPUHighTemperature": (("DCGM_FI_DEV_GPU_TEMP", 3),),
         "GPUCriticalTemperature": (("DCGM_FI_DEV_GPU_TEMP", 3),),
         "GPUMemoryErrorDetected": (("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", 1),
                                    (AGG, AGG_RISING_GPU)),
         "NVLinkErrorsDetected": (("DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL",
                                   NVLINK_GPU),
                                  ("DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL", 6)),
         "GPUXidError": (("DCGM_FI_DEV_XID_ERRORS", XID_GPU),)}
# the rules of the set whose field gpuguard does not read (or that are not DCGM's): they
# evaluate, on no series
SILENT = {"GPUPowerViolation": "DCGM_FI_DEV_POWER_VIOLATION is not read",
          "GPUThermalViolation": "DCGM_FI_DEV_THERMAL_VIOLATION is not read",
          "MIGConfigFailure": "kubelet's metric", "NodeDiskSpaceWarning": "node_exporter's",
          "FsxLustreStorageWarning": "an FSx exporter's"}


def fault_host(tmp_path: Path) -> tuple[Path, Path]:
    path = hgx8(tmp_path)
    doc = json.loads(path.read_text())
    doc["host"]["hostname"] = "node-a"  # dcgm-exporter's Hostname label
    for index, changes in FAULTS.items():
        doc["gpus"][index].update(changes)
    doc["gpus"][NVLINK_GPU]["nvlink_links"][0]["recovery"] = 1
    for index, replays in REPLAYS.items():
        doc["gpus"][index]["nvlink_links"][0]["replay"] = replays
    write_snapshot(path, doc)
    log = tmp_path / "kmsg.log"
    log.write_text(f"4,100,1000000,-;NVRM: Xid (PCI:0000:{0x10 + XID_GPU:02x}:00): 79, "
                   "pid=1234, name=python3, GPU has fallen off the bus.\n")
    return path, log


def samples(text: str) -> list[tuple[str, dict[str, str], str]]:
    out = []
    for line in text.splitlines():
        if line.startswith("DCGM_"):
            name, rest = line.split("{", 1)
            labels, value = rest.rsplit("} ", 1)
            out.append((name, dict(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', labels)), value))
    return out


def test_the_published_dcgm_alerts_fire_on_gpuguards_series_of_a_fault_replay(start_daemon,
                                                                              tmp_path):
    """Each rule of the set evaluates (promtool test rules runs every one) and those whose
    field gpuguard reads fire on the GPU of their fault and on no other; `for:` is
    honoured (the series held 10 minutes, as the scrape read them)."""
    snap, log = fault_host(tmp_path)
    daemon = start_daemon("--input", str(snap), "--fast-interval", "0.3", "--kmsg-file",
                          str(log), "--metrics-compat", "dcgm")
    text = daemon.wait_for(lambda: 'err_code="79"' in (m := daemon.metrics()) and m,
                           what="the compat series with the Xid")
    scraped = samples(text)
    series = [{"series": name + "{" + ",".join(f'{k}="{v}"' for k, v in labels.items()) + "}",
               "values": history(name, labels, value)} for name, labels, value in scraped]
    rules = {r["alert"]: r for g in yaml.safe_load(ALERTS.read_text())["groups"]
             for r in g["rules"]}
    expected = []
    for alert, fires in FIRES.items():
        rule, alerts = rules[alert], []
        for field, gpu in fires:
            [(labels, value)] = [(labels, value) for name, labels, value in scraped
                                 if name == field and labels["gpu"] == str(gpu)]
            alerts.append({"exp_labels": {**labels, **rule["labels"]},
                           "exp_annotations": {k: expand(v, labels, value)
                                               for k, v in rule["annotations"].items()}})
        expected.append({"alertname": alert, "exp_alerts": alerts})
    expected += [{"alertname": alert, "exp_alerts": []} for alert in SILENT]
    tests = tmp_path / "dcgm-alert-tests.yaml"
    tests.write_text(yaml.safe_dump({
        "rule_files": [str(ALERTS)], "evaluation_interval": "1m",
        "tests": [{"interval": "1m", "input_series": series,
                   "alert_rule_test": [{**e, "eval_time": "10m"} for e in expected]}]}))
    run = subprocess.run([shutil.which("promtool") or "promtool", "test", "rules", str(tests)],
                         capture_output=True, text=True, check=False)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    assert set(rules) == set(FIRES) | set(SILENT)
    # the faults as gpuguard exported them: what the two-branch rules were tested on
    exported = {(name, labels["gpu"]): value for name, labels, value in scraped}
    assert [exported[AGG, str(g)] for g in (0, AGG_RISING_GPU)] == ["2", "3"]
    assert [exported["DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL", str(g)]
            for g in REPLAYS] == ["11", "10"]
    # what the page says: the last Xid's code, on the GPU's node
    [xid] = [e for e in expected if e["alertname"] == "GPUXidError"]
    assert xid["exp_alerts"][0]["exp_annotations"]["description"] == \
        f"GPU {XID_GPU} experienced XID error 79 on node node-a"


def history(name: str, labels: dict[str, str], value: str) -> str:
    """The series' samples a minute apart, as promtool reads them: the value gpuguard
    exported, held; for the rising aggregate count, the replayed host's count before the
    fault (0) for its first 8 minutes, then the exported one, so that at the 10th minute
    it has risen within the rule's 5 minutes."""
    if name == AGG and labels["gpu"] == str(AGG_RISING_GPU):
        return f"0x7 {value}x20"
    return f"{value}+0x20"


def expand(template: str, labels: dict[str, str], value: str) -> str:
    """The rule's annotation as Prometheus renders it for this series ($labels and $value
    are all these templates use)."""
    text = template.replace("{{ $value }}", value)
    return re.sub(r"\{\{ \$labels\.(\w+) \}\}", lambda m: labels.get(m.group(1), ""), text)
