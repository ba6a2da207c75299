"""image.cuda on the real H200 recording (driver 580.159.04, CUDA 13.0, brand NVIDIA) with
the `workloads` reading set as its source writes it (gpuguard/sources/workloads.py; the
source itself against a real Docker engine: tests/sources/test_cuda_images.py; the
command line: tests/test_image_cli.py)."""

from __future__ import annotations

import json
from typing import Any

from gpuguard.model.results import Status
from gpuguard.model.snapshot import Reading
from tests.conftest import FIXTURES, set_gpu, with_gpus

OFFICIAL = {i["image"]: i for i in json.loads(
    (FIXTURES / "cuda-images" / "official-images.json").read_text())["images"]}
CUDA_128 = "nvidia/cuda:12.8.1-base-ubuntu22.04"
CUDA_130 = "nvidia/cuda:13.0.0-base-ubuntu24.04"


def image(name: str, service: str | None = None, **extra: Any) -> dict[str, Any]:
    found = OFFICIAL[name]
    return {"kind": "image", "name": name, "service": service, "gpus": None,
            "env": dict(found["env"]), "labels": {},
            "compat": {"found": True, "package": found["compat_package"],
                       "from": "the image's history"}, **extra}


def judged(run_rule, snapshot, *entries: dict[str, Any], driver: str | None = None,
           cuda: str | None = None):
    if driver is not None:
        snapshot.host.driver_version = Reading.ok(driver)
    if cuda is not None:
        snapshot.host.cuda_driver_version = Reading.ok(cuda)
    snapshot.host.workloads = Reading.ok(list(entries))
    snapshot.host.__post_init__()
    [result] = run_rule("image.cuda", snapshot)
    return result


def test_nothing_asked_for_is_skipped(run_rule, h200):
    [result] = run_rule("image.cuda", h200)
    assert result.status is Status.SKIPPED and "--image" in result.message
    h200.host.workloads = Reading.ok([])
    assert run_rule("image.cuda", h200)[0].status is Status.SKIPPED


def test_the_h200_runs_every_official_image(run_rule, h200):
    assert h200.gpus[0].brand.get() == "nvidia"  # from the recording's product_brand
    result = judged(run_rule, h200, *(image(name) for name in OFFICIAL))
    assert result.status is Status.OK, result.message
    assert len(result.observed["workloads"]) == len(OFFICIAL)
    assert result.observed["driver_version"] == "580.159.04"


def test_a_driver_the_image_does_not_list_is_critical_naming_versions_and_fix(run_rule, h200):
    result = judged(run_rule, h200, image(CUDA_128), driver="545.23.08", cuda="12.3")
    assert result.status is Status.CRITICAL
    assert "unsatisfied condition: cuda>=12.8" in result.message
    assert "it needs CUDA 12.8, driver 545.23.08 gives CUDA 12.3" in result.message
    assert "a driver of branch 570 or newer" in result.message
    assert result.action == "none" and result.remediation


def test_the_worst_workload_decides_and_comes_first(run_rule, h200):
    result = judged(run_rule, h200, image(CUDA_128),
                    {"kind": "image", "name": "gone:1", "service": None, "error": "no such image"},
                    driver="545.23.08", cuda="12.3")
    assert result.status is Status.CRITICAL
    assert result.message.startswith("image nvidia/cuda:12.8.1")
    assert result.message.endswith("image gone:1 cannot be read: no such image")
    statuses = [w["status"] for w in result.observed["workloads"]]
    assert statuses == ["critical", "unknown"]


def test_an_image_that_cannot_be_read_is_unknown(run_rule, h200):
    result = judged(run_rule, h200, {"kind": "image", "name": "gone:1", "service": None,
                                     "error": "no such image on this host"})
    assert result.status is Status.UNKNOWN
    assert result.message == "image gone:1 cannot be read: no such image on this host"


def test_each_service_gets_its_own_status(run_rule, h200):
    h200 = with_gpus(h200, ["00000000:18:00.0", "00000000:2A:00.0"])
    result = judged(run_rule, h200, image(CUDA_128, "llm"), image(CUDA_130, "embed"),
                    image(CUDA_130, "llm"), driver="570.124.06", cuda="12.8")
    # 13.0 lists the 570 branch and carries its compat package: both run
    assert result.status is Status.OK
    assert result.observed["service_status"] == {"llm": "ok", "embed": "ok"}
    result = judged(run_rule, h200, image(CUDA_128, "llm"), image(CUDA_130, "embed"),
                    driver="560.35.03", cuda="12.6")
    # 13.0 does not list 560: refused for embed only; 12.8 lists it (forward compatible)
    assert result.observed["service_status"] == {"llm": "ok", "embed": "critical"}
    assert result.status is Status.CRITICAL
    assert "refuses it" in result.observed["services"]["embed"]["message"]
    assert result.message.startswith("embed (image nvidia/cuda:13.0.0")


def test_the_worst_of_a_services_workloads_is_its_status(run_rule, h200):
    result = judged(run_rule, h200, image(CUDA_128, "llm"), image(CUDA_130, "llm"),
                    driver="560.35.03", cuda="12.6")
    assert result.observed["service_status"] == {"llm": "critical"}
    assert CUDA_130 in result.observed["services"]["llm"]["message"]
    # two alike: the first one given names it (the supervisor logs that one)
    result = judged(run_rule, h200, image(CUDA_128, "llm"), image(CUDA_130, "llm"),
                    driver="545.23.08", cuda="12.3")
    assert result.observed["services"]["llm"]["message"].startswith(f"image {CUDA_128}:")


def test_a_driver_that_reports_no_version_is_unknown_never_judged(run_rule, h200):
    result = judged(run_rule, h200, image(CUDA_128), driver="580.xx", cuda="13.0")
    assert result.status is Status.UNKNOWN and "not versions to compare" in result.message
    result = judged(run_rule, h200, image(CUDA_128), driver="580.159.04", cuda="N/A")
    assert result.status is Status.UNKNOWN


def test_an_unread_driver_version_is_unknown(run_rule, h200):
    h200.host.driver_version = Reading.failed("nvmlSystemGetDriverVersion: Unknown Error")
    result = judged(run_rule, h200, image(CUDA_128))
    assert result.status is Status.UNKNOWN and "driver_version" in result.message


def test_a_brand_or_capability_that_is_not_one_is_not_known(run_rule, h200):
    # a replay's odd brand is never read as another: forward compatibility is then unknown
    set_gpu(h200, 0, brand="Tesla K80", compute_capability="9.x")
    result = judged(run_rule, h200, image(CUDA_128), driver="550.54.15", cuda="12.4")
    assert result.status is Status.UNKNOWN and "brand" in result.message
    # not needed when the driver is new enough
    assert judged(run_rule, h200, image(CUDA_128), driver="580.159.04",
                  cuda="13.0").status is Status.OK


def test_an_arch_requirement_reads_the_compute_capability(run_rule, h200):
    entry = image(CUDA_128)
    entry["env"]["NVIDIA_REQUIRE_ARCH"] = "arch>=9.0"
    set_gpu(h200, 0, compute_capability="9.0")
    assert judged(run_rule, h200, entry).status is Status.OK
    set_gpu(h200, 0, compute_capability="8.9")
    result = judged(run_rule, h200, entry)
    assert result.status is Status.CRITICAL and "arch>=9.0" in result.message
    set_gpu(h200, 0, compute_capability="9.x")
    assert judged(run_rule, h200, entry).status is Status.UNKNOWN


def test_pytorch_environments(run_rule, h200):
    entry = {"kind": "python", "name": "/opt/llm/.venv", "service": "llm", "gpus": None,
             "torch_version": "2.9.0+cu130", "cuda": "13.0"}
    assert judged(run_rule, h200, entry).status is Status.OK
    result = judged(run_rule, h200, entry, driver="550.54.15", cuda="12.4")
    assert result.status is Status.CRITICAL
    assert result.message.startswith("llm (PyTorch 2.9.0+cu130 in /opt/llm/.venv needs CUDA 13.0")
