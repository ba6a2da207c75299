"""A qualify run's lines and samples as one `qualify` reading per GPU (the shape is in
gpuguard/model/snapshot.py and docs/qualify.md): what was measured, and for what was
not, an error saying why (the CUDA error, the phase that hung, the signal, the stop)."""

from __future__ import annotations

from dataclasses import dataclass, field

from gpuguard.sources import cuda_api

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

SECTIONS = ("compute", "located", "memtest", "bandwidth", "peers")


@dataclass
class GpuRun:
    """What one GPU's worker said."""

    sections: dict[str, Any] = field(default_factory=dict)
    phases: dict[str, float] = field(default_factory=dict)
    started: list[str] = field(default_factory=list)
    load: tuple[float | None, float | None] = (None, None)
    error: dict[str, Any] | None = None
    ended: bool = False

    def take(self, msg: dict[str, Any]) -> None:
        handler = getattr(self, f"on_{msg.get('t')}", None)
        if handler is not None and str(msg.get("t")).isidentifier():
            handler(msg)

    def on_start(self, msg: dict[str, Any]) -> None:
        self.started.append(str(msg.get("phase")))

    def on_phase(self, msg: dict[str, Any]) -> None:
        if isinstance(msg.get("ms"), int | float):
            self.phases[str(msg.get("phase"))] = float(msg["ms"])

    def on_result(self, msg: dict[str, Any]) -> None:
        if msg.get("section") in SECTIONS:
            self.sections[str(msg["section"])] = msg.get("value")

    def on_load(self, msg: dict[str, Any]) -> None:
        if isinstance(msg.get("mono"), int | float):
            self.load = (float(msg["mono"]), self.load[1])

    def on_unload(self, msg: dict[str, Any]) -> None:
        if isinstance(msg.get("mono"), int | float):
            self.load = (self.load[0], float(msg["mono"]))

    def on_cuda_error(self, msg: dict[str, Any]) -> None:
        if self.error is None:
            code = msg.get("code") if isinstance(msg.get("code"), int) else None
            self.error = {"kind": "cuda", "phase": str(msg.get("phase")), "code": code,
                          "text": str(msg.get("error"))[:300]}

    def on_fatal(self, msg: dict[str, Any]) -> None:
        if self.error is None:
            self.error = {"kind": "fatal", "phase": self.phase(), "code": None,
                          "text": str(msg.get("error"))[:300]}

    def on_end(self, msg: dict[str, Any]) -> None:
        self.ended = True

    def phase(self) -> str:
        return self.started[-1] if self.started else "start"


def gather(messages: list[dict[str, Any]]) -> dict[int, GpuRun]:
    runs: dict[int, GpuRun] = {}
    for msg in messages:
        gpu = msg.get("gpu")
        if isinstance(gpu, int):
            runs.setdefault(gpu, GpuRun()).take(msg)
    return runs


def unfinished(run: GpuRun, why: str, kind: str, where: str) -> dict[str, Any]:
    """The error of a worker that did not reach its end: where it was, and why."""
    at = where or f"phase {run.phase()}"
    return {"kind": kind, "phase": run.phase(), "code": None, "text": f"{why} ({at})"}


def reading(run: GpuRun, level: str, drill: int | None, targets: dict[str, Any] | None,
            load: dict[str, Any] | None, ending: dict[str, Any] | None) -> dict[str, Any]:
    """The GPU's `qualify` reading. `ending`: the error of a worker that hung, died or
    was stopped (it vouches for nothing after its last finished phase)."""
    value: dict[str, Any] = {"level": level, "refused": None,
                             "drill": None if drill is None else {"sm": drill},
                             "error": ending or run.error, "targets": targets}
    for name in ("compute", "memtest", "bandwidth", "peers"):
        if name in run.sections:
            value[name] = run.sections[name]
    if "compute" in value and isinstance(value["compute"], dict):
        value["compute"] = {**value["compute"], "located": run.sections.get("located")}
    if load is not None:
        value["load"] = load
    if value["error"] is not None and value["error"].get("kind") == "cuda":
        code = value["error"].get("code")
        value["error"]["meaning"] = cuda_api.describe(code) if isinstance(code, int) else ""
    value["phases_ms"] = run.phases
    return value


def refused(level: str, why: str) -> dict[str, Any]:
    return {"level": level, "refused": why, "drill": None, "error": None, "targets": None}
