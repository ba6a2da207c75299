"""Shared fixtures: the real H200 dump, a snapshot made from it, rule runs, the CLI, fake NVML."""

from __future__ import annotations

import atexit
import contextlib
import copy
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from gpuguard.config.ruleset import load_ruleset
from gpuguard.io.paths import FORBID_ENV
from gpuguard.judge.engine import evaluate
from gpuguard.model.profile import Profile
from gpuguard.model.results import Result
from gpuguard.model.rule import RuleSet
from gpuguard.model.snapshot import Reading, Snapshot
from gpuguard.sources import nvidia_smi_xml

REPO = Path(__file__).resolve().parent.parent
FIXTURES = Path(__file__).resolve().parent / "fixtures"
H200_XML = FIXTURES / "h200" / "nvidia-smi-q.xml"

# The host is not an input (gpuguard/io/paths.py): gpuguard refuses every default host path,
# in this process and in every command a test runs (exit 4 naming the path), so a test
# that forgot its own --kmsg-file, --path.*, --state-dir or --no-udev fails on every
# machine, not only on one whose kernel log happens to hold an Xid. /etc/gpuguard is
# replaced by an empty folder: every test sees a host without a site configuration (the
# tests that need one pass --profile, --rules or --config). scripts/test.sh may already
# have set the switch (its second pass points the default kernel log at a file of Xids).
_OWN = Path(tempfile.mkdtemp(prefix="gpuguard-tests-host-"))
EMPTY_ETC = _OWN / "etc-gpuguard"
EMPTY_ETC.mkdir()
# The boot the tests' commands run in, unless a test gives its own --path.procfs.
TEST_BOOT_ID = "7e570000-0000-4000-8000-000000000001"
(_OWN / "boot_id").write_text(TEST_BOOT_ID + "\n")
_switch = os.environ.get(FORBID_ENV, "") or "1"
if "etc=" not in _switch:
    _switch += f",etc={EMPTY_ETC}"
if "boot_id=" not in _switch:
    _switch += f",boot_id={_OWN / 'boot_id'}"
os.environ[FORBID_ENV] = _switch
atexit.register(shutil.rmtree, _OWN, True)



@contextlib.contextmanager
def mounted_tmpfs(mnt: Path, options: str, read_only: bool = False) -> Iterator[Path]:
    """A tmpfs of the test's own at `mnt` (made here; `options` such as "size=1m"),
    unmounted whatever happens: the host keeps no mount (scripts/hostguard.py checks)."""
    mnt.mkdir(parents=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", options, "gpuguard-test", str(mnt)],
                   check=True)
    try:
        if read_only:
            subprocess.run(["mount", "-o", "remount,ro", str(mnt)], check=True)
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)

def own_host(root: Path, boot_id: str = TEST_BOOT_ID, kmsg: str = "") -> list[str]:
    """A host of the test's own for a live `check` or `daemon` (NVML is the fake): a procfs
    with nothing but its boot id, an empty sysfs and root filesystem, a kernel log with
    `kmsg` in it, a state dir. Options in the form the command line takes."""
    proc = root / "proc"
    (proc / "sys" / "kernel" / "random").mkdir(parents=True, exist_ok=True)
    (proc / "sys" / "kernel" / "random" / "boot_id").write_text(boot_id + "\n")
    (root / "sys").mkdir(exist_ok=True)
    (root / "rootfs").mkdir(exist_ok=True)
    (root / "kmsg.log").write_text(kmsg)
    return ["--path.procfs", str(proc), "--path.sysfs", str(root / "sys"),
            "--path.rootfs", str(root / "rootfs"), "--kmsg-file", str(root / "kmsg.log"),
            "--state-dir", str(root / "state")]


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "live(needs): reads the real host (it says what it needs in `needs`); "
        "the host guard is lifted for it, and it skips, saying why, where that is absent")


def live_env(**extra: str) -> dict[str, str]:
    """The environment of a live test's command: the host guard lifted, on purpose."""
    env = {k: v for k, v in os.environ.items() if k != FORBID_ENV}
    env.update(extra)
    return env


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


def overridden(tmp_path: Path, rule_id: str, **thresholds: Any) -> RuleSet:
    """The default pack with some of one rule's thresholds overridden, as a user would."""
    rules = tmp_path / "rules.d"
    rules.mkdir(exist_ok=True)
    values = ", ".join(f"{k}: {v}" for k, v in thresholds.items())
    (rules / f"{rule_id}.yaml").write_text(
        f"overrides:\n  {rule_id}: {{thresholds: {{{values}}}}}\n")
    return load_ruleset([rules])


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


@pytest.fixture(scope="session")
def fake_cuda(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """tests/fake_cuda/fake_cuda.c built into a folder holding libcuda.so.1 (the active
    probe's tests)."""
    cc = shutil.which("cc") or shutil.which("gcc")
    assert cc, "a C compiler is needed to build the fake libcuda (see README)"
    out = tmp_path_factory.mktemp("fake_cuda")
    subprocess.run([cc, "-shared", "-fPIC", "-O1", "-Wall", "-Werror", "-o",
                    str(out / "libcuda.so.1"), str(REPO / "tests/fake_cuda/fake_cuda.c")],
                   check=True)
    return out


@pytest.fixture
def host_args(tmp_path: Path) -> list[str]:
    """own_host() for this test: the options of a live run on the fake NVML."""
    return own_host(tmp_path / "own-host")


@pytest.fixture
def fake_env(fake_nvml: Path) -> Iterator[Callable[..., dict[str, str]]]:
    def make(**switches: str | int) -> dict[str, str]:
        env = {"LD_LIBRARY_PATH": str(fake_nvml)}
        env.update({f"FAKE_NVML_{k.upper()}": str(v) for k, v in switches.items()})
        return env

    yield make


def _probe_value(raw: Any, convert: Callable[[Any], Any] = lambda v: v) -> Any:
    """A value of nvml-probe.json in snapshot JSON form (errors were kept as '<NVMLError_...>')."""
    if isinstance(raw, str) and raw.startswith("<NVMLError_NotSupported"):
        return {"state": "not_supported"}
    if isinstance(raw, str) and raw.startswith("<"):
        return {"state": "error", "error": raw}
    return convert(raw)


def _struct_field(text: str, name: str) -> int:
    import re

    match = re.search(rf"\b{name}: (\d+)", text)
    assert match, (name, text)
    return int(match.group(1))


def snapshot_from_probe(probe: dict[str, Any]) -> dict[str, Any]:
    host = probe["host"]
    gpus = []
    for g in probe["gpus"]:
        rows = g["remapped_rows"]
        gpus.append({
            "index": g["index"], "name": g["name"], "uuid": g["uuid"], "serial": g["serial"],
            "pci_bus_id": g["pci_bus_id"], "vbios_version": g["vbios"],
            "inforom_image_version": g["inforom_image"],
            "persistence_mode": bool(g["persistence_mode"]),
            "mig_mode_current": bool(g["mig_mode"][0]), "mig_mode_pending": bool(g["mig_mode"][1]),
            "ecc_mode_current": bool(g["ecc_mode"][0]), "ecc_mode_pending": bool(g["ecc_mode"][1]),
            "ecc_volatile_corrected": g["ecc_volatile_corrected"],
            "ecc_volatile_uncorrected": g["ecc_volatile_uncorrected"],
            "ecc_aggregate_corrected": g["ecc_aggregate_corrected"],
            "ecc_aggregate_uncorrected": g["ecc_aggregate_uncorrected"],
            "retired_pages_pending": _probe_value(g["retired_pages_pending"]),
            "retired_pages_dbe": _probe_value(g["retired_pages_dbe"], len),
            "retired_pages_sbe": _probe_value(g["retired_pages_dbe"], len),
            "remapped_rows_correctable": rows[0], "remapped_rows_uncorrectable": rows[1],
            "remapped_rows_pending": bool(rows[2]), "remapped_rows_failure": bool(rows[3]),
            "pcie_link_gen_current": g["pcie_link_gen_curr"],
            "pcie_link_gen_max": g["pcie_link_gen_max"],
            "pcie_link_width_current": g["pcie_link_width_curr"],
            "pcie_link_width_max": g["pcie_link_width_max"],
            "pcie_replay_counter": g["pcie_replay_counter"],
            "temperature_c": g["temperature"], "temperature_slowdown_c": g["temp_slowdown"],
            "temperature_shutdown_c": g["temp_shutdown"],
            "temperature_gpu_max_c": g["temp_gpu_max"],
            "power_draw_w": g["power_usage_mw"] / 1000,
            "power_limit_enforced_w": g["power_enforced_mw"] / 1000,
            "power_limit_default_w": g["power_default_mw"] / 1000,
            "clock_event_reasons": int(g["clock_event_reasons"], 16),
            "clock_sm_mhz": g["clock_sm"], "clock_mem_mhz": g["clock_mem"],
            "clock_sm_max_mhz": g["clock_sm_max"], "clock_mem_max_mhz": g["clock_mem_max"],
            "utilization_gpu_percent": _struct_field(g["utilization"], "gpu"),
            "utilization_memory_percent": _struct_field(g["utilization"], "memory"),
            "memory_total_bytes": _struct_field(g["memory"], "total"),
            # the probe used nvmlDeviceGetMemoryInfo v1, whose "used" includes the reservation
            "memory_used_bytes": _struct_field(g["memory"], "used"),
            "compute_processes": [],
        })
    return {
        "kind": "gpuguard-snapshot", "schema": 1,
        "host": {"hostname": "h200-probe", "collected_at": 0.0, "source": "nvml",
                 "driver_version": host["driver_version"], "nvml_version": host["nvml_version"],
                 "cuda_driver_version": f"{host['cuda_driver_version'] // 1000}."
                                        f"{host['cuda_driver_version'] % 1000 // 10}",
                 "gpu_count": host["device_count"]},
        "nvml": {"elapsed_s": probe["timings_ms"]["full_sweep_runs"][0] / 1000, "deadline_s": 9.0},
        "gpus": gpus,
    }


@pytest.fixture
def h200_from_probe(tmp_path: Path) -> Path:
    """The recorded NVML probe of the real H200 as a gpuguard snapshot file."""
    import json

    probe = json.loads((FIXTURES / "h200" / "nvml-probe.json").read_text())
    path = tmp_path / "h200-probe-snapshot.json"
    path.write_text(json.dumps(snapshot_from_probe(probe)))
    return path


def with_gpus(snapshot: Snapshot, bus_ids: list[str]) -> Snapshot:
    """Copies of the snapshot's first GPU at other PCI addresses (an n-GPU host)."""
    base = snapshot.gpus[0]
    snapshot.gpus = []
    for index, bus in enumerate(bus_ids):
        gpu = copy.deepcopy(base)
        gpu.index = index
        gpu.pci_bus_id = Reading.ok(bus)
        gpu.uuid = Reading.ok(f"GPU-00000000-0000-0000-0000-{index:012d}")
        gpu.__post_init__()
        snapshot.gpus.append(gpu)
    snapshot.host.gpu_count = Reading.ok(len(bus_ids))
    snapshot.host.__post_init__()
    return snapshot


@pytest.fixture(scope="session")
def docker_host(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A real, private Docker engine (scripts/dockerd-private.sh), stopped at the end."""
    if shutil.which("dockerd") is None:
        pytest.fail("dockerd is missing: ./scripts/test.sh installs Debian's docker.io")
    state = tmp_path_factory.mktemp("dockerd")
    script = REPO / "scripts" / "dockerd-private.sh"
    started = subprocess.run([str(script), "start", str(state)], capture_output=True, text=True,
                             check=False)
    assert started.returncode == 0, started.stderr
    try:
        yield started.stdout.strip()
    finally:
        subprocess.run([str(script), "stop", str(state)], check=False)


@pytest.fixture(scope="session")
def busybox_image(docker_host: str, tmp_path_factory: pytest.TempPathFactory) -> str:
    """An image made with `docker import` from a root filesystem of busybox-static."""
    import io
    import tarfile

    import docker

    busybox = shutil.which("busybox")
    if busybox is None:
        pytest.fail("busybox is missing: ./scripts/test.sh installs Debian's busybox-static")
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        tar.add(busybox, arcname="bin/busybox")
        for applet in ("sh", "echo", "cat", "sleep", "httpd", "wget", "mkdir"):
            link = tarfile.TarInfo(f"bin/{applet}")
            link.type = tarfile.SYMTYPE
            link.linkname = "busybox"
            tar.addfile(link)
    client = docker.DockerClient(base_url=docker_host)
    try:
        client.api.import_image_from_data(buf.getvalue(), repository="gpuguard-test/busybox",
                                          tag="1")
    finally:
        client.close()
    return "gpuguard-test/busybox:1"
