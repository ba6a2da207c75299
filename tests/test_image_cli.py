"""`gpuguard check --image IMAGE` and `--python-env PATH` (issue 24) as a deploy pipeline
runs them: live on the fake NVML reporting other drivers (FAKE_NVML_DRIVER_VERSION,
FAKE_NVML_CUDA_VERSION, FAKE_NVML_BRAND), images on the tests' private Docker engine,
PyTorch environments laid out as pip installs them."""

from __future__ import annotations

import json

import pytest

from tests.conftest import gpuguard
from tests.cuda_images import compat_files, make_image, official_env, pytorch

CUDA_128 = "nvidia/cuda:12.8.1-base-ubuntu22.04"
ONLY = ("--only", "image.*")
DRIVER_545 = {"driver_version": "545.23.08", "cuda_version": 12030}
DRIVER_550 = {"driver_version": "550.54.15", "cuda_version": 12040}


@pytest.fixture(scope="module")
def images(docker_host: str) -> dict[str, str]:
    env = official_env(CUDA_128)
    make_image(docker_host, "gpuguard-test/cli:12.8", env,
               {"maintainer": "NVIDIA CORPORATION <cudatools@nvidia.com>"},
               compat_files("12.8", "570.124.06"))
    make_image(docker_host, "gpuguard-test/cli:12.8-nocompat", env)
    return {"compat": "gpuguard-test/cli:12.8", "nocompat": "gpuguard-test/cli:12.8-nocompat"}


def check(host_args, fake_env, docker_host, *args: str, **nvml: object):
    env = {**fake_env(**nvml), "DOCKER_HOST": docker_host}
    return gpuguard("check", *host_args, *ONLY, *args, env=env)


def as_json(proc):
    assert "Traceback" not in proc.stderr, proc.stderr
    [result] = json.loads(proc.stdout)["results"]
    return result


def test_an_image_that_runs_exits_0_naming_both_versions(host_args, fake_env, docker_host,
                                                        images):
    proc = check(host_args, fake_env, docker_host, "--image", images["compat"])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (f"OK        image.cuda  host   image {images['compat']} needs CUDA 12.8; driver "
            "580.159.04 gives CUDA 13.0") in proc.stdout


def test_a_refused_image_exits_2_with_the_runtimes_words(host_args, fake_env, docker_host,
                                                        images):
    proc = check(host_args, fake_env, docker_host, "--image", images["compat"], "--format",
                 "json", **DRIVER_545)
    assert proc.returncode == 2
    result = as_json(proc)
    assert result["status"] == "critical"
    assert "requirement error: unsatisfied condition: cuda>=12.8" in result["message"]
    assert "driver 545.23.08 gives CUDA 12.3" in result["message"]
    assert "a driver of branch 570 or newer" in result["message"]
    table = check(host_args, fake_env, docker_host, "--image", images["compat"], **DRIVER_545)
    assert table.returncode == 2 and "CRITICAL  image.cuda" in table.stdout
    assert "fix:" in table.stdout and "do:  none" in table.stdout


def test_forward_compatibility_on_a_data_centre_gpu_and_not_on_geforce(
        host_args, fake_env, docker_host, images):
    proc = check(host_args, fake_env, docker_host, "--image", images["compat"], "--format",
                 "json", **DRIVER_550)
    assert proc.returncode == 0, proc.stdout
    assert "forward compatibility serves it (libcuda.so.570.124.06 in the image; GPU 0 " \
           "(nvidia) takes it)" in as_json(proc)["message"]
    # the same image without the package: CUDA 12.8 on a 12.4 driver, minor compatibility
    proc = check(host_args, fake_env, docker_host, "--image", images["nocompat"], **DRIVER_550)
    assert proc.returncode == 1 and "minor version compatibility" in proc.stdout
    # a GeForce is not on the image's list: refused
    proc = check(host_args, fake_env, docker_host, "--image", images["compat"], brand=5,
                 **DRIVER_550)
    assert proc.returncode == 2 and "unsatisfied condition" in proc.stdout


def test_an_image_not_here_is_unknown_exit_3_and_several_are_judged(host_args, fake_env,
                                                                   docker_host, images):
    proc = check(host_args, fake_env, docker_host, "--image", images["compat"], "--image",
                 "gpuguard-test/absent:9", "--format", "json")
    assert proc.returncode == 3
    result = as_json(proc)
    assert [(w["name"], w["status"]) for w in result["observed"]["workloads"]] == [
        (images["compat"], "ok"), ("gpuguard-test/absent:9", "unknown")]
    assert "no such image on this host (gpuguard never pulls one)" in result["message"]


def test_pytorch_is_read_from_its_files_and_judged(host_args, fake_env, tmp_path, docker_host):
    cu130 = pytorch(tmp_path / "cu130", "2.9.0+cu130", "13.0")
    cu128 = pytorch(tmp_path / "cu128", "2.7.0+cu128", "12.8", style="old")
    cpu = pytorch(tmp_path / "cpu", "2.7.0+cpu", None)
    proc = check(host_args, fake_env, docker_host, "--python-env", str(cu130), "--python-env",
                 str(cu128 / "lib" / "python3.11" / "site-packages"), "--python-env", str(cpu),
                 "--format", "json", **DRIVER_550)
    assert proc.returncode == 2
    result = as_json(proc)
    assert [(w["name"], w["status"]) for w in result["observed"]["workloads"]] == [
        (str(cu130), "critical"), (str(cu128 / "lib/python3.11/site-packages"), "warning"),
        (str(cpu), "critical")]
    assert f"PyTorch 2.9.0+cu130 in {cu130} needs CUDA 13.0; driver 550.54.15 gives CUDA " \
           "12.4: CUDA does not initialise" in result["message"]
    proc = check(host_args, fake_env, docker_host, "--python-env", str(cu130))
    assert proc.returncode == 0, proc.stdout


def test_a_python_env_without_pytorch_is_unknown(host_args, fake_env, tmp_path, docker_host):
    (tmp_path / "empty" / "lib" / "python3.11" / "site-packages").mkdir(parents=True)
    proc = check(host_args, fake_env, docker_host, "--python-env", str(tmp_path / "empty"),
                 "--format", "json")
    assert proc.returncode == 3
    assert as_json(proc)["message"] == (f"{tmp_path / 'empty'} cannot be read: no "
                                        f"site-packages with torch under {tmp_path / 'empty'}")


def test_the_snapshot_holds_the_gpus_brand_and_compute_capability(host_args, fake_env):
    proc = gpuguard("snapshot", *host_args, "--no-docker",
                    env=fake_env(brand=5, cc="8.9", **DRIVER_550))
    snap = json.loads(proc.stdout)
    assert (snap["host"]["driver_version"], snap["host"]["cuda_driver_version"]) == \
        ("550.54.15", "12.4")
    assert (snap["gpus"][0]["brand"], snap["gpus"][0]["compute_capability"]) == \
        ("geforce", "8.9")


# -- issue 28, item 4: the requirements as the toolkit reads them ---------------------------


def test_every_nvidia_require_variable_counts_whatever_follows_the_prefix(
        host_args, fake_env, docker_host):
    """The toolkit passes every variable whose name starts with NVIDIA_REQUIRE_ to
    nvidia-container-cli (internal/config/image/cuda_image.go, GetRequirements:
    strings.HasPrefix): NVIDIA_REQUIRE_CUDA.OLD is one. gpuguard read only names of
    letters, digits and underscores, and passed an image the runtime refuses."""
    env = {**official_env(CUDA_128), "NVIDIA_REQUIRE_CUDA.OLD": "cuda>=99.0"}
    make_image(docker_host, "gpuguard-test/cli:dotted-require", env)
    proc = check(host_args, fake_env, docker_host, "--image",
                 "gpuguard-test/cli:dotted-require", "--format", "json")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    result = as_json(proc)
    assert result["status"] == "critical"
    assert "requirement error: unsatisfied condition: cuda>=99.0" in result["message"]
    assert "NVIDIA_REQUIRE_CUDA.OLD" in result["message"]


HUGE = "1" + "0" * 5000  # thousands of digits: past Python's int limit, and the toolkit's


@pytest.mark.parametrize(("variable", "value", "words"), [
    # libnvidia-container's dsl_compare_version: strtoumax overflows (UINTMAX_MAX), -1:
    # "invalid expression", and the container does not start
    ("NVIDIA_REQUIRE_CUDA", f"cuda>={HUGE}.0", "requirement error: invalid expression"),
    ("NVIDIA_REQUIRE_ARCH", f"arch>=9.{HUGE}", "requirement error: invalid expression"),
    # a legacy image: the toolkit's parseMajorMinorVersion (strconv.ParseUint(..., 32)):
    # the hook cannot get the requirements
    ("CUDA_VERSION", f"{HUGE}.0.1", "failed to get requirements"),
])
def test_a_version_the_toolkit_cannot_hold_is_refused_naming_the_variable(
        host_args, fake_env, docker_host, variable, value, words):
    """A version of thousands of digits gave "check failed: ValueError" (Python's limit
    on int conversion) where the toolkit refuses the requirement: critical, naming the
    variable, and exit 2."""
    env = {k: v for k, v in official_env(CUDA_128).items()
           if not (variable == "CUDA_VERSION" and k == "NVIDIA_REQUIRE_CUDA")}
    env[variable] = value
    ref = f"gpuguard-test/cli:huge-{variable.lower().replace('_', '-')}"
    make_image(docker_host, ref, env)
    proc = check(host_args, fake_env, docker_host, "--image", ref, "--format", "json")
    assert "Traceback" not in proc.stderr and "check failed" not in proc.stdout, proc.stdout
    assert proc.returncode == 2, proc.stdout + proc.stderr
    result = as_json(proc)
    assert result["status"] == "critical"
    assert words in result["message"] and variable in result["message"], result["message"]
    assert len(result["message"]) < 2000  # the value is named, not printed whole


def test_a_python_env_given_as_its_lib_python_folder_is_that_environment(
        host_args, fake_env, tmp_path, docker_host):
    """Issue 28, item 8: `--python-env .venv/lib/python3.11`, the parent of
    site-packages, said "no site-packages with torch under" it (exit 3)."""
    venv = pytorch(tmp_path / "venv", "2.7.0+cu128", "12.8")
    lib = venv / "lib" / "python3.11"
    proc = check(host_args, fake_env, docker_host, "--python-env", str(lib), "--format",
                 "json", **DRIVER_550)
    assert proc.returncode == 1, proc.stdout + proc.stderr  # 12.8 on a 12.4 driver: minor
    result = as_json(proc)
    assert f"PyTorch 2.7.0+cu128 in {lib} needs CUDA 12.8" in result["message"]
    # Debian's dist-packages, given the same way
    deb = pytorch(tmp_path / "deb", "2.7.0+cu128", "12.8") / "lib" / "python3.11"
    (deb / "site-packages").rename(deb / "dist-packages")
    proc = check(host_args, fake_env, docker_host, "--python-env", str(deb), **DRIVER_550)
    assert proc.returncode == 1 and "PyTorch 2.7.0+cu128" in proc.stdout, proc.stdout
