"""toolkit.parity on fixture trees; toolkit.docker against a real, private Docker engine."""

import json
import os

import pytest

from gpuguard.paths import Paths
from gpuguard.profile import Profile
from gpuguard.results import Status
from gpuguard.snapshot import Reading
from gpuguard.sources.host import HostOptions, collect_host
from tests.conftest import FIXTURES, H200_XML, gpuguard, with_gpus

BUSES = ["00000000:00:06.0", "00000000:07:00.0"]


def toolkit_host(h200, monkeypatch, rootfs, bin_dir=None):
    path = os.environ["PATH"] if bin_dir is None else f"{FIXTURES / bin_dir}:{os.environ['PATH']}"
    monkeypatch.setenv("PATH", path)
    monkeypatch.delenv("DOCKER_HOST", raising=False)
    snap = with_gpus(h200, BUSES)
    collect_host(snap, HostOptions(paths=Paths(rootfs=FIXTURES / rootfs), kernel_log=False,
                                   procfs=False, sysfs=False))
    return snap


def test_current_spec_and_cli_agree(h200, run_rule, monkeypatch):
    snap = toolkit_host(h200, monkeypatch, "rootfs-cdi-current", "toolkit-bin-current")
    [result] = run_rule("toolkit.parity", snap)
    assert result.status is Status.OK, result.message
    assert "1 CDI spec(s) and nvidia-container-cli and nvidia-ctk 1.17.8" in result.message


def test_stale_spec_after_a_driver_upgrade(h200, run_rule, monkeypatch):
    snap = toolkit_host(h200, monkeypatch, "rootfs-cdi-stale")
    [result] = run_rule("toolkit.parity", snap)
    assert result.status is Status.CRITICAL
    assert "/var/run/cdi/nvidia.yaml still names driver 570.133.20 (running 580.159.04)" \
        in result.message
    assert "host paths missing: /usr/lib/x86_64-linux-gnu/libcuda.so.570.133.20" \
        in result.message


def test_spec_listing_another_gpu_count(h200, run_rule, monkeypatch):
    snap = toolkit_host(h200, monkeypatch, "rootfs-cdi-current")
    snap.host.gpu_count = Reading.ok(8)
    snap.host.__post_init__()
    [result] = run_rule("toolkit.parity", snap)
    assert "/etc/cdi/nvidia.yaml lists 2 GPU(s), the driver sees 8" in result.message


def test_cli_of_the_old_driver(h200, run_rule, monkeypatch):
    snap = toolkit_host(h200, monkeypatch, "nowhere", "toolkit-bin-stale")
    [result] = run_rule("toolkit.parity", snap)
    assert result.status is Status.CRITICAL
    assert "nvidia-container-cli sees NVRM 570.133.20, the host runs 580.159.04" in result.message
    assert "CUDA 12.8" in result.message


def test_spec_that_is_not_yaml_is_unknown_and_named(h200, run_rule, monkeypatch, default_rules):
    from gpuguard.engine import evaluate

    snap = toolkit_host(h200, monkeypatch, "rootfs-cdi-bad")
    [result] = run_rule("toolkit.parity", snap)
    assert result.status is Status.UNKNOWN
    assert "/etc/cdi/broken.yaml:" in result.message and "not a CDI spec" in result.message
    # the other checks still run
    results = evaluate(snap, default_rules, Profile())
    assert {r.rule for r in results} == set(default_rules.rules)


def test_no_toolkit_is_skipped(h200, run_rule, monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    snap = with_gpus(h200, BUSES)
    collect_host(snap, HostOptions(paths=Paths(rootfs=tmp_path), kernel_log=False,
                                   procfs=False, sysfs=False))
    assert run_rule("toolkit.parity", snap)[0].status is Status.SKIPPED
    assert run_rule("toolkit.docker", snap)[0].status is Status.SKIPPED


# --- a real Docker engine ------------------------------------------------------------


def check_json(*args, env):
    proc = gpuguard("check", "--input", str(H200_XML), "--format", "json", *args, env=env)
    assert "Traceback" not in proc.stderr, proc.stderr
    doc = json.loads(proc.stdout)
    return {r["rule"]: r for r in doc["results"]}


def test_docker_runtimes_are_reported(docker_host, tmp_path):
    results = check_json("--path.rootfs", str(tmp_path), "--docker",
                         env={"DOCKER_HOST": docker_host})
    docker = results["toolkit.docker"]
    assert docker["status"] == "ok", docker["message"]
    assert "nvidia" in docker["observed"]["docker"]["runtimes"]
    assert "default: runc" in docker["message"]


def test_docker_down_is_a_warning_or_critical_when_required(tmp_path):
    gone = f"unix://{tmp_path}/no-daemon.sock"
    results = check_json("--path.rootfs", str(tmp_path), "--docker", env={"DOCKER_HOST": gone})
    assert results["toolkit.docker"]["status"] == "warning"
    assert "does not answer" in results["toolkit.docker"]["message"]
    profile = tmp_path / "profile.yaml"
    profile.write_text("docker: required\n")
    results = check_json("--path.rootfs", str(tmp_path), "--profile", str(profile),
                         env={"DOCKER_HOST": gone})
    assert results["toolkit.docker"]["status"] == "critical"


def test_probe_image_without_a_gpu_runtime_fails_and_leaves_nothing(docker_host, busybox_image,
                                                                   tmp_path):
    import docker

    results = check_json("--path.rootfs", str(tmp_path), "--probe-image", busybox_image,
                         env={"DOCKER_HOST": docker_host})
    probe = results["toolkit.docker"]
    assert probe["status"] == "critical"
    assert f"a GPU container from {busybox_image} did not run" in probe["message"]
    assert "could not select device driver" in probe["message"]
    client = docker.DockerClient(base_url=docker_host)
    try:
        assert client.containers.list(all=True, filters={"label": "io.gpuguard.probe"}) == []
    finally:
        client.close()


def test_check_leaves_docker_alone_unless_asked(docker_host, tmp_path):
    results = check_json("--path.rootfs", str(tmp_path), env={"DOCKER_HOST": docker_host})
    assert results["toolkit.docker"]["status"] == "skipped"
    assert "--docker" in results["toolkit.docker"]["message"]
    # `docker: required` in the profile turns it on (auto)
    profile = tmp_path / "profile.yaml"
    profile.write_text("docker: required\n")
    results = check_json("--path.rootfs", str(tmp_path), "--profile", str(profile),
                         env={"DOCKER_HOST": docker_host})
    assert results["toolkit.docker"]["status"] == "ok"


@pytest.mark.parametrize(("seen", "status"), [(["580.159.04"], Status.OK),
                                              (["570.133.20"], Status.CRITICAL)])
def test_probe_result_is_compared_with_the_host(h200, run_rule, seen, status):
    h200.host.docker = Reading.ok({"host": "unix:///x", "reachable": True, "runtimes": ["runc"],
                                   "default_runtime": "runc", "server_version": "27.0"})
    h200.host.probe_image = Reading.ok({"image": "cuda:13", "ok": True, "driver_versions": seen})
    h200.host.__post_init__()
    [result] = run_rule("toolkit.docker", h200)
    assert result.status is status
