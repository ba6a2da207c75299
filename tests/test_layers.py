"""The layers of gpuguard/ (docs/architecture.md): imports point down only, and no two
modules import each other, directly or around a loop. This list is the rule; the doc
explains it."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.conftest import REPO

# Lowest first. A module may import its own layer and the layers below it.
LAYERS = (
    "io",            # atomic writes, bounded reads, the host's paths, pipes, forked workers
    "model",         # the snapshot and its readings, results, rules, the GPU identity
    "judge",         # the check registry, the engine, actions, Xid grading, trends
    "config",        # YAML files, schemas, the profile, the rule pack
    "sources",       # NVML, replays, the kernel log, sysfs, procfs, toolkit, Docker
    "checks",        # one module per rule family
    "events",        # the event store, recording, escalation
    "assess",        # judge this host once: inputs, collection, rules, history, GPUs seen
    "outputs",       # table, JSON, Prometheus
    "qualify",       # gpuguard qualify: the run on the GPUs, its evidence and chart
    "supervisor",    # failover to CPU and back
    "daemon",        # cycles, HTTP, metrics, the recorder thread
    "integrations",  # schedulers acting on the verdict (Slurm, Kubernetes)
    "cli",           # the command line
)
PACKAGE = REPO / "gpuguard"


def module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def imports_of(path: Path, known: set[str]) -> set[str]:
    """Every gpuguard module this file imports, at the top, in a function or for typing."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("gpuguard"))
        elif isinstance(node, ast.ImportFrom) and node.module and \
                node.module.startswith("gpuguard"):
            for alias in node.names:
                sub = f"{node.module}.{alias.name}"
                found.add(sub if sub in known else node.module)
    return {m for m in found if m in known}


def layer_of(module: str) -> int | None:
    """None for the package's root modules (__init__: the version; __main__: the top)."""
    parts = module.split(".")
    if len(parts) < 2 or parts[1] not in LAYERS:
        return None
    return LAYERS.index(parts[1])


def graph() -> dict[str, set[str]]:
    mods = modules()
    return {name: imports_of(path, set(mods)) for name, path in mods.items()}


def test_every_package_is_a_layer():
    packages = {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").exists()}
    assert packages == set(LAYERS)
    roots = {p.name for p in PACKAGE.glob("*.py")}
    assert roots == {"__init__.py", "__main__.py"}, "a module at the root belongs in a layer"


def test_imports_point_down_only():
    upward = []
    for module, targets in graph().items():
        mine = layer_of(module)
        for target in sorted(targets):
            theirs = layer_of(target)
            if mine is not None and theirs is not None and theirs > mine:
                upward.append(f"{module} ({LAYERS[mine]}) imports {target} ({LAYERS[theirs]})")
    assert upward == []


def test_no_import_cycles():
    edges = graph()
    cycles = [c for c in strongly_connected(edges) if len(c) > 1]
    assert cycles == []


def strongly_connected(edges: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's algorithm: the groups of modules that reach each other."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.append(w)
                if w == v:
                    break
            groups.append(sorted(group))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return groups


def test_the_checker_sees_an_upward_import_and_a_cycle():
    """The two tests above can fail: a made-up graph with one of each."""
    fake = {"gpuguard.model.a": {"gpuguard.cli.main"}, "gpuguard.cli.main": {"gpuguard.model.a"}}
    assert layer_of("gpuguard.model.a") < layer_of("gpuguard.cli.main")
    assert [c for c in strongly_connected(fake) if len(c) > 1] == [
        ["gpuguard.cli.main", "gpuguard.model.a"]]
