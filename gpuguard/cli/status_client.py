"""`gpuguard status` before click loads: the running daemon's verdict over its Unix socket
in a few milliseconds (docs/daemon.md#gpuguard-status). Standard library only: the daemon
judges freshness and renders with check's renderers (gpuguard/daemon/verdict_view.py);
this side parses the options, asks, prints, and exits with the daemon's code.

Anything it does not parse itself (--help, a bad value, --cold when no daemon answers)
goes to the click command in gpuguard/cli/status.py, which takes the same options.
"""

# No json, typing or contextlib: on an H200 host the interpreter's start and these imports
# were the whole of status's 43 ms against a budget of a quarter of `nvidia-smi -q` (29.6 ms
# there). The socket exchange itself is gpuguard/daemon/socket_client.py's.
import os
import sys

from gpuguard.daemon.socket_client import NoDaemon, ask_text, default_socket

TYPE_CHECKING = False  # typing's own import costs 3 ms here; mypy knows the name
if TYPE_CHECKING:
    from typing import Any

EXIT_UNKNOWN = 3
MAX_TIMEOUT_S = 3600.0  # gpuguard/cli/values.py MAX_WAIT_S (not imported: click)
FORMATS = ("table", "json", "prometheus")
FAIL_ON = ("unknown", "warning", "critical")
# option -> (request key, allowed values or None for free text, repeatable)
VALUED = {"--format": ("fmt", FORMATS, False), "--fail-on": ("fail_on", FAIL_ON, False),
          "--only": ("only", None, True), "--skip": ("skip", None, True),
          "--socket": ("socket", None, False), "--output": ("output", None, False),
          "-o": ("output", None, False), "--timeout": ("timeout", None, False)}
FLAGS = {"--quiet": "quiet", "-q": "quiet", "--cold": "cold"}


def parse(args: list[str]) -> "dict[str, Any] | None":
    """The options, or None where click must handle the command line."""
    opts: dict[str, Any] = {"fmt": "table", "fail_on": "unknown", "only": [], "skip": [],
                            "quiet": False, "cold": False, "socket": None, "output": None,
                            "timeout": "5"}
    i = 0
    while i < len(args):
        name, sep, value = args[i].partition("=")
        if not sep and name in FLAGS:
            opts[FLAGS[name]] = True
            i += 1
            continue
        if name not in VALUED:
            return None  # --help, a typo, a positional: click says what is wrong
        if not sep:
            if i + 1 >= len(args):
                return None
            value = args[i + 1]
            i += 1
        i += 1
        key, allowed, repeat = VALUED[name]
        if allowed is not None and value not in allowed:
            return None
        if repeat:
            opts[key].append(value)
        else:
            opts[key] = value
    try:
        opts["timeout"] = float(opts["timeout"])
    except ValueError:
        return None
    # NaN fails both comparisons and inf (or 1e308) the second: click's command refuses
    # them naming the option (gpuguard/cli/values.py), as it refuses any bad value
    return opts if 0.1 <= opts["timeout"] <= MAX_TIMEOUT_S else None


def request_of(opts: "dict[str, Any]") -> "dict[str, Any]":
    colour = opts["output"] is None and sys.stdout.isatty() and "NO_COLOR" not in os.environ
    columns = os.environ.get("COLUMNS", "")
    width = int(columns) if columns.isdigit() else 120
    try:  # noqa: SIM105 (contextlib costs an import on the fast path)
        width = os.get_terminal_size(sys.stdout.fileno()).columns
    except (OSError, ValueError):  # not a terminal: COLUMNS, else 120
        pass
    return {"want": "render", "fmt": opts["fmt"], "only": opts["only"], "skip": opts["skip"],
            "fail_on": opts["fail_on"], "quiet": opts["quiet"], "colour": colour,
            "width": width}


def show(reply: "dict[str, Any]", output: str | None) -> int:
    """Print (or write) the daemon's rendering; its exit code, or 3 with its error."""
    if "error" in reply or not isinstance(reply.get("text"), str) or \
            reply.get("code") not in (0, 1, 2, 3):
        print(f"gpuguard: the daemon cannot answer: {reply.get('error', 'a malformed reply')}",
              file=sys.stderr)
        return EXIT_UNKNOWN
    if output is None:
        sys.stdout.write(reply["text"])
        sys.stdout.flush()
    else:
        from pathlib import Path

        from gpuguard.io.atomic import write_text

        try:
            write_text(Path(output), reply["text"])
        except OSError as exc:
            print(f"gpuguard: cannot write {output}: {exc.strerror or exc}", file=sys.stderr)
            return EXIT_UNKNOWN
    return int(reply["code"])


def fast_main(args: list[str]) -> int | None:
    """The exit code, or None to hand the command line to click."""
    opts = parse(args)
    if opts is None:
        return None
    path = opts["socket"]
    if path is None:
        from gpuguard.io.guard import EXIT_HOST_FORBIDDEN, HostPathForbidden

        try:
            path = default_socket()
        except HostPathForbidden as exc:  # a test reached for the host (io/paths.py)
            print(f"gpuguard: {exc}", file=sys.stderr)
            return EXIT_HOST_FORBIDDEN
    try:
        reply = ask_text(path, request_of(opts), opts["timeout"])
    except NoDaemon as exc:
        if opts["cold"]:
            return None  # click's command runs the cold check (it imports the pipeline)
        print(f"gpuguard: {exc}; nothing was checked (`gpuguard status --cold` checks "
              "this host itself)", file=sys.stderr)
        return EXIT_UNKNOWN
    return show(reply, opts["output"])
