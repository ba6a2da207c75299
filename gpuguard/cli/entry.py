"""Console entry point: starts the NVML worker of `gpuguard check` before click loads.

Importing click and the CLI costs tens of milliseconds, and so does importing
pynvml in the worker; forking first lets the two overlap (docs/benchmarks.md).
Only the options the worker needs are looked at here; click still parses the
whole command line, and a worker started with other settings is discarded.
"""

import os
import sys

DEFAULT_TIMEOUT = 10.0


def _option(args: list[str], name: str) -> str | None:
    for i, arg in enumerate(args):
        if arg == name and i + 1 < len(args):
            return args[i + 1]
        if arg.startswith(name + "="):
            return arg.split("=", 1)[1]
    return None


def _start_worker_early(args: list[str]) -> None:
    if not args or args[0] != "check":
        return
    if any(a in ("-h", "--help") or a.startswith("--input") for a in args[1:]):
        return
    try:
        timeout = float(_option(args, "--timeout") or DEFAULT_TIMEOUT)
    except ValueError:
        return  # click will explain the bad value
    if not 0.2 <= timeout <= 3600:  # NaN and inf too: click refuses them (cli/values.py)
        return
    from gpuguard.io.guard import HostPathForbidden, host_default_text
    from gpuguard.sources import nvml

    try:
        procfs = _option(args, "--path.procfs") or host_default_text("procfs")
        sysfs = _option(args, "--path.sysfs") or host_default_text("sysfs")
    except HostPathForbidden:
        return  # the command says so, naming the option (exit 4)

    nvml.start_early(procfs, nvml.deadline_for(timeout), _inforom_keep(args), sysfs)


def _inforom_keep(args: list[str]) -> tuple[str, str, str] | None:
    """Where the InfoROM's validity is kept, as `check` will decide it (HostOptions:
    --state-dir, else the host's where the kernel log is the live device); None where a
    default is refused (the collection then starts its own worker)."""
    import stat

    from gpuguard.io.guard import HostPathForbidden, host_default_text
    from gpuguard.sources import nvml

    try:
        kmsg = _option(args, "--kmsg-file") or host_default_text("kmsg")
        state = _option(args, "--state-dir")
        if state is None:
            try:
                live = stat.S_ISCHR(os.stat(kmsg).st_mode)
            except OSError:
                live = False
            state = host_default_text("state") if live else None
        procfs = _option(args, "--path.procfs")
        boot = (os.path.join(procfs, "sys", "kernel", "random", "boot_id") if procfs
                else host_default_text("boot_id"))
    except HostPathForbidden:
        return None
    return nvml.keep_place(state, kmsg, boot)


def main() -> None:
    args = sys.argv[1:]
    if args and args[0] == "status":
        # the daemon's verdict in milliseconds: no click, no NVML, no rules, not even this
        # module's own imports below (status_client; each costs on the 30 ms budget)
        from gpuguard.cli.status_client import fast_main

        code = fast_main(args[1:])
        if code is not None:
            sys.stdout.flush()
            os._exit(code)
    from gpuguard.cli import timing

    timing.start()  # GPUGUARD_TIMING=1 prints each phase of `check` from here
    from gpuguard.io.guard import EXIT_HOST_FORBIDDEN, HostPathForbidden

    try:
        _run()
    except HostPathForbidden as exc:
        # Not a verdict: a test reached for the host while the guard was on (paths.py).
        from gpuguard.sources import nvml

        nvml.abandon_early()
        print(f"gpuguard: {exc}", file=sys.stderr)
        sys.exit(EXIT_HOST_FORBIDDEN)


def _run() -> None:
    args = sys.argv[1:]
    _start_worker_early(args)
    import click

    from gpuguard.assess.inputs import InputProblem
    from gpuguard.cli.main import main as cli_main

    # click exits 2 on a usage error, which a Nagios-style caller reads as CRITICAL;
    # nothing was checked, so it is UNKNOWN (3).
    try:
        cli_main(standalone_mode=False)
    except click.UsageError as exc:
        exc.show()
        sys.exit(3)
    except click.ClickException as exc:
        exc.show()
        sys.exit(exc.exit_code)
    except click.Abort:
        sys.exit(3)
    except InputProblem as exc:  # a bad --input, profile or rule file: nothing was judged
        print(f"gpuguard: {exc}", file=sys.stderr)
        sys.exit(exc.exit_code)
