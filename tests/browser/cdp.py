"""A headless Debian chromium driven over the DevTools protocol (CDP), JSON on a websocket.

Nothing here downloads a browser: it runs /usr/bin/chromium (Debian's package, which
scripts/test.sh installs) with a profile, HOME, XDG dirs and TMPDIR in a temp folder of its
own, in a process group of its own. `close()` kills the group and every process that names
the temp folder (chromium's crashpad handlers start their own sessions, so the group alone
would miss them), waits until none is left, and removes the folder.

    with Browser.start() as browser:
        browser.navigate("http://127.0.0.1:8080/")
        browser.evaluate("document.title")
"""

from __future__ import annotations

import base64
import contextlib
import ctypes
import itertools
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

import websocket

CHROMIUM = Path("/usr/bin/chromium")
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-breakpad", "--disable-crash-reporter", "--disable-dev-shm-usage",
         "--remote-debugging-port=0")
_PR_SET_PDEATHSIG = 1


class CDPError(RuntimeError):
    """The browser answered a command with an error, or did not answer in time."""


class JSError(CDPError):
    """The evaluated script threw (or its promise rejected)."""


@dataclass
class Response:
    """The main document's response, as the Network domain saw it."""

    url: str
    status: int
    headers: dict[str, str]  # names in lower case

    def header(self, name: str) -> str | None:
        return self.headers.get(name.lower())


@dataclass
class Page:
    """What one navigation left: its response and the console's messages."""

    response: Response | None = None
    messages: list[str] = field(default_factory=list)  # "level source: text", one a message

    def csp_violations(self) -> list[str]:
        return [m for m in self.messages if "Content Security Policy" in m]


def _die_with_parent() -> None:  # in the child, before exec: a test run killed takes it along
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def processes_naming(text: str) -> list[int]:
    """Live (non-zombie) processes whose command line contains `text`."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z" and text.encode() in cmdline:
            found.append(int(entry.name))
    return found


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # zombies count for kill(); the group is gone when nothing in it still runs
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[2]) == pgid and fields[0] != "Z":
                return True
    return False


class Browser:
    """One chromium, one tab, attached over a flat CDP session."""

    def __init__(self, proc: subprocess.Popen[bytes], folder: Path, timeout: float) -> None:
        self.proc = proc
        self.folder = folder
        self.timeout = timeout
        self.ws: websocket.WebSocket | None = None
        self.session = ""
        self._ids = itertools.count(1)
        self._events: list[dict[str, Any]] = []
        self.page = Page()

    # --- start and stop ----------------------------------------------------------------
    @classmethod
    def start(cls, binary: Path = CHROMIUM, timeout: float = 30.0) -> Browser:
        if not binary.exists():
            raise FileNotFoundError(f"{binary} is missing: ./scripts/test.sh installs Debian's "
                                    "chromium")
        folder = Path(tempfile.mkdtemp(prefix="gpuguard-chromium-"))
        env = {k: v for k, v in os.environ.items()
               if k not in ("DISPLAY", "WAYLAND_DISPLAY", "DBUS_SESSION_BUS_ADDRESS")}
        for name, sub in (("HOME", "home"), ("XDG_CONFIG_HOME", "home/.config"),
                          ("XDG_CACHE_HOME", "home/.cache"), ("XDG_DATA_HOME", "home/.local"),
                          ("XDG_RUNTIME_DIR", "run"), ("TMPDIR", "tmp")):
            path = folder / sub
            path.mkdir(mode=0o700, parents=True, exist_ok=True)
            env[name] = str(path)
        profile = folder / "profile"
        log = (folder / "chromium.log").open("wb")
        proc = subprocess.Popen([str(binary), *FLAGS, f"--user-data-dir={profile}",
                                 "about:blank"],
                                stdin=subprocess.DEVNULL, stdout=log, stderr=log, env=env,
                                cwd=folder, start_new_session=True,
                                preexec_fn=_die_with_parent)
        log.close()
        browser = cls(proc, folder, timeout)
        try:
            browser._connect(profile / "DevToolsActivePort")
        except BaseException:
            browser.close()
            raise
        return browser

    def _connect(self, port_file: Path) -> None:
        end = time.monotonic() + self.timeout
        lines: list[str] = []
        while len(lines) < 2:
            if self.proc.poll() is not None:
                raise CDPError(f"chromium exited ({self.proc.returncode}): {self.log()[-2000:]}")
            if time.monotonic() > end:
                raise CDPError(f"no {port_file.name} within {self.timeout} s: "
                               + self.log()[-2000:])
            with contextlib.suppress(OSError):
                lines = port_file.read_text().split()
            time.sleep(0.05)
        url = f"ws://127.0.0.1:{int(lines[0])}{lines[1]}"
        self.ws = websocket.create_connection(url, timeout=self.timeout, suppress_origin=True)
        target = self.send("Target.createTarget", {"url": "about:blank"}, session=None)
        attached = self.send("Target.attachToTarget",
                             {"targetId": target["targetId"], "flatten": True}, session=None)
        self.session = attached["sessionId"]
        for domain in ("Page", "Network", "Runtime", "Log"):
            self.send(f"{domain}.enable")
        # no classic scrollbar eating 15 px of a desktop viewport (a phone's are overlays):
        # a 1280 px viewport lays out, and shoots, 1280 px wide
        self.send("Emulation.setScrollbarsHidden", {"hidden": True})

    def log(self) -> str:
        with contextlib.suppress(OSError):
            return (self.folder / "chromium.log").read_text(errors="replace")
        return ""

    def leftovers(self) -> list[int]:
        """Processes of this browser still running (its group, or naming its folder)."""
        pids = set(processes_naming(str(self.folder)))
        if _group_alive(self.proc.pid):
            pids.add(self.proc.pid)
        return sorted(pids)

    def close(self) -> None:
        """Ask the browser to quit, then kill whatever of it is left; wait; remove the folder."""
        if self.ws is not None:
            with contextlib.suppress(Exception):
                self.send("Browser.close", session=None, timeout=3)
            with contextlib.suppress(Exception):
                self.ws.close()
            self.ws = None
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=3)
        end = time.monotonic() + 10
        for sig in itertools.chain((signal.SIGTERM,), itertools.repeat(signal.SIGKILL)):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.proc.pid, sig)
            for pid in processes_naming(str(self.folder)):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, sig)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=0.5)
            if not self.leftovers() or time.monotonic() > end:
                break
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=5)
        left = self.leftovers()
        shutil.rmtree(self.folder, ignore_errors=True)
        if left:
            raise CDPError(f"chromium processes left after close: {left}")

    def __enter__(self) -> Browser:
        return self

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    # --- the protocol --------------------------------------------------------------------
    def send(self, method: str, params: dict[str, Any] | None = None, *,
             session: str | None = "", timeout: float | None = None) -> dict[str, Any]:
        """One command and its answer (events that arrive meanwhile are kept)."""
        if self.ws is None:
            raise CDPError("not connected")
        ident = next(self._ids)
        message: dict[str, Any] = {"id": ident, "method": method, "params": params or {}}
        if session is not None:
            message["sessionId"] = session or self.session
        self.ws.send(json.dumps(message))
        end = time.monotonic() + (timeout or self.timeout)
        while True:
            reply = self._receive(end, method)
            if reply.get("id") == ident:
                if "error" in reply:
                    raise CDPError(f"{method}: {reply['error']}")
                result: dict[str, Any] = reply.get("result", {})
                return result
            if "method" in reply:
                self._event(reply)

    def _receive(self, end: float, what: str) -> dict[str, Any]:
        assert self.ws is not None
        left = end - time.monotonic()
        if left <= 0:
            raise CDPError(f"{what}: no answer within the deadline")
        self.ws.settimeout(left)
        try:
            raw = self.ws.recv()
        except websocket.WebSocketTimeoutException:
            raise CDPError(f"{what}: no answer within the deadline") from None
        message: dict[str, Any] = json.loads(raw)
        return message

    def _event(self, event: dict[str, Any]) -> None:
        self._events.append(event)
        params = event.get("params", {})
        method = event["method"]
        if method == "Network.responseReceived" and params.get("type") == "Document" \
                and self.page.response is None:
            resp = params["response"]
            self.page.response = Response(
                url=resp["url"], status=int(resp["status"]),
                headers={k.lower(): v for k, v in resp.get("headers", {}).items()})
        elif method == "Log.entryAdded":
            entry = params["entry"]
            self.page.messages.append(f"{entry['level']} {entry['source']}: {entry['text']}")
        elif method == "Runtime.consoleAPICalled":
            text = " ".join(str(a.get("value", a.get("description", "")))
                            for a in params.get("args", []))
            self.page.messages.append(f"{params['type']} console-api: {text}")
        elif method == "Runtime.exceptionThrown":
            details = params["exceptionDetails"]
            self.page.messages.append(f"error exception: {details.get('text', '')}")

    def wait_event(self, method: str, timeout: float | None = None,
                   since: int = 0) -> dict[str, Any]:
        """The first event `method` at or after index `since` of those received."""
        end = time.monotonic() + (timeout or self.timeout)
        at = since
        while True:
            for n in range(at, len(self._events)):
                if self._events[n]["method"] == method:
                    return self._events[n]
            at = len(self._events)
            reply = self._receive(end, f"waiting for {method}")
            if "method" in reply:
                self._event(reply)

    # --- what a test asks ---------------------------------------------------------------
    def navigate(self, url: str, timeout: float | None = None) -> Page:
        """Load `url` and wait for its load event; the page's response and messages."""
        self.page = Page()
        self._events.clear()  # a navigation's events only
        result = self.send("Page.navigate", {"url": url}, timeout=timeout)
        if result.get("errorText"):
            raise CDPError(f"navigate {url}: {result['errorText']}")
        self.wait_event("Page.loadEventFired", timeout=timeout)
        return self.page

    def wait_next_load(self, timeout: float | None = None) -> None:
        """Until the page loads again by itself (a meta refresh, say), from now on."""
        self.wait_event("Page.loadEventFired", timeout=timeout, since=len(self._events))

    def evaluate(self, expression: str, timeout: float | None = None) -> Any:
        """The value of `expression` in the page (a promise is awaited), as JSON gives it."""
        result = self.send("Runtime.evaluate",
                           {"expression": expression, "returnByValue": True,
                            "awaitPromise": True, "userGesture": False},
                           timeout=timeout)
        if "exceptionDetails" in result:
            details = result["exceptionDetails"]
            text = details.get("exception", {}).get("description") or details.get("text")
            raise JSError(f"{expression[:80]!r} threw: {text}")
        return result["result"].get("value")

    def set_viewport(self, width: int, height: int, mobile: bool = False,
                     scale: float = 1.0) -> None:
        self.send("Emulation.setDeviceMetricsOverride",
                  {"width": width, "height": height, "deviceScaleFactor": scale,
                   "mobile": mobile})

    def color_scheme(self, scheme: str | None) -> None:
        """Emulate `prefers-color-scheme: dark` or `light`; None: the browser's own."""
        features = [{"name": "prefers-color-scheme", "value": scheme}] if scheme else []
        self.send("Emulation.setEmulatedMedia", {"media": "", "features": features})

    def screenshot(self, full_page: bool = True) -> bytes:
        """The page as PNG; the whole of it when `full_page`, else the viewport."""
        params: dict[str, Any] = {"format": "png"}
        if full_page:
            metrics = self.send("Page.getLayoutMetrics")
            size = metrics["cssContentSize"]
            params.update(captureBeyondViewport=True,
                          clip={"x": 0, "y": 0, "width": size["width"],
                                "height": size["height"], "scale": 1})
        data = self.send("Page.captureScreenshot", params)["data"]
        return base64.b64decode(data)
