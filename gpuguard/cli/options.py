"""What the commands share: their options (the host's roots, the state dir, the profile
and rules), writing the output, and the usage error every command gives (exit 3,
`gpuguard: ...`). What the options mean to a judgement is gpuguard/assess/inputs.py's."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from gpuguard.cli.values import FilePath

if TYPE_CHECKING:
    from gpuguard.io.paths import Paths

EXIT_UNKNOWN = 3


def path_options(fn: Any) -> Any:
    for option in reversed([
        click.option("--path.sysfs", "path_sysfs", show_default="/sys",
                     type=FilePath(), help="sysfs mount point."),
        click.option("--path.procfs", "path_procfs", show_default="/proc",
                     type=FilePath(), help="procfs mount point."),
        click.option("--path.rootfs", "path_rootfs", show_default="/",
                     type=FilePath(), help="Host root filesystem (for /etc)."),
    ]):
        fn = option(fn)
    return fn


STATE_DIR_HELP = ("Where gpuguard keeps its state: the event store (events.db), acks, the "
                  "kernel-log ack and the supervisor's failover state.")


def state_dir_option() -> Callable[[Any], Any]:
    return click.option("--state-dir", type=FilePath(),
                        show_default="/var/lib/gpuguard", help=STATE_DIR_HELP)


def kmsg_device_option() -> Callable[[Any], Any]:
    return click.option("--kmsg-file", "kmsg_device", type=FilePath(),
                        help="The live kernel log device to acknowledge [default: /dev/kmsg; "
                             "e.g. the host's, mounted into a container].")


def host_source_options(fn: Any) -> Any:
    for option in reversed([
        click.option("--kmsg-file", type=FilePath(),
                     help="Read the kernel log from this file (dmesg, dmesg -r or /dev/kmsg "
                          "records) instead of /dev/kmsg."),
        state_dir_option(),
        click.option("--docker/--no-docker", "docker", default=None,
                     help="Check the Docker daemon (toolkit.docker). Default: the daemon "
                          "always does; `check` only with --probe-image or when the profile "
                          "says `docker: required` (the docker SDK costs ~200 ms to import)."),
        click.option("--host-resources/--no-host-resources", "host_resources", default=None,
                     help="Read host memory and disk space (host.memory, host.disk). Default: the "
                          "daemon and `snapshot` always do; `check` only when asked (psutil's "
                          "import and the Docker API stay off its path)."),
        click.option("--probe-image", metavar="IMAGE",
                     help="Also run nvidia-smi in a throwaway container of IMAGE with all GPUs "
                          "and compare its driver version with the host's (off by default)."),
    ]):
        fn = option(fn)
    return fn


def rule_options(fn: Any) -> Any:
    for option in reversed([
        click.option("--profile", "profile_path", type=FilePath(),
                     help="Host profile [default: /etc/gpuguard/profile.yaml if present]."),
        click.option("--rules", "rules_dirs", multiple=True, type=FilePath(),
                     help="Directory of extra rule files (repeatable) "
                          "[default: /etc/gpuguard/rules.d if present]."),
    ]):
        fn = option(fn)
    return fn


def span_option(text: str, option: str) -> float:
    from gpuguard.config.profile import parse_span

    seconds = parse_span(text)
    if seconds is None:
        raise click.BadParameter(f"a span such as 90s, 15m, 24h, 30d, not {text!r}",
                                 param_hint=option)
    return seconds


# The documents of --format json: docs/json-output.md; each is described by a JSON Schema
# in gpuguard/outputs/schemas/ (the tests validate the commands' real output against it).
JSON_DOC = "docs/json-output.md"


def text_or_json_option() -> Callable[[Any], Any]:
    """`--format text|json` of a command whose text is for people and whose JSON is one
    document with a `schema` version (check, status and events keep their own choices)."""
    return click.option("--format", "fmt", type=click.Choice(["text", "json"]),
                        default="text", show_default=True,
                        help=f"text, or one JSON document ({JSON_DOC}).")


def emit_json(document: dict[str, Any]) -> None:
    """One JSON document on stdout, as `check --format json` writes its own."""
    import json

    click.echo(json.dumps(document, indent=2))


def paths_from(sysfs: Path | None, procfs: Path | None, rootfs: Path | None) -> Paths:
    from gpuguard.io.paths import Paths

    return Paths(sysfs=sysfs, procfs=procfs, rootfs=rootfs)


def emit(text: str, output: Path | None) -> None:
    if output is None:
        sys.stdout.write(text)
        sys.stdout.flush()
        return
    from gpuguard.io.atomic import write_text

    try:
        write_text(output, text)
    except OSError as exc:
        raise ConfigProblem(f"cannot write {output}: {exc.strerror or exc}") from exc


class ConfigProblem(click.ClickException):
    """Bad input or configuration: nothing was checked, so the verdict is UNKNOWN (3)."""

    exit_code = EXIT_UNKNOWN

    def show(self, file: Any = None) -> None:
        click.echo(f"gpuguard: {self.format_message()}", err=True)
