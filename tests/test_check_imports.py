"""A cold `check` imports nothing it does not use (issue 27's bench: the GPUs-seen module
pulled in the atomic writer, tempfile and shutil for a file a cold check never writes;
bench/check_before_after.py measured 1.5-3.5 ms of it after NVML had answered)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.conftest import REPO, TEST_BOOT_ID, own_host


def test_a_cold_check_reading_the_gpus_seen_never_imports_the_writer(tmp_path: Path) -> None:
    """A replay with a state dir of its own (no NVML worker: pynvml's ctypes.util would
    bring tempfile and shutil in its forked child, whose imports -X importtime prints too)."""
    host = own_host(tmp_path / "host")
    state = Path(host[9])
    state.mkdir(parents=True, exist_ok=True)
    (state / "gpus-seen.json").write_text(json.dumps({"boot_id": TEST_BOOT_ID, "gpus": []}))
    run = subprocess.run([sys.executable, "-X", "importtime", "-m", "gpuguard", "check",
                          "--input", str(REPO / "tests/fixtures/h200-live/idle-snapshot.json"),
                          "--state-dir", str(state), "--path.procfs", host[1],
                          "--format", "json"], capture_output=True, text=True,
                         cwd=REPO, timeout=60, check=False)
    assert run.returncode in (0, 1, 2, 3), run.stderr[-2000:]
    imported = {line.split("|")[-1].strip() for line in run.stderr.splitlines()
                if line.startswith("import time:")}
    assert "gpuguard.assess.gpus_seen" in imported  # the file was read
    assert not {"gpuguard.io.atomic", "tempfile", "shutil"} & imported, \
        sorted({"gpuguard.io.atomic", "tempfile", "shutil"} & imported)


# What `check` loads only when it must (issue 32): the rule pack's schema machinery (the
# shipped pack comes from rules/compiled-ruleset.json) and the other commands' modules.
NOT_FOR_CHECK = {
    "msgspec", "yaml", "gpuguard.config.schema", "gpuguard.config.shapes",
    "gpuguard.cli.daemon", "gpuguard.cli.slurm", "gpuguard.cli.qualify",
    "gpuguard.cli.history", "gpuguard.cli.rules", "gpuguard.cli.failover",
}


def test_a_cold_check_imports_neither_the_rule_schema_nor_other_commands(tmp_path: Path) -> None:
    host = own_host(tmp_path / "host")
    run = subprocess.run([sys.executable, "-X", "importtime", "-m", "gpuguard", "check",
                          "--input", str(REPO / "tests/fixtures/h200-live/idle-snapshot.json"),
                          "--path.procfs", host[1], "--format", "json"],
                         capture_output=True, text=True, cwd=REPO, timeout=60, check=False)
    assert run.returncode in (0, 1, 2, 3), run.stderr[-2000:]
    imported = {line.split("|")[-1].strip() for line in run.stderr.splitlines()
                if line.startswith("import time:")}
    assert "gpuguard.config.pack_cache" in imported  # the fast path was taken
    assert not NOT_FOR_CHECK & imported, sorted(NOT_FOR_CHECK & imported)
