"""The one choice of renderer by `--format`: `gpuguard check` renders its own verdict with
it, and the daemon renders its latest verdict with it for `gpuguard status`, so the two
cannot print differently."""

from __future__ import annotations

from collections.abc import Callable

FORMATS = ("table", "json", "prometheus")


def renderer(fmt: str) -> Callable[..., str]:
    """render(snapshot, verdict, duration_s=, colour=, quiet=, width=) -> text. Each
    renderer module is imported only when asked for (prometheus_client costs ~30 ms)."""
    if fmt == "json":
        from gpuguard.outputs import json_out

        return lambda snapshot, verdict, **_: json_out.render(snapshot, verdict)
    if fmt == "prometheus":
        from gpuguard.outputs import prometheus

        return lambda snapshot, verdict, duration_s, **_: prometheus.render(
            snapshot, verdict, duration_s)
    from gpuguard.outputs import table

    return lambda snapshot, verdict, colour, quiet, width=None, **_: table.render(
        snapshot, verdict, colour, quiet, width)
