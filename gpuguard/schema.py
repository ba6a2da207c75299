"""Typed config documents: a YAML tree checked against msgspec Structs, errors as file:line.

A config kind declares its shape once, as Structs with `forbid_unknown_fields=True`
(a misspelled key is an error, never silently ignored), and calls `convert`. msgspec
names the failing place by a path (`$.services[0].probe.timeot`); the YAML tree from
gpuguard.yamlfile remembers the line of every key, so the path is walked back to the
line the user has to fix.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, TypeVar

import msgspec

from gpuguard.yamlfile import ConfigError, Mapping

T = TypeVar("T")

# "Expected `int`, got `str` - at `$.services[0].probe.status`"
# "Expected `str` - at `key` in `$.services[0]`" (a key that is not text)
_AT = re.compile(r"^(?P<what>.*?) - at `(?P<key>key` in `)?(?P<path>\$[^`]*)`$", re.DOTALL)
_UNKNOWN = re.compile(r"^Object contains unknown field `(?P<field>.*)`$", re.DOTALL)
_MISSING = re.compile(r"^Object missing required field `(?P<field>.*)`$", re.DOTALL)
# one step of a path: `.name`, `[3]` or `[...]` (a dict value msgspec does not name)
_STEP = re.compile(r"\.(?P<field>[A-Za-z_][A-Za-z0-9_]*)|\[(?P<index>\d+)\]|\[\.\.\.\]")


def convert(doc: Any, type_: type[T], path: str | Path) -> T:
    """`doc` (a gpuguard.yamlfile tree) as `type_`; any mismatch is a ConfigError that
    names the file, the line of the offending key and what is wrong with it."""
    try:
        return msgspec.convert(doc, type_)
    except msgspec.ValidationError as exc:
        line, problem = locate(doc, str(exc))
        raise ConfigError(path, line, problem) from exc


def locate(doc: Any, message: str) -> tuple[int | None, str]:
    """The line and a readable problem for one msgspec validation message."""
    match = _AT.match(message)
    if match is None:  # the document itself has the wrong type
        return getattr(doc, "line", None) or None, _lower_first(message)
    what, steps = match["what"], _steps(match["path"])
    line, node = _walk(doc, steps)
    where = _dotted(steps)
    if (unknown := _UNKNOWN.match(what)) is not None:
        field = unknown["field"]
        if isinstance(node, Mapping):
            line = node.line_of(field)
        return line, f"{_join(where, field)}: unknown key"
    if (missing := _MISSING.match(what)) is not None:
        # the line that introduced the object (its key), where the field should be added
        return line, f"{_join(where, missing['field'])} is missing"
    if match["key"]:
        if isinstance(node, Mapping):
            line = next((node.line_of(k) for k in node if not isinstance(k, str)), line)
        return line, f"{where or 'the document'}: every key must be text"
    return line, f"{where or 'the document'}: {_lower_first(what)}"


def _steps(path: str) -> list[str | int | None]:
    """`$.a[0].b[...]` as ["a", 0, "b", None]; None is a dict value msgspec leaves unnamed."""
    out: list[str | int | None] = []
    for step in _STEP.finditer(path, 1):
        if step["field"] is not None:
            out.append(step["field"])
        elif step["index"] is not None:
            out.append(int(step["index"]))
        else:
            out.append(None)
    return out


def _walk(doc: Any, steps: list[str | int | None]) -> tuple[int | None, Any]:
    """The line of the last key on the path that the tree knows, and the node there."""
    node = doc
    line: int | None = getattr(doc, "line", None) or None
    for step in steps:
        if isinstance(step, str) and isinstance(node, Mapping) and step in node:
            line = node.line_of(step)
            node = node[step]
        elif isinstance(step, int) and isinstance(node, list) and step < len(node):
            node = node[step]
            # a list item has no key: a mapping item knows its own line; a scalar item
            # keeps the line of the list's key
            if isinstance(node, Mapping):
                line = node.line
        else:
            break
    return line, node


def _dotted(steps: list[str | int | None]) -> str:
    text = ""
    for step in steps:
        if isinstance(step, int):
            text += f"[{step}]"
        elif step is None:
            text += "[...]"
        else:
            text += f".{step}" if text else step
    return text


def _join(where: str, field: str) -> str:
    return f"{where}.{field}" if where else field


def _lower_first(text: str) -> str:
    return text[:1].lower() + text[1:]
