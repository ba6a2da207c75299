"""The verdict `gpuguard slurm` acts on: the running daemon's (its status socket) when one
answers, else a cold judgement of this host (or of a replayed --input) through the one
judgement every consumer shares (gpuguard/assess/once.py). Either is the one Verdict type
(gpuguard/model/results.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gpuguard.model.results import Verdict


def from_daemon(socket_path: str, timeout: float) -> Verdict | None:
    """The daemon's verdict, or None when no daemon answers (or it has none yet, or its
    answer is not a verdict)."""
    from gpuguard.daemon import socket_client
    from gpuguard.model.results import Verdict

    try:
        reply = socket_client.ask(socket_path, {"want": "results"}, timeout)
    except socket_client.NoDaemon:
        return None
    try:
        return Verdict.from_json(reply)
    except ValueError:
        return None
