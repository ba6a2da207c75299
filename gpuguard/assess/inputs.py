"""What a judgement of this host reads: every input option of `check`, `slurm` and the
daemon in one frozen object (HostInputs), the host sources' options built from it, and
the configuration (profile and rules) it names, loaded once.

Standard library and light modules only at the top: `check` builds these before its
configuration is loaded, beside the NVML worker."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gpuguard.io.paths import Paths
    from gpuguard.model.profile import Profile
    from gpuguard.model.rule import RuleSet
    from gpuguard.model.workload import Workload
    from gpuguard.sources.host import HostOptions

EXIT_UNKNOWN = 3


class InputProblem(Exception):
    """Bad input or configuration: nothing was judged, so the verdict is UNKNOWN (3); the
    command line prints `gpuguard: <message>` (gpuguard/cli/entry.py)."""

    exit_code = EXIT_UNKNOWN


@dataclass(frozen=True)
class HostInputs:
    """Every input option of one judgement. A root left None is the host's default (for a
    live host) or not read at all (for a replayed --input: a replay reads only the host
    sources the user pointed at)."""

    input_path: Path | None = None
    sysfs: Path | None = None
    procfs: Path | None = None
    rootfs: Path | None = None
    kmsg_file: Path | None = None
    # None: the host's default where something is kept (a live host), none for a replay
    state_dir: Path | None = None
    profile_path: Path | None = None
    rules_dirs: tuple[Path, ...] = ()
    timeout: float = 10.0
    probe_image: str | None = None
    # Docker: None takes `docker_default` ("on", "off", or "auto": only when the profile
    # says `docker: required`); True/False is --docker/--no-docker
    docker: bool | None = None
    docker_default: str = "auto"
    host_resources: bool = False
    workloads: tuple[Workload, ...] = field(default=())
    # check never judges the NVLink error counters (the daemon does, by growth)
    link_counters: bool = False
    # `check` reuses an InfoROM validation kept this boot (sources/nvml_inforom_kept.py);
    # qualify, slurm health and snapshot validate every run
    inforom_kept: bool = False

    def paths(self) -> Paths:
        from gpuguard.io.paths import Paths

        return Paths(sysfs=self.sysfs, procfs=self.procfs, rootfs=self.rootfs)

    def host_options(self, profile: Profile | None = None) -> HostOptions:
        """The host sources' options (gpuguard/sources/host.py); with the profile when it
        is loaded already (the sources never read it themselves)."""
        from gpuguard.sources.host import HostOptions

        mode = self.docker_default if self.docker is None else ("on" if self.docker else "off")
        opts = HostOptions(paths=self.paths(), kmsg_file=self.kmsg_file,
                           state_dir=self.state_dir, probe_image=self.probe_image,
                           probe_timeout=max(self.timeout, 5.0),
                           read_timeout=min(5.0, 0.75 * self.timeout), docker=mode,
                           host_resources=self.host_resources, workloads=self.workloads)
        if profile is not None:
            opts.docker_required = profile.docker_required
            opts.disk_paths = tuple(profile.disk_paths)
        if self.input_path is not None:
            # A replay reads only the host sources the user pointed at.
            opts.kernel_log = self.kmsg_file is not None
            opts.procfs = self.procfs is not None
            opts.sysfs = self.sysfs is not None
            opts.rootfs = self.rootfs is not None or self.probe_image is not None
        return opts


def load_configuration(profile_path: Path | None,
                       rules_dirs: tuple[Path, ...]) -> tuple[Profile, RuleSet]:
    """The profile and rule pack (the site's defaults where none is named); InputProblem
    (`file:line: what is wrong`) when one is bad."""
    from gpuguard.config.ruleset import load_config
    from gpuguard.config.yamlfile import ConfigError
    from gpuguard.io.paths import profile_or_default, rules_dirs_or_default

    try:
        return load_config(profile_or_default(profile_path), rules_dirs_or_default(rules_dirs))
    except ConfigError as exc:
        raise InputProblem(str(exc)) from exc
