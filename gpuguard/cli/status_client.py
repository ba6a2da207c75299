"""`gpuguard status` before click loads: the running daemon's verdict over its Unix socket
in a few milliseconds (docs/daemon.md#gpuguard-status). Standard library only: the daemon
judges freshness and renders with check's renderers (gpuguard/daemon/verdict_view.py);
this side parses the options, asks, prints, and exits with the daemon's code.

Anything it does not parse itself (--help, a bad value, --cold when no daemon answers)
goes to the click command in gpuguard/cli/status.py, which takes the same options.
"""

# `_socket`, not `socket` (which imports selectors and enum), and no json, typing or
# contextlib: on an H200 host the interpreter's start and these imports were the whole of
# status's 43 ms against a budget of a quarter of `nvidia-smi -q` (29.6 ms there).
import _socket
import os
import sys
import time

TYPE_CHECKING = False  # typing's own import costs 3 ms here; mypy knows the name
if TYPE_CHECKING:
    from typing import Any

EXIT_UNKNOWN = 3
MAX_REPLY = 64 * 1024 * 1024  # an 8-GPU prometheus rendering is well under 1 MiB
FORMATS = ("table", "json", "prometheus")
FAIL_ON = ("unknown", "warning", "critical")
# option -> (request key, allowed values or None for free text, repeatable)
VALUED = {"--format": ("fmt", FORMATS, False), "--fail-on": ("fail_on", FAIL_ON, False),
          "--only": ("only", None, True), "--skip": ("skip", None, True),
          "--socket": ("socket", None, False), "--output": ("output", None, False),
          "-o": ("output", None, False), "--timeout": ("timeout", None, False)}
FLAGS = {"--quiet": "quiet", "-q": "quiet", "--cold": "cold"}


class NoDaemon(Exception):
    """No daemon answered on the socket (the message says why)."""


def default_socket() -> str:
    from gpuguard.io.guard import host_default_text

    return host_default_text("run") + "/status.sock"


def ask(path: str, request: "dict[str, Any]", timeout: float = 5.0) -> "dict[str, Any]":
    """The daemon's JSON reply to one request; NoDaemon when none answers in `timeout`."""
    import json

    raw = exchange(path, json.dumps(request).encode(), timeout)
    try:
        reply = json.loads(raw)
    except ValueError:
        raise NoDaemon(f"the daemon on {path} sent no complete answer") from None
    if not isinstance(reply, dict):
        raise NoDaemon(f"the daemon on {path} sent an answer of the wrong shape")
    return reply


def ask_text(path: str, request: "dict[str, Any]", timeout: float = 5.0
              ) -> "dict[str, Any]":
    """The daemon's rendering, framed (`want: text`, daemon/verdict_socket.py), as the
    reply `show` takes: {"code", "text"} or {"error"}."""
    raw = exchange(path, encode({**request, "want": "text"}), timeout)
    head, newline, body = raw.partition(b"\n")
    word = head.split(b" ")
    if not newline or len(word) != 3 or word[0] != b"GGV1" or not word[2].isdigit() \
            or int(word[2]) != len(body):
        raise NoDaemon(f"the daemon on {path} sent no complete answer")
    text = body.decode("utf-8", "replace")
    if word[1] == b"error":
        return {"error": text}
    if word[1] not in (b"0", b"1", b"2", b"3"):
        raise NoDaemon(f"the daemon on {path} sent an answer of the wrong shape")
    return {"code": int(word[1]), "text": text}


def encode(value: object) -> str:
    """JSON for the request's plain values (str, bool, int, lists, dicts), written here
    so that the fast path needs no json module; every string escaped as RFC 8259 says."""
    if value is True or value is False:
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str):
        return '"' + "".join(ESCAPES.get(c) or (f"\\u{ord(c):04x}" if ord(c) < 0x20 else c)
                             for c in value) + '"'
    if isinstance(value, list):
        return "[" + ",".join(encode(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ",".join(f"{encode(str(k))}:{encode(v)}" for k, v in value.items()) + "}"
    raise TypeError(f"not a request value: {type(value).__name__}")


ESCAPES = {'"': '\\"', "\\": "\\\\"}


def _check_peer(sock: _socket.socket, path: str) -> None:
    """The answer counts only from root or from this user (the daemon runs as root; a
    test's as its user): another user's program listening at a path we were given is not
    the daemon, and its "all ok" is not a verdict (SO_PEERCRED: pid, uid, gid)."""
    cred = sock.getsockopt(_socket.SOL_SOCKET, _socket.SO_PEERCRED, 12)
    uid = int.from_bytes(cred[4:8], sys.byteorder)
    if uid not in (0, os.getuid()):
        raise NoDaemon(f"the program answering on {path} runs as uid {uid}, not root or "
                       "this user: not gpuguard's daemon")


def exchange(path: str, request: bytes | str, timeout: float) -> bytes:
    """Send one request line, read the reply to its end (at most MAX_REPLY bytes)."""
    data = request.encode() if isinstance(request, str) else request
    # one deadline for the whole exchange: a timeout per call would let a server that
    # trickles a byte a second hold the command for ever
    end = time.monotonic() + timeout
    sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
    sock.settimeout(timeout)
    try:
        sock.connect(path)
        _check_peer(sock, path)
        sock.sendall(data + b"\n")
        chunks, size = [], 0
        while size <= MAX_REPLY:
            left = end - time.monotonic()
            if left <= 0:
                raise TimeoutError
            sock.settimeout(left)
            chunk = sock.recv(1 << 20)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
    except FileNotFoundError:
        raise NoDaemon(f"no daemon answers on {path} (no such socket: is `gpuguard daemon "
                       "--status-socket` running?)") from None
    except ConnectionRefusedError:
        raise NoDaemon(f"no daemon answers on {path} (connection refused: the daemon "
                       "that made it is gone)") from None
    except PermissionError:
        raise NoDaemon(f"permission denied on {path}: the daemon's verdict is for root and "
                       "its group (--status-group, default gpuguard)") from None
    except TimeoutError:
        raise NoDaemon(f"the daemon on {path} did not answer within {timeout:g} s") from None
    except OSError as exc:
        raise NoDaemon(f"cannot ask the daemon on {path}: {exc.strerror or exc}") from None
    finally:
        sock.close()
    if size > MAX_REPLY:
        raise NoDaemon(f"the daemon on {path} sent more than {MAX_REPLY} bytes")
    return b"".join(chunks)


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
    return opts if opts["timeout"] > 0 else None


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
