"""driver.*: can we talk to the driver at all, does it answer in time, is it new enough."""

from __future__ import annotations

from gpuguard.config.profile import parse_version
from gpuguard.judge.registry import CheckContext, Finding, host_check, ok, skipped, unknown

# What each NVML init error usually means on an inference host, in the words an SRE
# searches for ("nvidia-smi has failed because it couldn't communicate ...").
INIT_CAUSES = {
    "NVMLError_LibraryNotFound": (
        "the NVML library (libnvidia-ml.so.1) is not installed or not on the loader path: "
        "no NVIDIA driver is installed on this host, or this container was started without "
        "the NVIDIA runtime/CDI devices"
    ),
    "NVMLError_DriverNotLoaded": (
        "the NVIDIA kernel module is not loaded: likely nouveau holds the GPU, the module was "
        "not built for the running kernel after a kernel upgrade, or Secure Boot refused the "
        "unsigned module"
    ),
    "NVMLError_LibRmVersionMismatch": (
        "Driver/library version mismatch: the loaded kernel module and the user-space NVML "
        "library come from different driver versions (a driver upgrade without a reboot)"
    ),
    "NVMLError_NoPermission": (
        "no permission to open /dev/nvidiactl or /dev/nvidia*: run as root or a user in the "
        "device's group, or allow the device nodes in the unit/container"
    ),
    "NVMLError_NotFound": "the driver found no NVIDIA GPU on this host",
    "NVMLError_GpuIsLost": "a GPU has fallen off the bus; the driver lost it",
}


def found_causes(ctx: CheckContext) -> list[str]:
    """Causes of an NVML failure that the host's own facts show (procfs, /dev, kernel log)."""
    host = ctx.snapshot.host
    modules = host.kernel_modules.get_or(None)
    log = host.kernel_log.get_or({})
    causes = []
    if modules is not None and "nouveau" in modules:
        causes.append("the nouveau driver is loaded and holds the GPU")
    if modules is not None and "nvidia" not in modules:
        causes.append("the nvidia kernel module is not loaded")
        if host.secure_boot.get_or(False) and log.get("unsigned_module_rejected"):
            causes.append("Secure Boot is on and the kernel refused the unsigned nvidia module")
        elif host.secure_boot.get_or(False):
            causes.append("Secure Boot is on: an unsigned nvidia module would be refused")
    mismatch = log.get("api_mismatch")
    if mismatch:
        causes.append(f"Driver/library version mismatch: the library is "
                      f"{mismatch.get('client', '?')}, the kernel module "
                      f"{mismatch.get('kernel', '?')}")
    elif host.kernel_module_version.is_ok and ctx.snapshot.nvml.init_error_kind == \
            "NVMLError_LibRmVersionMismatch":
        causes.append(f"Driver/library version mismatch: the kernel module is "
                      f"{host.kernel_module_version.get()}")
    nodes = host.device_nodes.get_or(None)
    if modules is not None and "nvidia" in modules and nodes is not None \
            and "nvidiactl" not in nodes:
        causes.append("the module is loaded but /dev/nvidiactl is missing (run nvidia-modprobe, "
                      "or pass the device nodes into this container)")
    return causes


@host_check("driver.loaded")
def loaded(ctx: CheckContext) -> Finding:
    nvml = ctx.snapshot.nvml
    if nvml.init_error is not None:
        causes = found_causes(ctx)
        cause = "; ".join(causes) if causes else \
            INIT_CAUSES.get(nvml.init_error_kind or "", "NVML could not start")
        return ctx.fail(
            f"NVIDIA driver not usable: {cause} (NVML said: {nvml.init_error})",
            error=nvml.init_error,
            error_kind=nvml.init_error_kind,
            causes_found=causes,
        )
    if nvml.hung_call is not None and not ctx.snapshot.host.driver_version.is_ok:
        return unknown(f"NVML did not answer during {nvml.hung_call}")
    version = ctx.snapshot.host.driver_version.get()
    return ok(f"driver {version} loaded", driver_version=version)


@host_check("driver.responsive")
def responsive(ctx: CheckContext) -> Finding:
    nvml = ctx.snapshot.nvml
    if nvml.hung_call is not None:
        return ctx.fail(
            f"NVML call {nvml.hung_call} did not return within {nvml.deadline_s:g} s: the driver "
            "or a GPU is wedged",
            hung_call=nvml.hung_call,
            deadline_s=nvml.deadline_s,
        )
    if nvml.elapsed_s is None:
        return skipped(f"not measured: replayed {ctx.snapshot.host.source or 'input'}")
    if nvml.init_error is not None:
        return skipped("NVML did not start (see driver.loaded)")
    if nvml.sweep_error is not None:
        return unknown(f"the NVML sweep stopped early: {nvml.sweep_error}",
                       sweep_error=nvml.sweep_error)
    return ok(f"NVML answered in {nvml.elapsed_s:.3f} s", elapsed_s=nvml.elapsed_s)


@host_check("driver.version")
def version(ctx: CheckContext) -> Finding:
    profile = ctx.profile
    if profile.driver_min_version is None and profile.cuda_min_version is None:
        return skipped("no driver.min_version or driver.min_cuda_version in the profile")
    host = ctx.snapshot.host
    problems = []
    observed: dict[str, str] = {}
    if profile.driver_min_version is not None:
        have = host.driver_version.get()
        observed["driver_version"] = have
        wanted = profile.driver_min_version
        if parse_version(have) < parse_version(wanted):
            problems.append(f"driver {have} is older than the required {wanted}")
    if profile.cuda_min_version is not None:
        have_cuda = host.cuda_driver_version.get()
        observed["cuda_driver_version"] = have_cuda
        wanted_cuda = profile.cuda_min_version
        if parse_version(have_cuda) < parse_version(wanted_cuda):
            problems.append(f"the driver supports CUDA {have_cuda}, the profile requires "
                            f"{wanted_cuda}")
    if problems:
        return ctx.fail("; ".join(problems), **observed)
    return ok("driver meets the profile: " + ", ".join(f"{k} {v}" for k, v in observed.items()),
              **observed)


@host_check("driver.module_match")
def module_match(ctx: CheckContext) -> Finding:
    module = ctx.snapshot.host.kernel_module_version.get()
    library = ctx.snapshot.host.driver_version.get()
    if module != library:
        return ctx.fail(f"Driver/library version mismatch: the kernel module is {module}, the "
                        f"NVML library {library}", kernel_module=module, library=library)
    return ok(f"kernel module and library are both {module}", kernel_module=module)


@host_check("driver.nouveau")
def nouveau(ctx: CheckContext) -> Finding:
    modules = ctx.snapshot.host.kernel_modules.get()
    if "nouveau" in modules:
        return ctx.fail("the nouveau driver is loaded: it takes the GPU from the NVIDIA driver",
                        modules=modules)
    return ok("nouveau is not loaded", modules=modules)
