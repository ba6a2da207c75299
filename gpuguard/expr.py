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


class Condition:
    def __init__(self, source: str, allowed_names: Iterable[str]) -> None:
        self.source = source
        self._evaluator = EvalWithCompoundTypes(names={}, functions=FUNCTIONS)
        try:
            self._parsed = self._evaluator.parse(source)
        except SyntaxError as exc:
            raise ConditionError(f"invalid expression {source!r}: {exc.msg}") from exc
        allowed = set(allowed_names)
        used = {n.id for n in ast.walk(self._parsed) if isinstance(n, ast.Name)}
        self.names = frozenset(used - set(FUNCTIONS) - {"True", "False", "None"})
        unknown = sorted(self.names - allowed)
        if unknown:
            raise ConditionError(
                f"unknown field(s) {', '.join(unknown)} in {source!r}; "
                "see `gpuguard rules fields` for the names a condition can use"
            )

    def evaluate(self, names: dict[str, Any]) -> Any:
        self._evaluator.names = names
        try:
            return self._evaluator.eval(self.source, previously_parsed=self._parsed)
        except (InvalidExpression, TypeError, ValueError, ZeroDivisionError) as exc:
            raise ConditionError(f"{self.source!r}: {exc}") from exc
