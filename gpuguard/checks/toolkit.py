"""toolkit.*: the container toolkit and CDI specs match the running driver; Docker answers.

A driver upgrade that leaves a CDI spec or the toolkit behind breaks every GPU
container while the host itself looks healthy.
"""

from __future__ import annotations

from typing import Any

from gpuguard.judge.registry import CheckContext, Finding, host_check, ok, skipped, unknown, warning
from gpuguard.model.snapshot import Reading


def _gpu_device_count(devices: list[Any]) -> int:
    # nvidia-ctk names each GPU by index and by UUID, plus "all".
    by_index = [d for d in devices if isinstance(d, str) and d.isdigit()]
    if by_index:
        return len(by_index)
    return len([d for d in devices if isinstance(d, str) and d.startswith("GPU-")])


@host_check("toolkit.parity")
def parity(ctx: CheckContext) -> Finding:
    host = ctx.snapshot.host
    specs = host.cdi_specs.get()
    cli = host.container_cli
    if not specs and not cli.is_ok:
        return skipped("no CDI spec and no nvidia-container-cli: the container toolkit is "
                       "not installed (or not visible under --path.rootfs)")
    driver = host.driver_version.get()
    problems: list[str] = []
    unreadable: list[str] = []
    for spec in specs:
        if "error" in spec:
            unreadable.append(spec["error"])
            continue
        problems += _spec_problems(spec, driver, host.gpu_count)
    if cli.is_ok:
        problems += _cli_problems(cli.get(), driver, host.cuda_driver_version)
    observed = {"driver_version": driver, "specs": specs,
                "container_cli": cli.value if cli.is_ok else cli.describe(),
                "nvidia_ctk": host.ctk_version.value}
    if problems:
        return ctx.fail("; ".join(problems), **observed)
    if unreadable:
        return unknown("; ".join(unreadable), **observed)
    return ok(f"{_what_was_seen(specs, cli, host.ctk_version)} match driver {driver}",
              **observed)


def _spec_problems(spec: dict[str, Any], driver: str, gpu_count: Reading[int]) -> list[str]:
    """What one readable CDI spec gets wrong after a driver upgrade: it names another
    driver, its host paths are gone, or (a GPU spec) it lists another number of GPUs than
    the driver sees."""
    problems: list[str] = []
    stale = sorted(v for v in spec["versions"] if v != driver)
    if stale:
        problems.append(f"{spec['path']} still names driver {', '.join(stale)} "
                        f"(running {driver})")
    if spec["missing_host_paths"]:
        shown = ", ".join(spec["missing_host_paths"][:3])
        more = len(spec["missing_host_paths"]) - 3
        problems.append(f"{spec['path']}: host paths missing: {shown}"
                        + (f" and {more} more" if more > 0 else ""))
    if spec.get("kind") == "nvidia.com/gpu" and gpu_count.is_ok:
        listed = _gpu_device_count(spec["devices"])
        if listed != gpu_count.get():
            problems.append(f"{spec['path']} lists {listed} GPU(s), the driver sees "
                            f"{gpu_count.get()}")
    return problems


def _cli_problems(facts: dict[str, Any], driver: str, cuda_version: Reading[str]
                  ) -> list[str]:
    """What `nvidia-container-cli info` says against the host: it failed, or it sees
    another NVRM or CUDA version than the running driver's (a field it did not report is
    not compared)."""
    if not facts.get("ok"):
        return [f"nvidia-container-cli info failed: {facts.get('error')}"]
    problems: list[str] = []
    if facts.get("nvrm_version") not in (None, driver):
        problems.append(f"nvidia-container-cli sees NVRM {facts['nvrm_version']}, "
                        f"the host runs {driver}")
    cuda = cuda_version.get_or(None)
    if facts.get("cuda_version") not in (None, cuda):
        problems.append(f"nvidia-container-cli sees CUDA {facts['cuda_version']}, "
                        f"the host driver supports {cuda}")
    return problems


def _what_was_seen(specs: list[dict[str, Any]], cli: Reading[dict[str, Any]],
                   ctk_version: Reading[str]) -> str:
    """The parts of the toolkit that were found, for the ok message."""
    seen = [f"{len(specs)} CDI spec(s)"] if specs else []
    if cli.is_ok:
        seen.append("nvidia-container-cli")
    if ctk_version.is_ok:
        seen.append(f"nvidia-ctk {ctk_version.get()}")
    return " and ".join(seen)


@host_check("toolkit.docker")
def docker(ctx: CheckContext) -> Finding:
    host = ctx.snapshot.host
    required = ctx.profile.docker_required
    if host.docker.state == "not_supported":
        return _no_docker(ctx, required)
    info = host.docker.get()
    observed: dict[str, Any] = {"docker": info}
    if not info["reachable"]:
        text = f"Docker at {info['host']} does not answer: {info.get('error')}"
        return ctx.fail(text, **observed) if required else warning(text, **observed)
    message = _docker_answers(info)
    probe = host.probe_image
    if probe.is_ok:
        result = probe.get()
        observed["probe_image"] = result
        if not result["ok"]:
            return ctx.fail(f"a GPU container from {result['image']} did not run: "
                            f"{result['error']}", **observed)
        driver = host.driver_version.get_or(None)
        seen = result["driver_versions"]
        if driver is not None and seen != [driver]:
            return ctx.fail(f"inside {result['image']} nvidia-smi reports driver "
                            f"{', '.join(seen) or 'nothing'}, the host runs {driver}",
                            **observed)
        message += f"; a GPU container from {result['image']} sees driver {driver}"
    return ok(message, **observed)


def _no_docker(ctx: CheckContext, required: bool) -> Finding:
    """No Docker daemon is configured: a failure when the profile requires Docker; else
    unknown when --probe-image asked for a GPU container (the user asked for a run that
    cannot happen), and skipped otherwise."""
    host = ctx.snapshot.host
    if required:
        return ctx.fail("the profile requires Docker, and no daemon is configured")
    if host.probe_image.state != "absent":  # --probe-image: the user asked for a run
        return unknown("--probe-image asked for a GPU container, but "
                       f"{host.docker.error or 'no Docker daemon is configured'}")
    return skipped(host.docker.error or "no Docker daemon configured")


def _docker_answers(info: dict[str, Any]) -> str:
    """Docker's version and runtimes; a default nvidia runtime is named, since it gives
    every container the GPUs."""
    runtimes = ", ".join(info.get("runtimes") or []) or "none"
    message = (f"Docker {info.get('server_version')} answers; runtimes: {runtimes}; "
               f"default: {info.get('default_runtime')}")
    if info.get("default_runtime") == "nvidia":
        message += " (every container gets GPUs, even without --gpus)"
    return message
