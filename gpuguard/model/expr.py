"""`when:` conditions of user rules: compiled once at load, evaluated by simpleeval.

simpleeval walks Python's own AST with a whitelist of node types and no access to
dunder attributes; we never call eval() and never write a parser of our own.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable
from typing import Any

from simpleeval import EvalWithCompoundTypes, InvalidExpression

FUNCTIONS: dict[str, Any] = {
    "abs": abs, "min": min, "max": max, "len": len, "int": int, "float": float,
    "str": str, "round": round,
}


class ConditionError(ValueError):
    pass


# A condition is one line of comparisons: longer or deeper is a mistake or an attack (a
# 200k-deep expression costs gigabytes in Python's parser before it fails).
MAX_SOURCE = 1000
MAX_NODES = 300
MAX_NESTING = 50


class Condition:
    def __init__(self, source: str, allowed_names: Iterable[str]) -> None:
        self.source = source
        self._evaluator = EvalWithCompoundTypes(names={}, functions=FUNCTIONS)
        shown = source if len(source) <= 60 else source[:57] + "..."
        if not source.strip():
            raise ConditionError("the condition is empty")
        if len(source) > MAX_SOURCE:
            raise ConditionError(f"the condition is {len(source)} characters long; at most "
                                 f"{MAX_SOURCE}")
        if _nesting(source) > MAX_NESTING:
            raise ConditionError(f"the condition nests brackets deeper than {MAX_NESTING}")
        try:
            self._parsed = self._evaluator.parse(source)
        except SyntaxError as exc:
            raise ConditionError(f"invalid expression {shown!r}: {exc.msg}") from exc
        except Exception as exc:  # simpleeval's own errors, RecursionError, MemoryError
            raise ConditionError(f"invalid expression {shown!r}: {exc}") from exc
        nodes = list(ast.walk(self._parsed))
        if len(nodes) > MAX_NODES:
            raise ConditionError(f"the condition has {len(nodes)} parts; at most {MAX_NODES}")
        allowed = set(allowed_names)
        used = {n.id for n in nodes if isinstance(n, ast.Name)}
        self.names = frozenset(used - set(FUNCTIONS) - {"True", "False", "None"})
        unknown = sorted(self.names - allowed)
        if unknown:
            raise ConditionError(
                f"unknown field(s) {', '.join(unknown)} in {source!r}; "
                "see `gpuguard rules fields` for the names a condition can use"
            )

    def evaluate(self, names: dict[str, Any]) -> Any:
        """The condition's value; any failure of simpleeval is a ConditionError (unknown)."""
        self._evaluator.names = names
        try:
            return self._evaluator.eval(self.source, previously_parsed=self._parsed)
        except (InvalidExpression, TypeError, ValueError, ZeroDivisionError, ArithmeticError,
                RecursionError, MemoryError) as exc:
            raise ConditionError(f"{self.source!r}: {exc}") from exc


def _nesting(source: str) -> int:
    depth = deepest = 0
    for char in source:
        if char in "([{":
            depth += 1
            deepest = max(deepest, depth)
        elif char in ")]}":
            depth -= 1
    return deepest
