"""Where the daemon's verdict goes besides HTTP: the local socket that `gpuguard status`
and `gpuguard slurm health` read (verdict_socket.py) and node-problem-detector's
condition files (verdict_files.py). Both are off unless their option names a path."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gpuguard.daemon.freshness import Freshness
from gpuguard.daemon.latest import LatestResults
from gpuguard.daemon.verdict_files import VerdictFiles
from gpuguard.daemon.verdict_socket import VerdictSocket
from gpuguard.daemon.verdict_view import DaemonView, daemon_verdict
from gpuguard.model.snapshot import Snapshot


class VerdictPublisher:
    def __init__(self, store: LatestResults, freshness: Callable[[], Freshness],
                 rule_ids: Callable[[], list[str]], failover_rules: Callable[[], list[str]],
                 snapshot: Callable[[], Snapshot | None], cycle_s: Callable[[], float],
                 socket_path: Path | None, group: str | None, npd_dir: Path | None) -> None:
        self.store = store
        self.freshness = freshness
        view = DaemonView(store.by_cadence, freshness, rule_ids, failover_rules, snapshot,
                          cycle_s, os.getpid())
        self.view = view
        self.socket = VerdictSocket(socket_path, group, view) if socket_path else None
        self.files = VerdictFiles(npd_dir) if npd_dir else None

    @classmethod
    def of(cls, daemon: Any) -> VerdictPublisher:
        """The daemon's (gpuguard/daemon/app.py): its NPD files follow every change of
        its latest results."""
        cfg = daemon.cfg

        def rules(tag: str | None = None) -> list[str]:
            config = daemon.current()[0]
            return [] if config is None else [
                r.id for r in config[1].rules.values() if tag is None or tag in r.tags]

        publisher = cls(daemon.store, lambda: daemon.freshness,
                        rules, lambda: rules("failover"), lambda: daemon.current()[1],
                        lambda: float(daemon.stats.cycle_duration_s.get("fast", 0.0)),
                        cfg.status_socket, cfg.status_group, cfg.npd_dir)
        if publisher.files is not None:
            daemon.store.on_change = publisher.after_cycle
        return publisher

    def start(self) -> None:
        """OSError when the socket cannot be made: the daemon exits 1, as for its port."""
        if self.socket is not None:
            self.socket.start()

    def after_cycle(self) -> None:
        """NPD's files from the daemon's verdict, the one the socket serves."""
        if self.files is not None:
            fresh = self.freshness()
            verdict, ages = daemon_verdict(self.store.by_cadence(), fresh,
                                           time.monotonic(),
                                           frozenset(self.view.failover_rules()),
                                           self.view.pid)
            self.files.write_verdict(verdict, ages, fresh)

    def stop(self) -> None:
        if self.socket is not None:
            self.socket.stop()
