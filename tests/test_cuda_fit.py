"""Whether a workload's CUDA runs on a host (gpuguard/model/cuda_fit.py), on the real
values of NVIDIA's official CUDA images (tests/fixtures/cuda-images: CUDA_VERSION,
NVIDIA_REQUIRE_CUDA and the compat package of each base image, from the images'
Dockerfiles in gitlab.com/nvidia/container-images/cuda) against drivers of long-term and
short-lived branches and GPUs of each kind."""

from __future__ import annotations

import json
from typing import Any

import pytest

from gpuguard.model.cuda_fit import Gpu, Host, judge, needed_cuda
from gpuguard.model.results import Status
from tests.conftest import FIXTURES

OFFICIAL = json.loads((FIXTURES / "cuda-images" / "official-images.json").read_text())
IMAGES = {i["image"].removeprefix("nvidia/cuda:").split("-base")[0]: i
          for i in OFFICIAL["images"] if "ubuntu22.04" in i["image"]}

H200 = Gpu(0, "nvidia", "9.0")  # what the H200 reports: brand NVIDIA (14), compute 9.0
TESLA = Gpu(0, "tesla", "8.0")
GEFORCE = Gpu(0, "geforce", "8.9")
QUADRO = Gpu(0, "quadro", "8.6")


def official(version: str, compat: bool = True) -> dict[str, Any]:
    """The image as gpuguard's source reports it: its environment, and the compat package
    its history installs (every official base image installs one)."""
    image = IMAGES[version]
    entry: dict[str, Any] = {"kind": "image", "name": image["image"], "env": dict(image["env"])}
    if not compat:
        entry["env"].pop("NV_CUDA_COMPAT_PACKAGE", None)
    entry["compat"] = ({"found": True, "package": image["compat_package"],
                        "from": "the image's history"} if compat
                       else {"found": False, "from": "the image's layers"})
    return entry


def host(driver: str, cuda: str, *gpus: Gpu) -> Host:
    return Host(driver, cuda, gpus or (H200,))


K, C, U = "ok", "critical", "unknown"
VERSIONS = ("11.8.0", "12.0.1", "12.1.1", "12.2.2", "12.3.2", "12.4.1", "12.5.1", "12.6.3",
            "12.8.1", "12.9.1", "13.0.0")
# (driver, its CUDA, GPU) -> the verdict for each official image, in VERSIONS' order
TABLE = {
    # the H200 test host: everything runs
    ("580.159.04", "13.0", H200): (K, K, K, K, K, K, K, K, K, K, K),
    # 535 is a long-term branch every image since 12.3 lists: forward compatibility
    ("535.230.02", "12.2", H200): (K, K, K, K, K, K, K, K, K, K, K),
    # 545 is short-lived: no image lists it, and the runtime refuses what needs more
    ("545.23.08", "12.3", H200): (K, K, K, K, K, C, C, C, C, C, C),
    # 550, long-term: listed from 12.5 on (12.4's own branch; 12.3 and 12.4 list 470-535)
    ("550.54.15", "12.4", H200): (K, K, K, K, K, K, K, K, K, K, K),
    # 570 gives 12.8; 12.9 and 13.0 list it
    ("570.124.06", "12.8", H200): (K, K, K, K, K, K, K, K, K, K, K),
    # 525 gives 12.0: listed by 12.1 to 12.4 only
    ("525.147.05", "12.0", H200): (K, K, K, K, K, K, C, C, C, C, C),
    # a Tesla board is a data-centre GPU like the H200
    ("535.230.02", "12.2", TESLA): (K, K, K, K, K, K, K, K, K, K, K),
    # GeForce: the images up to 12.4 list it, and CUDA then refuses forward
    # compatibility on it (804); later images do not list it: the runtime refuses them
    ("535.230.02", "12.2", GEFORCE): (K, K, K, K, C, C, C, C, C, C, C),
    ("550.54.15", "12.4", GEFORCE): (K, K, K, K, K, K, C, C, C, C, C),
    # Quadro is listed, and takes forward compatibility only on some SKUs
    ("535.230.02", "12.2", QUADRO): (K, K, K, K, U, U, U, U, U, U, U),
}


@pytest.mark.parametrize("case", list(TABLE), ids=lambda c: f"{c[0]}-{c[2].brand}")
def test_the_official_images_on_each_driver_and_gpu(case):
    driver, cuda, gpu = case
    got = tuple(judge(official(v), host(driver, cuda, gpu)).status.value for v in VERSIONS)
    assert dict(zip(VERSIONS, got, strict=True)) == \
        dict(zip(VERSIONS, TABLE[case], strict=True))


def test_ok_names_what_it_needs_and_what_the_driver_gives():
    fit = judge(official("12.8.1"), host("580.159.04", "13.0"))
    assert fit.message == ("image nvidia/cuda:12.8.1-base-ubuntu22.04 needs CUDA 12.8; "
                           "driver 580.159.04 gives CUDA 13.0")


def test_forward_compatibility_says_what_serves_it():
    fit = judge(official("13.0.0"), host("535.230.02", "12.2"))
    assert fit.status is Status.OK
    assert "forward compatibility serves it (cuda-compat-13-0 in the image; GPU 0 (nvidia) " \
           "takes it)" in fit.message


def test_a_refusal_names_the_runtimes_words_the_versions_and_the_fix():
    fit = judge(official("12.8.1"), host("545.23.08", "12.3"))
    assert fit.status is Status.CRITICAL
    assert fit.message == (
        "image nvidia/cuda:12.8.1-base-ubuntu22.04: the NVIDIA container runtime refuses it "
        "on GPU 0 (requirement error: unsatisfied condition: cuda>=12.8, please update your "
        "driver to a newer version, or use an earlier cuda container; from "
        "NVIDIA_REQUIRE_CUDA); it needs CUDA 12.8, "
        "driver 545.23.08 gives CUDA 12.3; to run it: install a driver of branch 570 or "
        "newer, or use a build of image nvidia/cuda:12.8.1-base-ubuntu22.04 for CUDA 12.3 "
        "or older")


def test_without_the_compat_package_cuda_does_not_initialise_across_majors():
    # the runtime lets 13.0 in on the 550 branch (it is listed), but the image carries no
    # compat package: CUDA 13 on a CUDA 12 driver does not start
    fit = judge(official("13.0.0", compat=False), host("550.54.15", "12.4"))
    assert fit.status is Status.CRITICAL
    assert "CUDA does not initialise" in fit.message and "branch 580 or newer" in fit.message


def test_without_the_compat_package_a_newer_minor_runs_only_by_minor_compatibility():
    fit = judge(official("12.8.1", compat=False), host("550.54.15", "12.4"))
    assert fit.status is Status.WARNING
    assert "minor version compatibility" in fit.message


def test_a_compat_package_not_newer_than_the_driver_is_not_used():
    # the toolkit uses the compat library only when its driver is newer than the host's
    entry = official("12.8.1")
    entry["compat"] = {"found": True, "libcuda": "550.54.15", "from": "the image's layers"}
    assert judge(entry, host("550.54.15", "12.4")).status is Status.WARNING


def test_the_compat_package_in_the_layers_names_its_library():
    entry = official("12.8.1")
    entry["compat"] = {"found": True, "libcuda": "570.124.06", "from": "the image's layers",
                       "path": "/usr/local/cuda-12.8/compat/libcuda.so.570.124.06"}
    fit = judge(entry, host("550.54.15", "12.4"))
    assert fit.status is Status.OK and "libcuda.so.570.124.06 in the image" in fit.message


def test_layers_that_could_not_be_read_make_forward_compatibility_unknown():
    entry = official("12.8.1")
    entry["compat"] = {"error": "the image's layers were not read within the deadline"}
    fit = judge(entry, host("550.54.15", "12.4"))
    assert fit.status is Status.UNKNOWN and "not read within the deadline" in fit.message
    # not needed: the driver is new enough
    assert judge(entry, host("580.159.04", "13.0")).status is Status.OK


def test_forward_compatibility_serves_only_the_branches_the_image_lists():
    # the runtime's check turned off lets the image in on 545; its compat package does
    # not serve 545 (no branch the image lists): minor version compatibility only
    entry = official("12.8.1")
    entry["env"]["NVIDIA_DISABLE_REQUIRE"] = "1"
    assert judge(entry, host("545.23.08", "12.3")).status is Status.WARNING
    assert judge(entry, host("550.54.15", "12.4")).status is Status.OK  # listed


def test_requirements_turned_off_are_judged_by_what_cuda_needs():
    entry = official("12.8.1", compat=False)
    entry["env"]["NVIDIA_DISABLE_REQUIRE"] = "1"
    assert judge(entry, host("545.23.08", "12.3")).status is Status.WARNING  # not refused
    entry13 = official("13.0.0", compat=False)
    entry13["env"]["NVIDIA_DISABLE_REQUIRE"] = "true"
    assert judge(entry13, host("545.23.08", "12.3")).status is Status.CRITICAL


def test_a_brand_the_toolkit_names_differently_by_release_is_unknown():
    # only "nvidia" (no "unknown"): libnvidia-container as read names the H200's brand
    # "Unknown", releases that name it "nvidia" accept it
    entry = {"kind": "image", "name": "x", "env": {
        "CUDA_VERSION": "12.8.1",
        "NVIDIA_REQUIRE_CUDA": "cuda>=12.8 brand=nvidia,driver>=550,driver<551"}}
    fit = judge(entry, host("550.54.15", "12.4"))
    assert fit.status is Status.UNKNOWN and "container toolkit's release" in fit.message
    # a Tesla board has the same name in both
    tesla = {**entry, "env": {**entry["env"], "NVIDIA_REQUIRE_CUDA":
                              "cuda>=12.8 brand=tesla,driver>=550,driver<551"}}
    assert judge(tesla, host("550.54.15", "12.4", TESLA)).status is not Status.UNKNOWN


def test_an_image_without_the_compute_capability_cannot_run_cuda():
    entry = official("12.8.1")
    entry["env"]["NVIDIA_DRIVER_CAPABILITIES"] = "utility"
    fit = judge(entry, host("580.159.04", "13.0"))
    assert fit.status is Status.CRITICAL
    assert "NVIDIA_DRIVER_CAPABILITIES=utility gives it no compute capability" in fit.message
    entry["env"]["NVIDIA_DRIVER_CAPABILITIES"] = "compute,utilty"
    fit = judge(entry, host("580.159.04", "13.0"))
    assert fit.status is Status.CRITICAL and "unsupported capabilities" in fit.message
    entry["env"]["NVIDIA_DRIVER_CAPABILITIES"] = "all"
    assert judge(entry, host("580.159.04", "13.0")).status is Status.OK
    del entry["env"]["NVIDIA_DRIVER_CAPABILITIES"]  # unset: compute,utility
    assert judge(entry, host("580.159.04", "13.0")).status is Status.OK
    # an image that says nothing of CUDA (nvidia-smi only, say) is not judged for it
    plain = {"kind": "image", "name": "tools", "env": {"NVIDIA_DRIVER_CAPABILITIES": "utility"}}
    assert judge(plain, host("580.159.04", "13.0")).status is Status.UNKNOWN


def test_an_image_that_declares_no_cuda_is_unknown():
    fit = judge({"kind": "image", "name": "busybox", "env": {}}, host("580.159.04", "13.0"))
    assert fit.status is Status.UNKNOWN and "declares no CUDA version" in fit.message


def test_an_image_that_cannot_be_read_is_unknown():
    fit = judge({"kind": "image", "name": "gone:1", "error": "no such image on this host"},
                host("580.159.04", "13.0"))
    assert (fit.status, fit.message) == (
        Status.UNKNOWN, "image gone:1 cannot be read: no such image on this host")


def test_the_gpus_it_is_given_are_the_ones_judged():
    entry = {**official("12.8.1"), "gpus": [1]}
    two = host("535.230.02", "12.2", H200, Gpu(1, "geforce", "8.9"))
    assert judge(entry, two).status is Status.CRITICAL  # GPU 1, a GeForce, is not listed
    assert judge({**entry, "gpus": [0]}, two).status is Status.OK
    assert judge({**entry, "gpus": [5]}, two).status is Status.UNKNOWN


def test_the_cuda_version_it_needs():
    assert needed_cuda(official("12.8.1")) == (12, 8)
    assert needed_cuda({"env": {"NVIDIA_REQUIRE_CUDA": "cuda>=11.8"}}) == (11, 8)
    assert needed_cuda({"env": {}, "labels": {"com.nvidia.cuda.version": "9.0.176"}}) == (9, 0)


# --- PyTorch ------------------------------------------------------------------------------


def torch(version: str, cuda: str | None) -> dict[str, Any]:
    return {"kind": "python", "name": "/opt/llm/.venv", "torch_version": version, "cuda": cuda}


@pytest.mark.parametrize("build, cuda, driver, driver_cuda, status", [
    ("2.7.0+cu128", "12.8", "580.159.04", "13.0", Status.OK),
    ("2.7.0+cu128", "12.8", "570.124.06", "12.8", Status.OK),
    ("2.7.0+cu128", "12.8", "550.54.15", "12.4", Status.WARNING),   # minor compatibility
    ("2.9.0+cu130", "13.0", "550.54.15", "12.4", Status.CRITICAL),  # another major
    ("2.7.0+cpu", None, "580.159.04", "13.0", Status.CRITICAL),     # no CUDA at all
])
def test_pytorch_is_judged_by_the_cuda_it_was_built_for(build, cuda, driver, driver_cuda,
                                                        status):
    assert judge(torch(build, cuda), host(driver, driver_cuda)).status is status


def test_pytorch_messages():
    fit = judge(torch("2.9.0+cu130", "13.0"), host("550.54.15", "12.4"))
    assert fit.message == (
        "PyTorch 2.9.0+cu130 in /opt/llm/.venv needs CUDA 13.0; driver 550.54.15 gives CUDA "
        "12.4: CUDA does not initialise (\"CUDA driver version is insufficient for CUDA "
        "runtime version\"); to run it: install a driver of branch 580 or newer, or use a "
        "PyTorch wheel built for CUDA 12.4 or older (cu124)")
    missing = judge({"kind": "python", "name": "/srv/env"}, host("580.159.04", "13.0"))
    assert missing.status is Status.UNKNOWN and "no PyTorch found" in missing.message


def test_values_of_thousands_of_digits_are_judged_not_a_python_error():
    """Issue 28, item 4: Python refuses to convert numbers of more than 4,300 digits; an
    image's values reached int() (the compat package's name, the CUDA version it needs)
    and the check failed with ValueError. A compat package of no real version is none."""
    huge = "1" + "0" * 5000
    entry = official("12.8.1")
    entry["compat"] = {"found": True, "package": f"cuda-compat-{huge}-8", "from": "history"}
    fit = judge(entry, host("550.54.15", "12.4"))
    assert fit.status is Status.WARNING and "minor version compatibility" in fit.message
    entry = official("12.8.1")
    entry["env"]["CUDA_VERSION"] = f"12.{huge}"  # NVIDIA_REQUIRE_CUDA set: not legacy
    assert needed_cuda(entry) == (12, 8)  # the requirement's cuda>=12.8 then
