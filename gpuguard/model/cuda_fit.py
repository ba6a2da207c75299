"""Whether one workload's CUDA can run on this host's driver and GPUs (issue 24): a
container image (its NVIDIA_REQUIRE_* as the container toolkit judges them, then whether
CUDA initialises) or the PyTorch of a Python environment. image.cuda judges each with
`judge` (gpuguard/checks/image.py); docs/image-cuda.md says what and from where.

The order, for an image:
1. the container runtime's checks (gpuguard.model.cuda_require): its driver capabilities
   (without `compute` CUDA has no driver library: critical) and its requirements (refused
   is critical, naming the condition the runtime names);
2. the CUDA version it needs against the one the driver gives: as new or newer is ok;
3. older: forward compatibility (CUDA Compatibility, "Forward Compatibility") when the
   image carries the compat package, its driver is newer than the host's (the toolkit
   uses it only then), the host's branch is one the image's requirement lists, and the
   GPUs take it (data-centre brands; consumer boards refuse it, others depend on the SKU);
4. else the same major version: it starts by minor version compatibility, with limits
   (a warning); another major version: CUDA does not initialise (critical).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from gpuguard.model import cuda_compat, cuda_require
from gpuguard.model.cuda_compat import major_minor, shown
from gpuguard.model.results import Status

_REQUIRED_CUDA = re.compile(r"(?:^|\s)cuda>=(\d+\.\d+)")
# at most 9 digits a part: an image's value of thousands of digits names no package
_COMPAT_PACKAGE = re.compile(r"cuda-compat-(\d{1,9})-(\d{1,9})(?!\d)")


@dataclass(frozen=True)
class Gpu:
    index: int
    brand: str | None  # the brand word (gpuguard.model.cuda_compat.NVML_BRANDS); None: unread
    arch: str | None  # the compute capability, "9.0"; None: unread


@dataclass(frozen=True)
class Host:
    driver: str
    cuda: str
    gpus: tuple[Gpu, ...]


@dataclass(frozen=True)
class Fit:
    status: Status
    message: str


def judge(entry: dict[str, Any], host: Host) -> Fit:
    """One workload of the snapshot's `workloads` reading against the host."""
    what = _what(entry)
    if entry.get("error"):
        return Fit(Status.UNKNOWN, f"{what} cannot be read: {entry['error']}")
    wanted = entry.get("gpus")
    known = {g.index: g for g in host.gpus}
    missing = [i for i in wanted or () if i not in known]
    if missing:
        return Fit(Status.UNKNOWN, f"{what}: GPU {', '.join(map(str, missing))} is not in "
                                   "this sweep")
    gpus = tuple(known[i] for i in wanted) if wanted is not None else host.gpus
    if entry.get("kind") == "python":
        return _judge_python(entry, what, host)
    return _judge_image(entry, what, host, gpus)


def _what(entry: dict[str, Any]) -> str:
    if entry.get("kind") == "python":
        version = entry.get("torch_version")
        return f"PyTorch {version} in {entry['name']}" if version else f"{entry['name']}"
    return f"image {entry['name']}"


def _judge_python(entry: dict[str, Any], what: str, host: Host) -> Fit:
    if not entry.get("torch_version"):
        return Fit(Status.UNKNOWN, f"{what}: no PyTorch found in it (torch/version.py), "
                                   "so the CUDA it needs is not known")
    needs = major_minor(entry.get("cuda"))
    if needs is None:
        return Fit(Status.CRITICAL, f"{what} is built without CUDA "
                                    f"({entry.get('cuda') or 'a CPU build'}): the GPU "
                                    "variant would not use the GPUs")
    return _by_version(what, needs, host, "")


def _judge_image(entry: dict[str, Any], what: str, host: Host, gpus: tuple[Gpu, ...]) -> Fit:
    env: dict[str, str] = entry.get("env") or {}
    needs = needed_cuda(entry)
    no_compute = _no_compute(env, what, needs is not None)
    if no_compute is not None:
        return no_compute
    runtime = runtime_check(env, host, gpus)
    if runtime.state == "refused":
        return Fit(Status.CRITICAL, f"{what}: the NVIDIA container runtime refuses it"
                                    f"{_refusal(runtime)}" + _versions_and_fix(needs, host, what))
    if runtime.state == "unknown":
        return Fit(Status.UNKNOWN, f"{what}: whether the container runtime accepts it is not "
                                   f"known: {runtime.message}")
    if needs is None:
        if cuda_require.requirements(env):
            return Fit(Status.OK, f"{what}: its requirements hold on driver {host.driver} "
                                  f"(CUDA {host.cuda}); it names no CUDA version")
        return Fit(Status.UNKNOWN, f"{what} declares no CUDA version (no CUDA_VERSION or "
                                   "NVIDIA_REQUIRE_CUDA): the CUDA it needs is not known")
    return _by_version(what, needs, host, _forward_compat(entry, env, host, gpus, needs))


def _refusal(runtime: cuda_require.Outcome) -> str:
    """Where and why, in nvidia-container-cli's words, and the image's variable it read."""
    where = f" on GPU {runtime.device}" if runtime.device is not None else ""
    stage = "" if runtime.message.startswith("input error") else "requirement error: "
    detail = f": {runtime.detail}" if runtime.detail else ""
    named = f"; from {runtime.variable}" if runtime.variable else ""
    return f"{where} ({stage}{runtime.message}{detail}{named})"


def _no_compute(env: dict[str, str], what: str, claims_cuda: bool) -> Fit | None:
    """The driver capabilities: a word the runtime hook does not know stops the container;
    without `compute` no CUDA driver library is mounted, and the CUDA an image says it is
    built for cannot initialise (one that says nothing may not use CUDA at all)."""
    try:
        capabilities = cuda_require.driver_capabilities(env)
    except cuda_require.Invalid as exc:
        return Fit(Status.CRITICAL, f"{what}: the NVIDIA container runtime refuses it "
                                    f"(NVIDIA_DRIVER_CAPABILITIES: {exc})")
    if "compute" in capabilities or not claims_cuda:
        return None
    return Fit(Status.CRITICAL, f"{what}: NVIDIA_DRIVER_CAPABILITIES="
                                f"{env.get('NVIDIA_DRIVER_CAPABILITIES')} gives it no compute "
                                "capability: the runtime mounts no CUDA driver library "
                                "(libcuda.so) into it and CUDA does not initialise; add "
                                "compute (NVIDIA_DRIVER_CAPABILITIES=compute,utility)")


def runtime_check(env: dict[str, str], host: Host, gpus: tuple[Gpu, ...]
                  ) -> cuda_require.Outcome:
    """The toolkit's check, once for each name it may give the GPUs' brands (the release
    read names six brands, newer ones may name more): both must agree, or it is unknown."""
    outcomes = []
    for naming in (0, -1):
        devices = [cuda_require.Device(g.index, _toolkit_name(g.brand, naming), g.arch)
                   for g in gpus]
        outcomes.append(cuda_require.check(env, host.cuda, host.driver, devices))
    first, second = outcomes
    if first.state != second.state:
        device = first.device if first.device is not None else second.device
        return cuda_require.Outcome(
            "unknown", "the answer depends on the container toolkit's release (it names "
                       f"the brand of GPU {device} differently)")
    return first


def _toolkit_name(brand: str | None, naming: int) -> str | None:
    return None if brand is None else cuda_compat.toolkit_names(brand)[naming]


def needed_cuda(entry: dict[str, Any]) -> tuple[int, int] | None:
    """The CUDA version an image is built for: CUDA_VERSION, else the `cuda>=` of
    NVIDIA_REQUIRE_CUDA, else the label com.nvidia.cuda.version (nvidia-docker 1)."""
    env = entry.get("env") or {}
    found = _REQUIRED_CUDA.search(env.get("NVIDIA_REQUIRE_CUDA", ""))
    label = (entry.get("labels") or {}).get("com.nvidia.cuda.version")
    for text in (env.get("CUDA_VERSION"), found.group(1) if found else None, label):
        version = major_minor(text)
        if version is not None:
            return version
    return None


def _by_version(what: str, needs: tuple[int, int], host: Host, forward: str | Fit) -> Fit:
    """Step 2 to 4: as new or newer, forward compatibility (a Fit when it decides, its
    words when it serves), minor version compatibility, or too old."""
    have = major_minor(host.cuda)
    versions = f"{what} needs CUDA {shown(needs)}; driver {host.driver} gives CUDA {host.cuda}"
    if have is None:
        return Fit(Status.UNKNOWN, f"{versions}, which is no version")
    if have >= needs:
        return Fit(Status.OK, versions)
    if isinstance(forward, Fit):
        return forward
    if forward:
        return Fit(Status.OK, f"{versions}, and {forward}")
    fix = _fix(needs, host, what)
    if have[0] == needs[0]:
        return Fit(Status.WARNING, f"{versions}: it runs only by minor version compatibility "
                                   "(PTX built for the newer CUDA does not load, newer APIs "
                                   f"fail); {fix}")
    return Fit(Status.CRITICAL, f"{versions}: CUDA does not initialise (\"CUDA driver version "
                                f"is insufficient for CUDA runtime version\"); {fix}")


def _versions_and_fix(needs: tuple[int, int] | None, host: Host, what: str) -> str:
    """The versions and the driver to install, where the driver is what falls short (a
    refusal for another reason, on a driver new enough, names no driver to install)."""
    have = major_minor(host.cuda)
    if needs is None or (have is not None and have >= needs):
        return ""
    return (f"; it needs CUDA {shown(needs)}, driver {host.driver} gives CUDA {host.cuda}; "
            + _fix(needs, host, what))


def _fix(needs: tuple[int, int], host: Host, what: str) -> str:
    branch = cuda_compat.branch_for(needs)
    driver = (f"a driver of branch {branch} or newer" if branch is not None
              else f"a driver that gives CUDA {shown(needs)} or newer")
    if what.startswith("PyTorch"):
        have = major_minor(host.cuda)
        tag = f" (cu{have[0]}{have[1]})" if have else ""
        rebuilt = f"a PyTorch wheel built for CUDA {host.cuda} or older{tag}"
    else:
        rebuilt = f"a build of {what} for CUDA {host.cuda} or older"
    return f"to run it: install {driver}, or use {rebuilt}"


def _forward_compat(entry: dict[str, Any], env: dict[str, str], host: Host,
                    gpus: tuple[Gpu, ...], needs: tuple[int, int]) -> str | Fit:
    """Whether forward compatibility serves the image: its words when it does, a Fit when
    it decides otherwise (a GPU that refuses it, a fact not known), "" when it does not
    apply (the step after decides)."""
    compat = entry.get("compat") or {}
    if compat.get("error"):
        return Fit(Status.UNKNOWN, f"{_what(entry)} needs CUDA {shown(needs)}, the driver "
                                   f"gives {host.cuda}; whether it carries the forward-"
                                   f"compatibility package is not known: {compat['error']}")
    if not _compat_used(compat, env, host, gpus):
        return ""
    refused = _gpu_refusing_it(entry, host, gpus, needs)
    if refused is not None:
        return refused
    carried = (f"libcuda.so.{compat['libcuda']}" if compat.get("libcuda")
               else str(compat.get("package")))
    taken = ", ".join(f"GPU {g.index} ({g.brand})" for g in gpus)
    takes = f"{taken} {'takes' if len(gpus) == 1 else 'take'} it" if gpus else "no GPU given"
    return f"forward compatibility serves it ({carried} in the image; {takes})"


def _compat_used(compat: dict[str, Any], env: dict[str, str], host: Host,
                 gpus: tuple[Gpu, ...]) -> bool:
    """The toolkit puts the image's compat library in use only when its driver is newer
    than the host's; it serves only the branches the image's own requirement lists
    (checked even where NVIDIA_DISABLE_REQUIRE turned the runtime's check off)."""
    compat_major = _compat_driver_major(compat)
    host_major = cuda_compat.driver_major(host.driver)
    if compat_major is None or host_major is None or compat_major <= host_major:
        return False
    plain = {k: v for k, v in env.items() if k != "NVIDIA_DISABLE_REQUIRE"}
    return runtime_check(plain, host, gpus).state == "ok"


def _gpu_refusing_it(entry: dict[str, Any], host: Host, gpus: tuple[Gpu, ...],
                     needs: tuple[int, int]) -> Fit | None:
    """A GPU that does not take forward compatibility: a consumer board refuses it
    (critical), a brand whose SKUs differ makes it unknown."""
    what = _what(entry)
    for gpu in gpus:
        if gpu.brand in cuda_compat.NO_FORWARD_COMPAT_BRANDS:
            return Fit(Status.CRITICAL, f"{what} needs CUDA {shown(needs)}, driver "
                                        f"{host.driver} gives {host.cuda}, and GPU {gpu.index} "
                                        f"({gpu.brand}) refuses forward compatibility: CUDA "
                                        "does not initialise (CUDA_ERROR_COMPAT_NOT_SUPPORTED_"
                                        f"ON_DEVICE); {_fix(needs, host, what)}")
        if gpu.brand not in cuda_compat.FORWARD_COMPAT_BRANDS:
            brand = gpu.brand or "brand not read"
            return Fit(Status.UNKNOWN, f"{what} needs CUDA {shown(needs)}, the driver gives "
                                       f"{host.cuda}: it runs by forward compatibility only "
                                       f"if GPU {gpu.index} ({brand}) is an SKU that takes it")
    return None


def _compat_driver_major(compat: dict[str, Any]) -> int | None:
    """The driver branch of the image's compat package: its libcuda's version, or the
    branch of the CUDA release its package is named for."""
    if not compat.get("found"):
        return None
    if compat.get("libcuda"):
        return cuda_compat.driver_major(str(compat["libcuda"]))
    package = _COMPAT_PACKAGE.search(str(compat.get("package") or ""))
    if package is None:
        return None
    return cuda_compat.branch_for((int(package.group(1)), int(package.group(2))))
