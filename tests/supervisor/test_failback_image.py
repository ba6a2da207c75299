"""No failback to a GPU variant whose image cannot run (issue 24): the real daemon judges
the supervised service's GPU image every slow cycle (image.cuda), and the supervisor keeps
the service on CPU while that image is refused by this driver; a driver that runs it lets
the failback through. Real containers, a real nginx, the replayed host's driver changed."""

from __future__ import annotations

import json
from typing import Any

import pytest

from gpuguard.config.yamlfile import ConfigError
from gpuguard.model.workload import Workload
from gpuguard.supervisor.config import load_services
from gpuguard.supervisor.workloads import of_services
from tests.cuda_images import make_image, official_env
from tests.daemon.conftest import host_snapshot, write_snapshot
from tests.supervisor.conftest import settled_on, start_supervised, state_of, wait
from tests.supervisor.test_failover import udev_cycle

CUDA_128 = "nvidia/cuda:12.8.1-base-ubuntu22.04"
GPU_IMAGE = "gpuguard-test/llm-gpu:12.8"


def host(driver: str, cuda: str, faulty: bool = False) -> dict[str, Any]:
    """The replayed two-H200 host with this driver (brand NVIDIA, compute 9.0)."""
    snap = host_snapshot(2, {(0, "remapped_rows_failure"): True} if faulty else None)
    snap["host"].update(driver_version=driver, cuda_driver_version=cuda)
    for gpu in snap["gpus"]:
        gpu.update(brand="nvidia", compute_capability="9.0")
    return snap


def image_result(daemon: Any) -> dict[str, Any] | None:
    return daemon.result("image.cuda")


def test_failback_waits_for_a_driver_that_runs_the_gpu_image(start_daemon, service_setup):
    setup = service_setup
    make_image(setup["docker_host"], GPU_IMAGE, official_env(CUDA_128))
    config = setup["write"]()
    doc = json.loads(config.read_text())
    doc["services"][0]["docker"]["gpu"]["image"] = GPU_IMAGE
    config.write_text(json.dumps(doc))
    write_snapshot(setup["snapshot"], host("545.23.08", "12.3"))  # refuses CUDA 12.8
    daemon = start_supervised(start_daemon, setup, config, "--slow-interval", "1",
                              interval="600")
    assert wait(lambda: settled_on(setup, "gpu")), state_of(setup)

    # the daemon judges the supervised GPU image, for its service
    result = daemon.wait_for(lambda: (r := image_result(daemon)) and r["status"] == "critical"
                             and r, what="image.cuda critical")
    assert result["observed"]["service_status"] == {"llm": "critical"}
    assert result["message"].startswith(f"llm (image {GPU_IMAGE}: the NVIDIA container "
                                        "runtime refuses it")

    write_snapshot(setup["snapshot"], host("545.23.08", "12.3", faulty=True))
    for _ in range(3):
        udev_cycle(daemon)
    assert wait(lambda: settled_on(setup, "cpu")), state_of(setup)

    write_snapshot(setup["snapshot"], host("545.23.08", "12.3"))  # the GPUs are fine again
    for _ in range(3):
        udev_cycle(daemon)
    daemon.wait_for(lambda: '"event": "failback_blocked"' in daemon.log.read_text(),
                    what="the failback refused")
    blocked = next(json.loads(line) for line in daemon.log.read_text().splitlines()
                   if '"failback_blocked"' in line)
    assert blocked["reason"].startswith(f"image.cuda: image {GPU_IMAGE}: the NVIDIA container "
                                        "runtime refuses it")
    assert "a driver of branch 570 or newer" in blocked["reason"]
    assert settled_on(setup, "cpu") and state_of(setup)["healthy_cycles"] == 0

    write_snapshot(setup["snapshot"], host("570.124.06", "12.8"))  # a driver that runs it
    udev_cycle(daemon)  # a sweep of it, which the next slow cycle judges the image on
    daemon.wait_for(lambda: (r := image_result(daemon)) and r["status"] == "ok",
                    what="image.cuda ok")
    for _ in range(3):
        udev_cycle(daemon)
    assert wait(lambda: settled_on(setup, "gpu")), state_of(setup)


def test_python_env_belongs_to_exec_and_systemd_services(tmp_path):
    path = tmp_path / "gpuguard.yaml"
    path.write_text(
        "services:\n"
        "  - name: batch\n"
        "    backend: systemd\n"
        "    python_env: /opt/batch/.venv\n"
        "    gpus: [1]\n"
        "    probe: {exec: ['true']}\n"
        "    systemd: {gpu: batch-gpu.service, cpu: batch-cpu.service}\n"
        "  - name: llm\n"
        "    backend: docker\n"
        "    probe: {docker_health: true}\n"
        "    docker:\n"
        "      gpu: {name: llm-gpu, image: 'vllm:1', gpus: [0],\n"
        "            env: {NVIDIA_DISABLE_REQUIRE: '1'}}\n"
        "      cpu: {name: llm-cpu, image: 'vllm-cpu:1'}\n")
    assert of_services(load_services(path)) == (
        Workload("python", "/opt/batch/.venv", "batch", (1,)),
        Workload("image", "vllm:1", "llm", (0,), (("NVIDIA_DISABLE_REQUIRE", "1"),)))
    path.write_text(path.read_text().replace(
        "    probe: {docker_health: true}\n",
        "    probe: {docker_health: true}\n    python_env: /opt/llm\n"))
    with pytest.raises(ConfigError) as caught:
        load_services(path)
    assert str(caught.value) == (f"{path}:11: llm: python_env is for exec and systemd "
                                 "services: a container's Python is in its image, which "
                                 "image.cuda judges")
