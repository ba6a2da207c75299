"""scripts/mutate_rules.py works: it makes real mutants, the family's tests kill them, tests
that do not look at the code let them survive, and the working tree is left as it was."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SCRIPT = REPO / "scripts" / "mutate_rules.py"
MODULE = REPO / "gpuguard" / "checks" / "recovery.py"


def mutate(tmp_path: Path, *args: str) -> tuple[subprocess.CompletedProcess[str], dict]:
    out = tmp_path / "mutants.json"
    done = subprocess.run([sys.executable, str(SCRIPT), "--modules", "recovery", "--kinds",
                           "compare", "--out", str(out), *args], cwd=REPO, capture_output=True,
                          text=True, timeout=120, check=False)
    return done, json.loads(out.read_text())


def test_the_family_tests_kill_the_mutants_and_the_module_is_left_alone(tmp_path):
    before = MODULE.read_bytes()
    done, report = mutate(tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    # recovery.action compares the driver's answer twice: == "none" and == "drain_p2p".
    mutants = report["mutants"]
    assert [(m["kind"], m["line"]) for m in mutants] == [
        ("compare", line) for line in sorted(
            n for n, text in enumerate(before.decode().splitlines(), 1) if "needed ==" in text)]
    assert len(mutants) == 2
    assert all(m["outcome"] == "killed" for m in mutants), mutants
    assert report["modules"]["recovery"] == {"mutants": 2, "killed": 2, "survived": 0,
                                             "equivalent": 0}
    assert MODULE.read_bytes() == before


def test_tests_that_do_not_look_let_the_mutants_survive(tmp_path):
    # power.limit's tests never run recovery.action: every mutant of it passes them.
    done, report = mutate(tmp_path, "--tests", "tests/checks/test_power.py")
    assert done.returncode == 1, done.stdout + done.stderr
    assert [m["outcome"] for m in report["survivors"]] == ["survived", "survived"]
    assert "needed != 'none'" in done.stdout
    assert "recovery" in done.stdout and "0.0%" in done.stdout


def test_the_new_families_of_issue_21_kill_their_mutants(tmp_path):
    """gsp.firmware's compare and status mutants (a sample of the run over xid, sxid, gsp and
    devices in docs/testing.md): every one killed by tests/checks/test_gsp.py."""
    out = tmp_path / "gsp.json"
    done = subprocess.run([sys.executable, str(SCRIPT), "--modules", "gsp", "--kinds", "compare",
                           "status", "--out", str(out)], cwd=REPO, capture_output=True,
                          text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads(out.read_text())
    assert report["modules"]["gsp"]["mutants"] >= 5
    assert report["modules"]["gsp"]["survived"] == 0


def test_the_qualify_family_of_issue_29_kills_its_mutants(tmp_path):
    """qualify.*'s compare and threshold mutants (a sample of the full run in
    docs/testing.md): every one killed by tests/checks/test_qualify.py, the thresholds by
    its overrides."""
    out = tmp_path / "qualify.json"
    done = subprocess.run([sys.executable, str(SCRIPT), "--modules", "qualify", "--kinds",
                           "compare", "threshold", "--out", str(out)], cwd=REPO,
                          capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads(out.read_text())
    assert report["modules"]["qualify"]["mutants"] >= 40
    assert report["modules"]["qualify"]["survived"] == 0
    assert {m["kind"] for m in report["mutants"]} == {"compare", "threshold"}
