"""An image's CUDA facts through a real, private Docker engine (scripts/dockerd-private.sh),
images made by `docker import` with the official CUDA images' ENV and LABEL values; and the
layer scan on `docker save` streams built here (whiteouts, deadline, size bound)."""

from __future__ import annotations

import io
import json
import tarfile
import time
from collections.abc import Iterator

import pytest

from gpuguard.io.paths import Paths
from gpuguard.model.workload import Workload
from gpuguard.sources import cuda_images
from tests.cuda_images import compat_files, make_image, official_env

CUDA_128 = "nvidia/cuda:12.8.1-base-ubuntu22.04"
CUDA_124 = "nvidia/cuda:12.4.1-base-ubuntu22.04"
LABELS = {"maintainer": "NVIDIA CORPORATION <cudatools@nvidia.com>",
          "com.nvidia.cudnn.version": "9.8.0.87-1"}


def read(monkeypatch, docker_host, tmp_path, *workloads: Workload):
    monkeypatch.setenv("DOCKER_HOST", docker_host)
    return cuda_images.read(list(workloads), Paths(rootfs=tmp_path), 10.0)


def engine_state(docker_host):
    import docker

    client = docker.DockerClient(base_url=docker_host)
    try:
        return (sorted(i.id for i in client.images.list(all=True)),
                sorted(c.id for c in client.containers.list(all=True)))
    finally:
        client.close()


def test_env_and_labels_are_read_and_nothing_is_pulled_or_started(monkeypatch, docker_host,
                                                                  tmp_path):
    env = official_env(CUDA_128)
    image_id = make_image(docker_host, "gpuguard-test/cuda:12.8-plain", env, LABELS)
    before = engine_state(docker_host)
    [entry, missing] = read(monkeypatch, docker_host, tmp_path,
                            Workload("image", "gpuguard-test/cuda:12.8-plain", "llm", (0,),
                                     (("NVIDIA_DISABLE_REQUIRE", "false"),)),
                            Workload("image", "gpuguard-test/absent:1"))
    assert entry["id"] == image_id
    assert entry["env"] == {**env, "NVIDIA_DISABLE_REQUIRE": "false"}  # the service's over it
    assert entry["labels"] == {"com.nvidia.cudnn.version": "9.8.0.87-1"}
    assert (entry["kind"], entry["service"], entry["gpus"]) == ("image", "llm", [0])
    assert missing["error"] == "no such image on this host (gpuguard never pulls one)"
    assert engine_state(docker_host) == before  # no image pulled, no container made


def test_the_compat_library_is_found_in_the_layers(monkeypatch, docker_host, tmp_path):
    make_image(docker_host, "gpuguard-test/cuda:12.8-compat", official_env(CUDA_128), LABELS,
               compat_files("12.8", "570.124.06"))
    [entry] = read(monkeypatch, docker_host, tmp_path,
                   Workload("image", "gpuguard-test/cuda:12.8-compat"))
    assert entry["compat"] == {"found": True, "libcuda": "570.124.06",
                               "path": "/usr/local/cuda-12.8/compat/libcuda.so.570.124.06",
                               "from": "the image's layers"}


def test_layers_without_it_say_so(monkeypatch, docker_host, tmp_path):
    make_image(docker_host, "gpuguard-test/cuda:12.8-nocompat", official_env(CUDA_128))
    [entry] = read(monkeypatch, docker_host, tmp_path,
                   Workload("image", "gpuguard-test/cuda:12.8-nocompat"))
    assert entry["compat"] == {"found": False, "from": "the image's layers"}


def test_the_official_marker_is_taken_without_reading_layers(monkeypatch, docker_host, tmp_path):
    env = official_env(CUDA_124)
    assert env["NV_CUDA_COMPAT_PACKAGE"] == "cuda-compat-12-4"
    make_image(docker_host, "gpuguard-test/cuda:12.4-marker", env)
    monkeypatch.setattr(cuda_images, "scan_layers", None)  # a scan would fail here
    [entry] = read(monkeypatch, docker_host, tmp_path,
                   Workload("image", "gpuguard-test/cuda:12.4-marker"))
    assert entry["compat"] == {"found": True, "package": "cuda-compat-12-4",
                               "from": "the image's NV_CUDA_COMPAT_PACKAGE"}


def test_layers_are_not_read_where_the_package_cannot_matter(monkeypatch, docker_host, tmp_path):
    # no driver branch in its requirement: the runtime refuses it on an older driver,
    # whatever it carries
    make_image(docker_host, "gpuguard-test/cuda:12.8-strict",
               {"CUDA_VERSION": "12.8.1", "NVIDIA_REQUIRE_CUDA": "cuda>=12.8"})
    monkeypatch.setattr(cuda_images, "scan_layers", None)
    [entry] = read(monkeypatch, docker_host, tmp_path,
                   Workload("image", "gpuguard-test/cuda:12.8-strict"))
    assert "compat" not in entry and entry["env"]["NVIDIA_REQUIRE_CUDA"] == "cuda>=12.8"


def test_docker_not_answering_is_an_error_per_image(monkeypatch, tmp_path):
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/gone.sock")
    entries = cuda_images.read([Workload("image", "a:1"), Workload("image", "b:1")],
                               Paths(rootfs=tmp_path), 2.0)
    assert [e["name"] for e in entries] == ["a:1", "b:1"]
    assert all(e["error"] for e in entries)
    monkeypatch.delenv("DOCKER_HOST")
    [entry] = cuda_images.read([Workload("image", "a:1")], Paths(rootfs=tmp_path), 2.0)
    assert "no Docker daemon is configured" in entry["error"]


# --- the layer scan on streams made here ---------------------------------------------------


def layer(*names: str) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name in names:
            info = tarfile.TarInfo(name)
            data = b"x"
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def saved(layers: list[bytes], manifest_first: bool = False) -> bytes:
    """A `docker save` stream: each layer as `<n>/layer.tar`, a config, manifest.json."""
    names = [f"{i:02d}/layer.tar" for i in range(len(layers))]
    members = [(n, data) for n, data in zip(names, layers, strict=True)]
    members.append(("config.json", b'{"architecture": "amd64"}'))
    manifest = ("manifest.json", json.dumps([{"Config": "config.json",
                                              "Layers": names}]).encode())
    members = [manifest, *members] if manifest_first else [*members, manifest]
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def chunks(data: bytes, size: int = 4096) -> Iterator[bytes]:
    for start in range(0, len(data), size):
        yield data[start:start + size]


LIB = "usr/local/cuda-12.8/compat/libcuda.so.570.124.06"


@pytest.mark.parametrize("manifest_first", [False, True])
def test_a_later_layer_that_removes_the_library_removes_it(manifest_first):
    kept = saved([layer("bin/sh", LIB), layer("etc/hosts")], manifest_first)
    assert cuda_images.scan_layers(chunks(kept), 5, 1 << 30)["libcuda"] == "570.124.06"
    removed = saved([layer(LIB), layer("usr/local/cuda-12.8/compat/.wh.libcuda.so.570.124.06")],
                    manifest_first)
    assert cuda_images.scan_layers(chunks(removed), 5, 1 << 30)["found"] is False
    folder = saved([layer(LIB), layer("usr/local/.wh.cuda-12.8")], manifest_first)
    assert cuda_images.scan_layers(chunks(folder), 5, 1 << 30)["found"] is False
    opaque = saved([layer(LIB), layer("usr/local/cuda-12.8/compat/.wh..wh..opq")],
                   manifest_first)
    assert cuda_images.scan_layers(chunks(opaque), 5, 1 << 30)["found"] is False
    again = saved([layer(LIB), layer("usr/local/cuda-12.8/compat/.wh..wh..opq", LIB)],
                  manifest_first)
    assert cuda_images.scan_layers(chunks(again), 5, 1 << 30)["found"] is True


def test_a_stream_that_does_not_end_stops_at_the_deadline():
    def slow() -> Iterator[bytes]:
        data = saved([layer(*(f"f{i}" for i in range(50)))])
        for piece in chunks(data, 512):
            time.sleep(0.05)
            yield piece
    started = time.monotonic()
    found = cuda_images.scan_layers(slow(), 0.3, 1 << 30)
    assert "not read within the deadline" in found["error"]
    assert time.monotonic() - started < 3


def test_an_image_larger_than_the_bound_is_not_read_to_its_end():
    found = cuda_images.scan_layers(chunks(saved([layer(LIB)] * 3)), 5, 8192)
    assert found["error"].startswith("the image is larger than")


def test_a_cut_stream_is_an_error_never_found_false():
    data = saved([layer(LIB, *(f"f{i}" for i in range(20)))])
    found = cuda_images.scan_layers(chunks(data[:3000]), 5, 1 << 30)
    assert "error" in found
    # cut where a member ends: the layers the manifest lists are not all there
    two = saved([layer("etc/hosts"), layer("bin/sh")], manifest_first=True)
    first_layer_end = 512 + 512 + 512 + len(layer("etc/hosts"))  # manifest, then 00/layer.tar
    found = cuda_images.scan_layers(chunks(two[:first_layer_end]), 5, 1 << 30)
    assert found == {"error": "the image's layers came incomplete (the stream ended early)"}
    found = cuda_images.scan_layers(chunks(saved([layer("bin/sh")])[:512 + 10240]), 5, 1 << 30)
    assert "error" in found
