"""The profile is checked whole against its declared shape (gpuguard.config.shapes): an
unknown key or a wrong type at any depth, its `rules:` overrides included, is
`file:line: what is wrong` from load_profile itself, and exit 3 from `gpuguard check`."""

from __future__ import annotations

import subprocess
import sys
import typing
from pathlib import Path

import pytest

from gpuguard.config.profile import load_profile
from gpuguard.config.yamlfile import ConfigError
from tests.conftest import FIXTURES, REPO


def profile_at(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "profile.yaml"
    path.write_text(text)
    return path


@pytest.mark.parametrize(("text", "line", "problem"), [
    # an unknown key at each depth
    ("driver:\n  min_versoin: '570'\n", 2,
     "driver.min_versoin: unknown key (allowed: min_cuda_version, min_version)"),
    ("vbios:\n  allow: {}\n", 2, "vbios.allow: unknown key (allowed: allowed)"),
    ("rules:\n  pcie.replays:\n    treshold: {max_replays: 5}\n", 3,
     "rules['pcie.replays'].treshold: unknown key (allowed: action, enabled, remediation, "
     "severity, thresholds)"),
    # a wrong type at each depth, on the line of its own key
    ("gpu_count: -1\n", 1, "gpu_count must be a whole number >= 0, not -1"),
    ("driver:\n  min_version: '570.86.15'\n  min_cuda_version: 12.10\n", 3,
     'driver: min_cuda_version must be a quoted version such as "570.86.15", not 12.1'),
    ("vbios:\n  allowed:\n    NVIDIA H100: ['96.00.1']\n    NVIDIA H200: \"96.00\"\n", 4,
     "vbios.allowed['NVIDIA H200'] must be a list of quoted versions, not '96.00'"),
    ("vbios:\n  allowed:\n    NVIDIA H200: ['96.00.A5', 96.01]\n", 3,
     "vbios.allowed['NVIDIA H200'][1] must be a quoted VBIOS version"),
    ("docker: yes\n", 1, "docker must be one of `optional`, `required`, not True"),
    ("ecc:\n", 1, "ecc must be one of `disabled`, `enabled`, not None"),
    ("xid_window: 2\n", 1, "xid_window must be `boot` or a span such as 90s"),
    ("rules:\n  pcie.replays: {enabled: maybe}\n", 2,
     "rules['pcie.replays']: enabled must be true or false, not 'maybe'"),
    ("rules:\n  pcie.replays:\n    thresholds:\n      max_replays: {at: 5}\n", 4,
     "rules['pcie.replays'].thresholds['max_replays'] must be a number, text, true or false,"),
    ("rules:\n  pcie.replays:\n    severity: fatal\n", 3,
     "rules['pcie.replays']: severity must be one of `critical`, `warning`, not 'fatal'"),
    # what spans more than a type stays in code, with its line
    ("xid_window: 2 hours\n", 1, "xid window must be `boot` or a span"),
    ("xid_window: infh\n", 1, "xid window must be `boot` or a span"),  # float('inf')
    ("xid_window: nanm\n", 1, "xid window must be `boot` or a span"),
    ("driver:\n  min_version: '570.x'\n", 2, "driver: min_version: '570.x' is not a dotted"),
    # issue 11's keys
    ("nvlink_links_per_gpu: -2\n", 1, "nvlink_links_per_gpu must be a whole number >= 0"),
    ("p2p:\n  require_nvlnk: true\n", 2, "p2p.require_nvlnk: unknown key"),
    ("mig: maybe\n", 1, "mig must be one of `disabled`, `enabled`, not 'maybe'"),
    # issue 21's keys
    ("uvm: yes\n", 1, "uvm must be one of `auto`, `required`, not True"),
    ("gpudirect_rdma: peermem\n", 1, "gpudirect_rdma must be true or false, not 'peermem'"),
])
def test_a_bad_profile_is_file_line_and_what(tmp_path, text, line, problem):
    path = profile_at(tmp_path, text)
    with pytest.raises(ConfigError) as caught:
        load_profile(path)
    assert caught.value.line == line, str(caught.value)
    assert caught.value.problem.startswith(problem), str(caught.value)
    assert str(caught.value).startswith(f"{path}:{line}: ")


def test_every_field_of_a_good_profile(tmp_path):
    profile = load_profile(profile_at(tmp_path, """
gpu_count: 8
driver: {min_version: "570.86.15", min_cuda_version: "12.8"}
vbios:
  allowed:
    NVIDIA H200: ["96.00.a5.00.1a", "96.00.A5.00.1B"]
ecc: off
xid_window: 2h
docker: required
nvlink_links_per_gpu: 18
p2p: {require_nvlink: true}
mig: disabled
uvm: required
gpudirect_rdma: true
rules:
  pcie.replays: {thresholds: {max_replays: 5}}
"""))
    assert profile.gpu_count == 8
    assert (profile.driver_min_version, profile.cuda_min_version) == ("570.86.15", "12.8")
    assert profile.vbios_allowed == {"NVIDIA H200": ["96.00.A5.00.1A", "96.00.A5.00.1B"]}
    assert profile.ecc_expected is False  # YAML's `off` is the boolean false
    assert profile.xid_window_s == 7200
    assert profile.docker_required is True
    assert profile.rule_overrides is not None
    assert profile.rule_overrides.line_of("pcie.replays") == 16
    assert profile.nvlink_links_per_gpu == 18 and profile.p2p_require_nvlink is True
    assert profile.mig_expected is False
    assert profile.uvm_required is True and profile.gpudirect_rdma is True


def test_an_empty_profile_expects_nothing(tmp_path):
    profile = load_profile(profile_at(tmp_path, "# nothing yet\n"))
    assert profile.gpu_count is None and profile.ecc_expected is None
    assert profile.docker_required is False and profile.rule_overrides is None
    assert profile.nvlink_links_per_gpu is None and profile.p2p_require_nvlink is False
    assert profile.mig_expected is None
    assert profile.uvm_required is False and profile.gpudirect_rdma is False
    assert load_profile(profile_at(tmp_path, "uvm: auto\n")).uvm_required is False


def test_the_choices_are_the_ones_the_code_knows():
    """The Literals of the shapes and the tables the code grades with say the same."""
    from gpuguard.config.shapes import Severity, XidAction
    from gpuguard.judge.xids import ACTION_WORDS
    from gpuguard.model.results import SEVERITIES

    assert set(typing.get_args(Severity)) == {s.value for s in SEVERITIES}
    assert set(typing.get_args(XidAction)) == set(ACTION_WORDS)


def test_check_with_a_misspelled_override_in_the_profile_exits_3(tmp_path):
    path = profile_at(tmp_path, "gpu_count: 1\nrules:\n  pcie.replays:\n"
                                "    treshold: {max_replays: 5}\n")
    proc = subprocess.run(
        [sys.executable, "-m", "gpuguard", "check", "--profile", str(path),
         "--input", str(FIXTURES / "h200-live" / "idle-snapshot.json")],
        capture_output=True, text=True, cwd=REPO, timeout=60, check=False)
    assert proc.returncode == 3, proc.stderr[-500:]
    assert f"{path}:4: rules['pcie.replays'].treshold: unknown key" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_importing_the_profile_model_does_not_load_msgspec():
    """engine and the checks import gpuguard.config.profile; msgspec loads with the first file."""
    code = "import sys, gpuguard.config.profile; print('msgspec' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=REPO, timeout=60, check=True).stdout
    assert out.strip() == "False"
