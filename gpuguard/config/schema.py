"""Typed config documents: a YAML tree checked against msgspec Structs, errors as file:line.

A config kind declares its shape once, as Structs with `forbid_unknown_fields=True`
(a misspelled key is an error, never silently ignored), and calls `convert`. msgspec
names the failing place by a path (`$.services[0].probe.timeot`); the YAML tree from
gpuguard.config.yamlfile remembers the line of every key, so the path is walked back to the
line the user has to fix.

A field may say in words what it takes, `Annotated[str, msgspec.Meta(description="a
quoted version such as \"570.86.15\"")]`; a wrong value there reads `driver: min_version
must be a quoted version such as "570.86.15", not 570.86`. A `Literal` lists its choices
the same way, and an unknown key lists the keys its place allows.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import msgspec

from gpuguard.config.yamlfile import ConfigError, Mapping, short

if TYPE_CHECKING:
    from msgspec.inspect import Type

T = TypeVar("T")

# The patterns below are compiled on first use (re caches them): they serve only the
# error path, and `gpuguard check` imports this module on every run.
# "Expected `int`, got `str` - at `$.services[0].probe.status`"
# "Expected `str` - at `key` in `$.services[0]`" (a key that is not text)
_AT = r"^(?P<what>.*?) - at `(?P<key>key` in `)?(?P<path>\$[^`]*)`$"
_UNKNOWN = r"^Object contains unknown field `(?P<field>.*)`$"
_MISSING = r"^Object missing required field `(?P<field>.*)`$"
# a value of the wrong type, out of its bounds, or not one of a Literal's choices
_WRONG = r"^(Expected |Invalid enum value )"
# one step of a path: `.name`, `[3]` or `[...]` (a dict value msgspec does not name)
_STEP = r"\.(?P<field>[A-Za-z_][A-Za-z0-9_]*)|\[(?P<index>\d+)\]|\[\.\.\.\]"


class DictKey:
    """A key of a free-form mapping (`dict[str, X]`): msgspec's path writes `[...]` for
    it; `convert` finds which key it was."""

    __slots__ = ("key",)

    def __init__(self, key: Any) -> None:
        self.key = key


# a field name, a list index, a mapping's key, or a mapping's key not (yet) known
Step = str | int | DictKey | None


def convert(doc: Any, type_: type[T], path: str | Path) -> T:
    """`doc` (a gpuguard.config.yamlfile tree) as `type_`; any mismatch is a ConfigError that
    names the file, the line of the offending key and what is wrong with it."""
    try:
        return msgspec.convert(doc, type_)
    except msgspec.ValidationError as exc:
        line, problem = locate(doc, str(exc), type_)
        raise ConfigError(path, line, problem) from exc


def locate(doc: Any, message: str, type_: Any = None) -> tuple[int | None, str]:
    """The line and a readable problem for one msgspec validation message; with the
    `type_` that was converted to, the keys of mappings are found and choices listed."""
    what, path, key_error = _parse(message)
    steps = _steps(path)
    bad_key = None
    if type_ is not None:
        steps = _name_keys(doc, type_, steps, message)
        if key_error:
            bad_key = _find_key(doc, type_, steps, message)
    line, node, reached = _walk(doc, steps)
    where = _dotted(steps)
    if (unknown := re.match(_UNKNOWN, what, re.DOTALL)) is not None:
        allowed = _fields(_type_at(type_, steps)) if type_ is not None else []
        return _unknown_key(line, node, where, unknown["field"], allowed)
    if (missing := re.match(_MISSING, what, re.DOTALL)) is not None:
        # the line that introduced the object (its key), where the field should be added
        return line, f"{_join(where, missing['field'])} is missing"
    if key_error:
        return _bad_key(line, node, where, what, bad_key)
    if (wrong := _wrong_value(type_, steps, what, node, reached)) is not None:
        return line, wrong
    return line, f"{where}: {_lower_first(what)}" if where else _lower_first(what)


def _parse(message: str) -> tuple[str, str, bool]:
    """What msgspec says is wrong, the path where, and whether a key (not a value) is."""
    match = re.match(_AT, message, re.DOTALL)
    if match is None:
        # without ` - at ...` the message is about the document itself
        return message, "$", False
    return match["what"], match["path"], bool(match["key"])


def _unknown_key(line: int | None, node: Any, where: str, field: str,
                 allowed: list[str]) -> tuple[int | None, str]:
    if isinstance(node, Mapping):
        line = node.line_of(field)
    hint = f" (allowed: {', '.join(allowed)})" if allowed else ""
    return line, f"{_join(where, field)}: unknown key{hint}"


def _bad_key(line: int | None, node: Any, where: str, what: str,
             bad_key: Any) -> tuple[int | None, str]:
    """A key of the wrong type; `bad_key` as found by converting entry by entry, if it was."""
    if isinstance(node, Mapping):
        if bad_key is None:
            bad_key = next((k for k in node if not isinstance(k, str)), None)
        if bad_key is not None:
            line = node.line_of(bad_key)
    if what.startswith("Expected `str`"):
        return line, f"{where or 'the document'}: every key must be text"
    return line, f"{where or 'the document'}: key {short(bad_key)}: {_lower_first(what)}"


def _wrong_value(type_: Any, steps: list[Step], what: str, node: Any,
                 reached: bool) -> str | None:
    """A wrong value in words, where its field says what it takes; else None."""
    if type_ is None or not reached or not re.match(_WRONG, what):
        return None
    expected = _expected(_type_at(type_, steps))
    return f"{_subject(steps)} must be {expected}, not {short(node)}" if expected else None


def _steps(path: str) -> list[Step]:
    """`$.a[0].b[...]` as ["a", 0, "b", None]; None is a dict value msgspec leaves unnamed."""
    out: list[Step] = []
    for step in re.compile(_STEP).finditer(path, 1):
        if step["field"] is not None:
            out.append(step["field"])
        elif step["index"] is not None:
            out.append(int(step["index"]))
        else:
            out.append(None)
    return out


def _walk(doc: Any, steps: list[Step]) -> tuple[int | None, Any, bool]:
    """The line of the last key on the path that the tree knows, the node there, and
    whether the whole path was found."""
    node = doc
    line: int | None = getattr(doc, "line", None) or None
    for step in steps:
        key = step.key if isinstance(step, DictKey) else step
        if isinstance(key, str | int) and not isinstance(step, int) \
                and isinstance(node, Mapping) and key in node:
            line = node.line_of(key)
            node = node[key]
        elif isinstance(step, int) and isinstance(node, list) and step < len(node):
            node = node[step]
            # a list item has no key: a mapping item knows its own line; a scalar item
            # keeps the line of the list's key
            if isinstance(node, Mapping):
                line = node.line
        else:
            return line, node, False
    return line, node, True


def _name_keys(doc: Any, type_: Any, steps: list[Step], message: str) -> list[Step]:
    """Each `[...]` on the path as the key it stands for. msgspec converts a mapping's
    entries in order and stops at the first bad one, so the bad key is the one whose
    entry alone, in place of the whole mapping, fails with the same message. Runs only
    on a document already known to be wrong."""
    steps = list(steps)
    for i, step in enumerate(steps):
        if step is not None:
            continue
        _, node, reached = _walk(doc, steps[:i])
        if not reached or not isinstance(node, dict):
            break
        key = _failing_entry(doc, type_, steps[:i], node, message)
        if key is None:
            break
        steps[i] = key
    return steps


def _find_key(doc: Any, type_: Any, steps: list[Step], message: str) -> Any:
    """The key of the mapping at `steps` that msgspec refused as a key."""
    _, node, reached = _walk(doc, steps)
    if not reached or not isinstance(node, dict):
        return None
    found = _failing_entry(doc, type_, steps, node, message)
    return found.key if found is not None else None


def _failing_entry(doc: Any, type_: Any, steps: list[Step], node: dict[Any, Any],
                   message: str) -> DictKey | None:
    for key, value in node.items():
        trial = _replace(doc, steps, {key: value})
        try:
            msgspec.convert(trial, type_)
        except msgspec.ValidationError as exc:
            if str(exc) == message:
                return DictKey(key)
    return None


def _replace(node: Any, steps: list[Step], new: Any) -> Any:
    """A copy of `node` with the value at `steps` replaced by `new` (the rest shared)."""
    if not steps:
        return new
    step, rest = steps[0], steps[1:]
    if isinstance(step, int) and isinstance(node, list):
        return [*node[:step], _replace(node[step], rest, new), *node[step + 1:]]
    key = step.key if isinstance(step, DictKey) else step
    return {**node, key: _replace(node[key], rest, new)}


def _type_at(type_: Any, steps: list[Step]) -> Type | None:
    """The declared type at a path, as msgspec.inspect describes it."""
    from msgspec import inspect  # only on the error path

    info: Type | None = inspect.type_info(type_)
    for step in steps:
        if info is None:
            return None
        info = _child(info, step)
    return info


def _child(info: Type, step: Step) -> Type | None:
    from msgspec import inspect

    for option in _options(info):
        if isinstance(step, str) and isinstance(option, inspect.StructType):
            for field in option.fields:
                if field.name == step:
                    return field.type
        elif isinstance(step, int) and isinstance(option, inspect.ListType):
            return option.item_type
        elif not isinstance(step, str | int) and isinstance(option, inspect.DictType):
            return option.value_type
    return None


def _options(info: Type) -> list[Type]:
    """The alternatives of a type: a Union's members, each Annotated one unwrapped."""
    from msgspec import inspect

    if isinstance(info, inspect.Metadata):
        return _options(info.type)
    if isinstance(info, inspect.UnionType):
        return [o for member in info.types for o in _options(member)]
    return [info]


def _expected(info: Type | None) -> str | None:
    """What a field takes, in words: its description, or its Literal's choices."""
    from msgspec import inspect

    if info is None:
        return None
    members = info.types if isinstance(info, inspect.UnionType) else (info,)
    for member in (info, *members):
        if isinstance(member, inspect.Metadata) and member.extra_json_schema:
            description = member.extra_json_schema.get("description")
            if description:
                return str(description)
    choices = [v for o in _options(info) if isinstance(o, inspect.LiteralType) for v in o.values]
    if choices:
        return "one of " + ", ".join(f"`{c}`" for c in choices)
    return None


def _fields(info: Type | None) -> list[str]:
    from msgspec import inspect

    if info is None:
        return []
    return sorted(f.name for o in _options(info) if isinstance(o, inspect.StructType)
                  for f in o.fields)


def _subject(steps: list[Step]) -> str:
    """`xid_catalog[79]: severity` for a field, `vbios.allowed['X']` for anything else."""
    if len(steps) > 1 and isinstance(steps[-1], str):
        return f"{_dotted(steps[:-1])}: {steps[-1]}"
    return _dotted(steps) or "the document"


def _dotted(steps: list[Step]) -> str:
    text = ""
    for step in steps:
        if isinstance(step, int):
            text += f"[{step}]"
        elif isinstance(step, DictKey):
            text += f"[{step.key!r}]" if isinstance(step.key, str) else f"[{step.key}]"
        elif step is None:
            text += "[...]"
        else:
            text += f".{step}" if text else step
    return text


def _join(where: str, field: str) -> str:
    return f"{where}.{field}" if where else field


def _lower_first(text: str) -> str:
    return text[:1].lower() + text[1:]
