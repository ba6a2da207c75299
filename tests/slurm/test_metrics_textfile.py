"""The textfile of `gpuguard slurm health --metrics-file` in Prometheus' text format
(issue 27, item 10): label values escaped as the format says (backslash, double quote,
line feed), UTF-8 kept. Checked by promtool (Prometheus' own parser) and read back with
prometheus_client's parser; the health runs are on the fake Slurm."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.daemon.conftest import host_snapshot, write_snapshot
from tests.slurm.test_slurm_scripts import Fleet

needs_promtool = pytest.mark.skipif(shutil.which("promtool") is None,
                                    reason="needs promtool (Debian: prometheus)")


def promtool(text: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["promtool", "check", "metrics"], input=text, capture_output=True,
                          text=True, timeout=30, check=False)


def node_labels(text: str) -> set[str]:
    return {sample.labels["node"] for family in text_string_to_metric_families(text)
            for sample in family.samples}


@needs_promtool
@pytest.mark.parametrize("name", ["nœud-ü1", 'n"1\\x', "gpu-東京-07"])
def test_promtool_accepts_the_textfile_of_any_node_name(tmp_path: Path, name: str) -> None:
    """A drain on a node named with non-ASCII letters, or with a quote and a backslash:
    the file is valid text format and gives the name back exactly."""
    fleet = Fleet(tmp_path)
    fleet.write([(name, "IDLE", "Unknown", "none")])
    snap = tmp_path / "snap.json"
    write_snapshot(snap, host_snapshot(8, {(0, "remapped_rows_failure"): True}))
    out = fleet.gpuguard("health", "--no-daemon", "--input", str(snap), "--brake-jitter", "0",
                         *fleet.slurm_args(), "--node", name, "--metrics-file",
                         str(tmp_path / "metrics.prom"))
    assert out.returncode == 0 and fleet.node(name)[0] == "IDLE+DRAIN", \
        out.stdout + out.stderr
    text = (tmp_path / "metrics.prom").read_text(encoding="utf-8")
    checked = promtool(text)
    assert checked.returncode == 0, checked.stdout + checked.stderr + text
    assert node_labels(text) == {name}
    assert "\\u" not in text


@needs_promtool
def test_a_line_feed_in_a_label_value_is_escaped() -> None:
    from gpuguard.integrations.slurm import metrics as slurm_metrics

    name = 'a\nb"c\\d'
    text = slurm_metrics.text(slurm_metrics.HealthState(name, drained=True), now=0)
    assert 'gpuguard_slurm_drained{node="a\\nb\\"c\\\\d"} 1\n' in text
    checked = promtool(text)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert node_labels(text) == {name}


def test_a_name_that_is_not_text_is_replaced_never_a_traceback() -> None:
    """Bytes that are not UTF-8 on the command line reach Python as lone surrogates."""
    from gpuguard.integrations.slurm import metrics as slurm_metrics

    text = slurm_metrics.text(slurm_metrics.HealthState("n\udcff1"), now=0)
    assert node_labels(text) == {"n?1"}
    text.encode("utf-8")
