"""One owner of "judge this host once" (issue 27): the rule engine and the history step
are called from gpuguard/assess/ only, and exactly one class is named Verdict."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.conftest import REPO

PACKAGE = REPO / "gpuguard"
# name called -> the modules that may call it (besides the one defining it)
OWNERS = {
    "evaluate": {"gpuguard/assess/once.py"},               # the rule engine
    "with_history": {"gpuguard/assess/history.py"},        # a cold path's history
    "forget_acknowledged": {"gpuguard/assess/once.py"},    # the GPUs an ack took out
}
# the recorder's history step: `recorder.apply` is the History the daemon hands over;
# its own implementation (on_cycle) is called only there
RECORDER_STEP = "on_cycle"
# the store's history computed by its two implementations only
APPLY_HISTORY = {"gpuguard/events/commands.py", "gpuguard/daemon/recorder.py"}


def calls(tree: ast.AST) -> list[tuple[str, ast.Call]]:
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            fn = node.func
            name = fn.id if isinstance(fn, ast.Name) else \
                fn.attr if isinstance(fn, ast.Attribute) else None
            if name is not None:
                out.append((name, node))
    return out


def offenders(root: Path = PACKAGE) -> list[str]:
    found = []
    for path in sorted(root.rglob("*.py")):
        where = str(path.relative_to(root.parent))
        tree = ast.parse(path.read_text())
        defined = {n.name for n in ast.walk(tree)
                   if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)}
        for name, node in calls(tree):
            if name in OWNERS and where not in OWNERS[name] and name not in defined:
                found.append(f"{where}:{node.lineno}: calls {name}")
            if name == "apply_history" and where not in APPLY_HISTORY and \
                    name not in defined:
                found.append(f"{where}:{node.lineno}: calls apply_history")
            if name == RECORDER_STEP and isinstance(node.func, ast.Attribute) and \
                    isinstance(node.func.value, ast.Attribute | ast.Name) and \
                    "recorder" in ast.unparse(node.func.value) and \
                    where != "gpuguard/daemon/recorder.py":
                found.append(f"{where}:{node.lineno}: calls the recorder's on_cycle")
    return found


def test_the_rules_and_the_history_step_are_called_from_assess_only():
    assert offenders() == []


def test_the_owner_test_can_fail(tmp_path):
    """A module outside assess/ that evaluates the rules, or applies the history itself."""
    pkg = tmp_path / "gpuguard" / "cli"
    pkg.mkdir(parents=True)
    (pkg / "rogue.py").write_text(
        "from gpuguard.judge.engine import evaluate\n"
        "def f(s, r, p, recorder):\n"
        "    results = evaluate(s, r, p)\n"
        "    return recorder.on_cycle(results, {}, r)\n")
    assert offenders(tmp_path / "gpuguard") == [
        "gpuguard/cli/rogue.py:3: calls evaluate",
        "gpuguard/cli/rogue.py:4: calls the recorder's on_cycle"]


def test_exactly_one_class_is_named_verdict():
    named = [f"{p.relative_to(REPO)}:{n.lineno}" for p in sorted(PACKAGE.rglob("*.py"))
             for n in ast.walk(ast.parse(p.read_text()))
             if isinstance(n, ast.ClassDef) and n.name == "Verdict"]
    assert named == ["gpuguard/model/results.py:" + named[0].rsplit(":", 1)[-1]], named
