"""Size and complexity limits of gpuguard/ (issue 19), checked in CI: no module over 400
lines, no function above cyclomatic complexity 15 as radon measures it."""

from __future__ import annotations

from pathlib import Path

from radon.complexity import cc_visit

from tests.conftest import REPO

MAX_LINES = 400
MAX_COMPLEXITY = 15
# path -> why it may be longer: generated files only (none today)
LONG_ALLOWED: dict[str, str] = {}


def modules() -> list[Path]:
    return sorted((REPO / "gpuguard").rglob("*.py"))


def complexities() -> dict[tuple[str, str], int]:
    found: dict[tuple[str, str], int] = {}
    for path in modules():
        where = str(path.relative_to(REPO))
        for block in cc_visit(path.read_text()):
            for item in [block, *getattr(block, "methods", []), *getattr(block, "closures", [])]:
                if item.__class__.__name__ == "Class":
                    continue
                name = item.fullname if hasattr(item, "fullname") else item.name
                found[(where, name)] = max(found.get((where, name), 0), item.complexity)
    return found


def test_no_module_over_400_lines():
    lengths = {str(p.relative_to(REPO)): len(p.read_text().splitlines()) for p in modules()}
    over = {p for p, n in lengths.items() if n > MAX_LINES} - set(LONG_ALLOWED)
    assert over == set(), {p: lengths[p] for p in over}


def test_no_function_above_complexity_15():
    found = complexities()
    over = {key: value for key, value in found.items() if value > MAX_COMPLEXITY}
    assert over == {}


def test_the_measure_sees_a_complex_function():
    source = "def f(x):\n" + "".join(f"    if x == {i}:\n        return {i}\n"
                                     for i in range(20)) + "    return -1\n"
    [block] = cc_visit(source)
    assert block.complexity > MAX_COMPLEXITY
