"""Shared fixtures: the real H200 dump, a snapshot made from it, rule runs, the CLI, fake NVML."""

from __future__ import annotations

import copy
import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from gpuguard.engine import evaluate
from gpuguard.profile import Profile
from gpuguard.results import Result
from gpuguard.ruleset import RuleSet, load_ruleset
from gpuguard.snapshot import Reading, Snapshot
from gpuguard.sources import nvidia_smi_xml

REPO = Path(__file__).resolve().parent.parent
FIXTURES = Path(__file__).resolve().parent / "fixtures"
H200_XML = FIXTURES / "h200" / "nvidia-smi-q.xml"


@pytest.fixture(scope="session")
def h200_base() -> Snapshot:
    return nvidia_smi_xml.parse(H200_XML.read_text(), str(H200_XML))


@pytest.fixture
def h200(h200_base: Snapshot) -> Snapshot:
    """A fresh copy of the real H200 snapshot for a test to change."""
    return copy.deepcopy(h200_base)


@pytest.fixture(scope="session")
def default_rules() -> RuleSet:
    return load_ruleset()


def set_gpu(snapshot: Snapshot, index: int = 0, **values: Any) -> Snapshot:
    """Change readings of one GPU; a Reading is used as is, anything else becomes ok(value)."""
    gpu = snapshot.gpus[index]
    for name, value in values.items():
        if not hasattr(gpu, name):
            raise AttributeError(name)
        setattr(gpu, name, value if isinstance(value, Reading) else Reading.ok(value))
    gpu.__post_init__()
    return snapshot


RunRule = Callable[..., list[Result]]


@pytest.fixture
def run_rule(default_rules: RuleSet) -> RunRule:
    def run(rule_id: str, snapshot: Snapshot, profile: Profile | None = None,
            rules: RuleSet | None = None) -> list[Result]:
        results = evaluate(snapshot, rules or default_rules, profile or Profile(), only=[rule_id])
        assert results, f"rule {rule_id} produced no result"
        return results

    return run


def gpuguard(*args: str, env: dict[str, str] | None = None, timeout: float = 60,
             input_text: str | None = None) -> subprocess.CompletedProcess[str]:
    """Run the real command line in a child process, as a user or a unit would."""
    full_env = {**os.environ, "NO_COLOR": "1", **(env or {})}
    return subprocess.run([sys.executable, "-m", "gpuguard", *args], capture_output=True,
                          text=True, env=full_env, timeout=timeout, cwd=REPO, input=input_text,
                          check=False)


@pytest.fixture(scope="session")
def fake_nvml(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Build tests/fake_nvml/fake_nvml.c into a folder holding libnvidia-ml.so.1."""
    cc = shutil.which("cc") or shutil.which("gcc")
    assert cc, "a C compiler is needed to build the fake NVML library (see README)"
    out = tmp_path_factory.mktemp("fake_nvml")
    subprocess.run([cc, "-shared", "-fPIC", "-O1", "-Wall", "-Werror", "-o",
                    str(out / "libnvidia-ml.so.1"), str(REPO / "tests/fake_nvml/fake_nvml.c")],
                   check=True)
    return out


@pytest.fixture
def fake_env(fake_nvml: Path) -> Iterator[Callable[..., dict[str, str]]]:
    def make(**switches: str | int) -> dict[str, str]:
        env = {"LD_LIBRARY_PATH": str(fake_nvml)}
        env.update({f"FAKE_NVML_{k.upper()}": str(v) for k, v in switches.items()})
        return env

    yield make
