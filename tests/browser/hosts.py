"""The two hosts the status page is shown for: a healthy replayed H200 and a faulty one,
each served by the real daemon (tests/daemon/conftest.py's DaemonProcess) with
`--status-page` on a free loopback port."""

from __future__ import annotations

import contextlib
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

from tests.daemon.conftest import LIVE, DaemonProcess, host_snapshot, write_snapshot

HOSTS = ("healthy", "faulty")
FAULTY_GPU = 1
FAULTY_RULE = "pcie.link_width"
# Viewports: a desktop, and a phone 360 CSS px wide (the "readable at 360 px").
DESKTOP = (1280, 800)
PHONE = (360, 740)


def host_input(kind: str, folder: Path) -> Path:
    """The replayed snapshot of host `kind`. healthy: the real H200 recording as it is.
    faulty: two GPUs from it, GPU 1 busy on a x8 link of a x16 slot (pcie.link_width is
    critical there, and only there)."""
    if kind == "healthy":
        return LIVE
    if kind != "faulty":
        raise ValueError(kind)
    path = folder / "faulty-snapshot.json"
    write_snapshot(path, host_snapshot(gpus=2, changes={
        (FAULTY_GPU, "pcie_link_width_current"): 8,
        (FAULTY_GPU, "utilization_gpu_percent"): 100}))
    return path


def _page_served(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as resp:
            return bool(resp.status == 200 and b"data-state" in resp.read())
    except (urllib.error.URLError, OSError):
        return False


@contextlib.contextmanager
def status_page(kind: str, folder: Path, fast_interval: float = 5.0,
                timeout: float = 20.0) -> Iterator[DaemonProcess]:
    """The daemon serving host `kind`'s page, stopped (SIGTERM, waited) at the end. The
    page reloads itself every fast interval (5 s at least): the tests ask for 60 s, so
    that no reload lands in the middle of a test's look at a page."""
    folder.mkdir(parents=True, exist_ok=True)
    snapshot = host_input(kind, folder)
    daemon = DaemonProcess(["--input", str(snapshot), "--status-page",
                            "--fast-interval", str(fast_interval)], {}, folder)
    try:
        daemon.wait_healthy(timeout)
        end = time.monotonic() + timeout
        while not _page_served(daemon.url + "/"):
            assert daemon.proc.poll() is None, daemon.log.read_text()[-3000:]
            assert time.monotonic() < end, "no status page at / within the deadline: " \
                + daemon.log.read_text()[-3000:]
            time.sleep(0.1)
        yield daemon
    finally:
        daemon.stop()


@contextlib.contextmanager
def status_pages(folder: Path, fast_interval: float = 5.0
                 ) -> Iterator[dict[str, DaemonProcess]]:
    """Both hosts' daemons at once: {"healthy": ..., "faulty": ...}."""
    with contextlib.ExitStack() as stack:
        yield {kind: stack.enter_context(status_page(kind, folder / kind, fast_interval))
               for kind in HOSTS}
