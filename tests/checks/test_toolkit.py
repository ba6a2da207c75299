"""toolkit.parity on fixture trees; toolkit.docker against a real, private Docker engine."""

import json
import os

import pytest

from gpuguard.io.paths import Paths
from gpuguard.model.profile import Profile
from gpuguard.model.results import Status
from gpuguard.model.snapshot import Reading
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
    from gpuguard.judge.engine import evaluate

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


# -- spec details and Docker's answer (scripts/mutate_rules.py survivors) ----------------

def spec_host(h200, **spec):
    h200.host.cdi_specs = Reading.ok([{"path": "/etc/cdi/nvidia.yaml",
                                       "versions": ["580.159.04"], "missing_host_paths": [],
                                       "kind": "nvidia.com/gpu", "devices": ["0", "all"],
                                       **spec}])
    h200.host.container_cli = Reading.not_supported("no nvidia-container-cli")
    h200.host.ctk_version = Reading.not_supported("no nvidia-ctk")
    h200.host.gpu_count = Reading.ok(1)
    h200.host.__post_init__()
    return h200


def test_gpus_in_a_spec_are_counted_by_index_else_by_uuid(h200, run_rule):
    # nvidia-ctk lists each GPU by index and by UUID, plus "all"
    for devices, count in ((["0", "1", "all", "GPU-a", "GPU-b"], 2),
                           (["GPU-a", "GPU-b", "all"], 2), ([7, "GPU-a", None], 1)):
        spec_host(h200, devices=devices)
        h200.host.gpu_count = Reading.ok(count)
        h200.host.__post_init__()
        [result] = run_rule("toolkit.parity", h200)
        assert result.status is Status.OK, (devices, result.message)
    h200.host.gpu_count = Reading.ok(3)
    h200.host.__post_init__()
    [result] = run_rule("toolkit.parity", h200)
    assert "lists 1 GPU(s), the driver sees 3" in result.message


def test_missing_host_paths_show_three_and_count_the_rest(h200, run_rule):
    paths = [f"/usr/lib/lib{i}.so" for i in range(5)]
    for n, tail in ((3, ""), (4, " and 1 more"), (5, " and 2 more")):
        [result] = run_rule("toolkit.parity", spec_host(h200, missing_host_paths=paths[:n]))
        assert result.status is Status.CRITICAL
        assert result.message == ("/etc/cdi/nvidia.yaml: host paths missing: /usr/lib/lib0.so, "
                                  f"/usr/lib/lib1.so, /usr/lib/lib2.so{tail}")


def test_only_gpu_specs_are_counted_and_the_ok_message_names_what_was_seen(h200, run_rule):
    [result] = run_rule("toolkit.parity", spec_host(h200, kind="nvidia.com/imex", devices=[]))
    assert result.status is Status.OK
    assert result.message == "1 CDI spec(s) match driver 580.159.04"
    # what was not there is said, not left blank
    assert "no nvidia-container-cli" in result.observed["container_cli"]


def docker_facts(h200, **info):
    h200.host.docker = Reading.ok({"host": "unix:///x", "reachable": True, "runtimes": ["runc"],
                                   "default_runtime": "runc", "server_version": "27.0", **info})
    h200.host.probe_image = Reading.not_supported("not asked")
    h200.host.__post_init__()
    return h200


def test_docker_message_names_runtimes_and_the_nvidia_default(h200, run_rule):
    [result] = run_rule("toolkit.docker", docker_facts(h200, runtimes=["runc", "nvidia"]))
    assert result.message == "Docker 27.0 answers; runtimes: runc, nvidia; default: runc"
    [result] = run_rule("toolkit.docker", docker_facts(h200, runtimes=None))
    assert result.message == "Docker 27.0 answers; runtimes: none; default: runc"
    [result] = run_rule("toolkit.docker", docker_facts(h200, default_runtime="nvidia"))
    assert result.message.endswith("default: nvidia (every container gets GPUs, even without "
                                   "--gpus)")


def test_required_docker_that_is_not_configured_fails(h200, run_rule):
    h200.host.docker = Reading.not_supported("no Docker daemon configured")
    h200.host.__post_init__()
    assert run_rule("toolkit.docker", h200)[0].status is Status.SKIPPED
    [result] = run_rule("toolkit.docker", h200, Profile(docker_required=True))
    assert result.status is Status.CRITICAL
    assert result.message == "the profile requires Docker, and no daemon is configured"


def test_probe_that_sees_no_driver_says_nothing(h200, run_rule):
    docker_facts(h200)
    h200.host.probe_image = Reading.ok({"image": "cuda:13", "ok": True, "driver_versions": []})
    h200.host.__post_init__()
    [result] = run_rule("toolkit.docker", h200)
    assert result.status is Status.CRITICAL
    assert "nvidia-smi reports driver nothing, the host runs 580.159.04" in result.message


def test_a_probe_asked_for_without_docker_is_unknown_not_skipped(h200, run_rule):
    h200.host.docker = Reading.not_supported("no Docker daemon configured (no DOCKER_HOST)")
    h200.host.probe_image = Reading.not_supported("no Docker daemon configured")
    h200.host.__post_init__()
    [result] = run_rule("toolkit.docker", h200)
    assert result.status is Status.UNKNOWN
    assert result.message.startswith("--probe-image asked for a GPU container, but no Docker")
    h200.host.probe_image = Reading()  # not asked: nothing to compare, skipped
    h200.host.__post_init__()
    assert run_rule("toolkit.docker", h200)[0].status is Status.SKIPPED


def test_a_probe_asked_for_without_docker_names_the_reason_or_says_none_is_configured(
        h200, run_rule):
    """Docker's own reason when the source gave one, else a plain one: never "None"."""
    h200.host.docker = Reading.not_supported()
    h200.host.probe_image = Reading.not_supported("no Docker daemon configured")
    h200.host.__post_init__()
    [result] = run_rule("toolkit.docker", h200)
    assert result.status is Status.UNKNOWN
    assert result.message == ("--probe-image asked for a GPU container, but no Docker daemon "
                              "is configured")
    h200.host.docker = Reading.not_supported("DOCKER_HOST is not set")
    h200.host.__post_init__()
    [result] = run_rule("toolkit.docker", h200)
    assert result.message == "--probe-image asked for a GPU container, but DOCKER_HOST is not set"
