"""The chart of a qualify run (`--chart FILE`): power against the enforced limit, SM and
memory clocks, GPU and HBM temperatures against the memory's limit, one line per GPU,
drawn by gpuguard/outputs/svg_chart.py."""

from __future__ import annotations

from gpuguard.outputs.svg_chart import Band, Limit, Panel, Series, chart

TYPE_CHECKING = False
if TYPE_CHECKING:
    from gpuguard.model.snapshot import Snapshot
    from gpuguard.qualify.run import Outcome

# (panel title, unit, the sampler's series names drawn in it)
PANELS = (
    ("Power", "W", ("power_w",)),
    ("SM clock", "MHz", ("sm_mhz",)),
    ("Memory clock", "MHz", ("mem_mhz",)),
    ("Temperature", "C", ("gpu_temp_c", "hbm_temp_c")),
)
SHORT = {"gpu_temp_c": "core", "hbm_temp_c": "HBM"}


def draw(snapshot: Snapshot, outcome: Outcome) -> str:
    panels = []
    for title, unit, names in PANELS:
        series = []
        for index in sorted(outcome.series):
            for name in names:
                points = outcome.series[index].get(name)
                if points:
                    suffix = f" {SHORT[name]}" if name in SHORT else ""
                    series.append(Series(f"GPU {index}{suffix}", points, unit))
        panels.append(Panel(title, unit, series, _limits(title, outcome)))
    host = snapshot.host.hostname or "this host"
    level = outcome.options.get("level", "")
    # the load of the first GPU (all start together; the copies come before it and the
    # memory test after)
    bands = [Band("load", *outcome.windows[index]) for index in sorted(outcome.windows)[:1]]
    return chart(panels, f"gpuguard qualify {level} on {host}", bands=bands)


def _limits(title: str, outcome: Outcome) -> list[Limit]:
    """The enforced power limit and the HBM limit each GPU's load summary gives (one line
    per distinct value: eight GPUs of one model share theirs)."""
    key, label = {"Power": ("power_limit_w", "enforced power limit"),
                  "Temperature": ("hbm_temp_limit_c", "HBM limit")}.get(title, ("", ""))
    if not key:
        return []
    values = set()
    for reading in outcome.readings.values():
        load = reading.get("load")
        if isinstance(load, dict) and isinstance(load.get(key), int | float):
            values.add(float(load[key]))
    return [Limit(f"{label} {value:g}", value) for value in sorted(values)]
