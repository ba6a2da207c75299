"""node-problem-detector never OK on a guess (issue 27, item 8): the real VerdictFiles'
files read by the real plugin under dash. A condition holding an unknown is Unknown even
beside a warning; a site's own rule sets a condition (the real daemon, a rules dir as in
docs/configuration.md); every rule of the pack and a site's lands in a condition or in the
documented exclusions; a file is trusted only while the results in it are fresh by
`gpuguard status`'s rule (two cycles of their cadence)."""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any

import pytest

from gpuguard.config.ruleset import load_ruleset
from gpuguard.daemon.freshness import Freshness
from gpuguard.daemon.verdict_files import CONDITIONS, NOT_A_CONDITION, VerdictFiles
from gpuguard.model.identity import GpuId
from gpuguard.model.results import Result, Status
from tests.conftest import REPO
from tests.daemon.conftest import host_snapshot, start_daemon, write_snapshot
from tests.test_kubernetes import needs_dash, plugin

__all__ = ["start_daemon"]  # the real daemon's fixture, used below

# the example of docs/configuration.md, graded critical, and without a `condition:` key
SITE_RULES = """\
rules:
  - id: site.memory_hot
    scope: gpu
    severity: critical
    summary: GPU hotter than this site allows
    when: "temperature_c > 80 and name == 'NVIDIA H200'"
    message: "$name at $temperature_c C"
    remediation: Check the rack's inlet temperature.
  - id: site.gpu_count
    scope: host
    severity: critical
    summary: this site's nodes have 8 GPUs
    when: "gpu_count < 8"
    message: "$gpu_count GPUs"
  - id: host.site_gpus
    scope: host
    severity: critical
    summary: a site rule in the family of the pack's excluded host rules
    when: "gpu_count < 8"
    message: "$gpu_count GPUs"
"""


def result(rule: str, status: Status, gpu: int | None = 0) -> Result:
    ref = None if gpu is None else GpuId(gpu, f"GPU-{gpu}", f"00000000:{gpu + 0x18:02X}:00.0")
    return Result(rule, status, Status.CRITICAL, f"{rule} is {status.value}", ref)


def write(tmp: Path, results: list[Result], fast: float = 5.0, age: float = 0.0) -> Path:
    """The real VerdictFiles, the results of one fast cycle that ended `age` s ago."""
    npd = tmp / "npd"
    updated = time.monotonic() - age
    VerdictFiles(npd).write([(r, "fast", updated) for r in results],
                            Freshness({"fast": fast, "slow": 60.0}))
    return npd


def written_at(path: Path) -> float:
    """When the daemon wrote the file, on CLOCK_BOOTTIME (its own key, else whole seconds)."""
    keys = dict(line.split("=", 1) for line in path.read_text().splitlines())
    return int(keys["boottime_cs"]) / 100 if "boottime_cs" in keys else int(keys["boottime"])


def run_at(path: Path, after: float, tmp: Path) -> tuple[int, str]:
    """The plugin as NPD runs it, `after` seconds after the file was written."""
    return plugin(path, written_at(path) + after, tmp)


@needs_dash
@pytest.mark.parametrize(("statuses", "code", "named"), [
    # the bug: status=warning was written and the plugin said OK
    ((Status.WARNING, Status.UNKNOWN), 2, "unknown: ecc.b GPU 1"),
    ((Status.UNKNOWN, Status.WARNING, Status.OK), 2, "unknown: thermal.a GPU 0"),
    ((Status.WARNING, Status.UNKNOWN, Status.CRITICAL), 1, "critical: clocks.c GPU 2"),
    ((Status.WARNING, Status.OK, Status.SKIPPED), 0, "warning: thermal.a GPU 0"),
    ((Status.OK, Status.SKIPPED), 0, "ok: 2 result(s) ok"),
])
def test_unknown_is_worse_than_warning_for_npd(tmp_path: Path, statuses: tuple[Status, ...],
                                               code: int, named: str) -> None:
    rules = ("thermal.a", "ecc.b", "clocks.c")[:len(statuses)]
    npd = write(tmp_path, [result(rule, status, i) for i, (rule, status)
                           in enumerate(zip(rules, statuses, strict=True))])
    got, out = run_at(npd / "gpu-hardware", 0.5, tmp_path)
    assert (got, out.startswith(f"gpuguard: {named}")) == (code, True), out
    assert run_at(npd / "gpu-driver", 0.5, tmp_path)[0] == 0  # nothing of it there


@needs_dash
def test_a_site_rules_critical_sets_its_condition(start_daemon: Any, tmp_path: Path) -> None:
    """A real daemon with the site's rules dir, on a host of 2 GPUs whose GPU 1 runs at
    85 C: gpuguard-hardware NonOK naming the site's GPU rule, gpu-driver NonOK for the
    host rules (the site's host.* rule too: only the pack's host rules are left out)."""
    rules = tmp_path / "rules.d"
    rules.mkdir()
    (rules / "site.yaml").write_text(SITE_RULES)
    snap = tmp_path / "hot.json"
    write_snapshot(snap, host_snapshot(2, {(1, "temperature_c"): 85}))
    npd = tmp_path / "npd"
    daemon = start_daemon("--input", str(snap), "--rules", str(rules), "--npd-dir", str(npd),
                          "--fast-interval", "1")
    hardware = npd / "gpu-hardware"
    daemon.wait_for(lambda: daemon.result("site.memory_hot", 1) and hardware.exists(), 20,
                    "a fast cycle with the site's rules")
    before = hardware.read_text()
    # a file written after that cycle (the daemon rewrites each one every cycle)
    daemon.wait_for(lambda: hardware.read_text() != before, 20, "the next verdict files")
    daemon.stop()  # the files as its last cycle left them, read on the tests' clock
    code, out = run_at(npd / "gpu-hardware", 0.1, tmp_path)
    assert code == 1 and "site.memory_hot GPU 1" in out, out
    code, out = run_at(npd / "gpu-driver", 0.1, tmp_path)
    assert code == 1 and re.search(r"critical: (site\.gpu_count|host\.site_gpus) \(\+1 more\)",
                                   out), out
    assert run_at(npd / "gpu-fabric", 0.1, tmp_path)[0] == 0


def test_every_rule_of_the_pack_and_a_sites_lands_in_a_condition_or_a_documented_exclusion(
        tmp_path: Path) -> None:
    rules = tmp_path / "rules.d"
    rules.mkdir()
    (rules / "site.yaml").write_text(SITE_RULES)
    ruleset = load_ruleset([rules])
    excluded = []
    for rule in ruleset.ordered():
        gpu = 0 if rule.scope == "gpu" else None
        npd = write(tmp_path, [result(rule.id, Status.CRITICAL, gpu)])
        critical = [name for name in CONDITIONS
                    if "status=critical\n" in (npd / name).read_text()]
        if not critical:
            excluded.append(rule.id)
        assert len(critical) <= 1, (rule.id, critical)
    # only the pack's host, image and qualify rules, each family with its reason in the docs
    qualify = sorted(r.id for r in ruleset.ordered() if r.id.startswith("qualify."))
    assert len(qualify) >= 11
    assert excluded == ["host.disk", "host.memory", "image.cuda", *qualify], excluded
    docs = (REPO / "docs" / "kubernetes.md").read_text()
    assert {r.split(".")[0] for r in excluded} == set(NOT_A_CONDITION)
    assert "`host.*`" in docs and "`image.cuda`" in docs and "`qualify.*`" in docs
    for name, families in CONDITIONS.items():
        row = next(line for line in docs.splitlines() if line.startswith(f"| `{name}` |"))
        assert row.split("|")[3].split("(")[0].strip() == ", ".join(families), row


@needs_dash
@pytest.mark.parametrize(("fast", "age", "fresh_at", "stale_at"), [
    (4.0, 6.0, 1.0, 2.5),  # written 1.5 fast cycles after the last one: 2 s left
    (0.5, 0.0, 0.2, 1.2),  # two cycles of 0.5 s are one second, not ten
])
def test_a_file_is_trusted_only_while_its_results_are_fresh(
        tmp_path: Path, fast: float, age: float, fresh_at: float, stale_at: float) -> None:
    """`gpuguard status` calls a result unknown past two cycles of its cadence; the plugin
    said OK for two fast cycles after the write (and never under 10 s)."""
    npd = write(tmp_path, [result("thermal.margin", Status.OK)], fast=fast, age=age)
    assert run_at(npd / "gpu-hardware", fresh_at, tmp_path)[0] == 0
    code, out = run_at(npd / "gpu-hardware", stale_at, tmp_path)
    assert code == 2 and "stale" in out, out


@needs_dash
@pytest.mark.parametrize("keys", ["boottime_cs=soon\nmax_age_cs=150\n", "boottime_cs=100050\n",
                                  "max_age_cs=-1\nboottime_cs=100050\n"])
def test_a_malformed_centisecond_key_is_unknown(tmp_path: Path, keys: str) -> None:
    path = tmp_path / "gpu-hardware"
    path.write_text(f"status=ok\nmessage=ok: fine\nboottime=1000\nmax_age_s=9\n{keys}")
    code, out = plugin(path, 1000.6, tmp_path)
    assert code == 2 and "unreadable verdict" in out, out
