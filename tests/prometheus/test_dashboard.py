"""The Grafana dashboard: valid JSON, current, every query parses (promtool), and every
metric it names is one gpuguard exports (docs/metrics.md, itself checked against the
daemon)."""

import json
import re
import subprocess
import sys

import yaml

from tests.conftest import REPO
from tests.prometheus.test_alerts import promtool

DASHBOARD = REPO / "packaging" / "grafana" / "gpuguard.json"
VARIABLES = {"$__rate_interval": "5m", "$__interval": "1m", "$host": ".*", "$gpu": ".*"}


def queries():
    doc = json.loads(DASHBOARD.read_text())
    out = [t["expr"] for p in doc["panels"] for t in p["targets"]]
    for var in doc["templating"]["list"]:
        if var["type"] == "query":
            # label_values(metric, label) is Grafana's, not PromQL: its selector is checked
            out.append(re.match(r"label_values\((.*), \w+\)", var["definition"]).group(1))
    return out


def substituted(expr):
    for name, value in VARIABLES.items():
        expr = expr.replace(name, value)
    return expr


def test_dashboard_is_current_json_with_the_variables():
    check = subprocess.run([sys.executable, "scripts/gen_dashboard.py", "--check"], cwd=REPO,
                           capture_output=True, text=True, check=False)
    assert check.returncode == 0, check.stderr
    doc = json.loads(DASHBOARD.read_text())
    names = {v["name"]: v["type"] for v in doc["templating"]["list"]}
    assert names == {"datasource": "datasource", "host": "query", "gpu": "query"}
    assert all(p["datasource"]["uid"] == "${datasource}" for p in doc["panels"])
    assert len({p["id"] for p in doc["panels"]}) == len(doc["panels"])


def test_every_query_parses(tmp_path):
    rules = {"groups": [{"name": "dashboard", "rules": [
        {"record": f"dashboard:query_{i}", "expr": substituted(expr)}
        for i, expr in enumerate(queries())]}]}
    path = tmp_path / "dashboard-rules.yaml"
    path.write_text(yaml.safe_dump(rules))
    proc = subprocess.run([promtool(), "check", "rules", str(path)], capture_output=True,
                          text=True, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_every_metric_is_one_gpuguard_exports():
    documented = set(re.findall(r"`(gpuguard_[a-z_]+)`",
                                (REPO / "docs" / "metrics.md").read_text()))
    used = {name for expr in queries() for name in re.findall(r"\bgpuguard_[a-z_]+", expr)}
    assert used, "no gpuguard metric in the dashboard"
    assert used <= documented, used - documented
