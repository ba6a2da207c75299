"""YAML loading that remembers where every key came from, so errors can name the line."""

from __future__ import annotations

import hashlib
import json
import reprlib
from pathlib import Path
from typing import Any

# PyYAML is imported on the first YAML file actually parsed (~12 ms): the rule pack is
# usually read from its compiled form (COMPILED, below), so `gpuguard check` on a host
# with no profile and no rules.d never imports it.

# The pack's YAML files parsed ahead of time (scripts/gen_pack_cache.py): for each file
# its SHA-256 and its document with every key's line. Used only when the hash matches
# the file read now, so an edited file is always parsed afresh.
COMPILED = "compiled.json"


class ConfigError(ValueError):
    """A bad rule file, profile or config: names the file, the line and what is wrong."""

    def __init__(self, path: str | Path, line: int | None, problem: str) -> None:
        self.path = str(path)
        self.line = line
        self.problem = problem
        where = f"{self.path}:{line}" if line else self.path
        super().__init__(f"{where}: {problem}")


class Mapping(dict[Any, Any]):
    """A dict that knows the line of its own start and of each of its keys (1-based)."""

    line: int = 0

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.key_lines: dict[str | int, int] = {}

    def first_unknown(self, allowed: set[str]) -> Any:
        """The first key (in sorted order, so errors are stable) not in `allowed`, or None."""
        extra = sorted((k for k in self if k not in allowed), key=str)
        return extra[0] if extra else None

    def line_of(self, key: str | int) -> int:
        return self.key_lines.get(key, self.line)


_PARSER: Any = None


def _parser() -> Any:
    """The line-remembering YAML loader class, built on first use."""
    global _PARSER
    if _PARSER is not None:
        return _PARSER
    import yaml

    base: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # the C parser is faster

    class LineLoader(base):  # type: ignore[misc]
        pass

    def construct_mapping(loader: Any, node: Any) -> Mapping:
        loader.flatten_mapping(node)
        out = Mapping()
        out.line = node.start_mark.line + 1
        for key_node, value_node in node.value:
            key = loader.construct_object(key_node, deep=True)
            line = key_node.start_mark.line + 1
            # Numbers are allowed as keys for tables such as xid_catalog.
            if not isinstance(key, str | int) or isinstance(key, bool):
                raise ConfigError(loader.name, line, f"key {key!r} must be text or a number")
            if key in out:
                raise ConfigError(loader.name, line, f"duplicate key {key!r} (first at line "
                                  f"{out.key_lines[key]})")
            out[key] = loader.construct_object(value_node, deep=True)
            out.key_lines[key] = line
        return out

    LineLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG,
                               construct_mapping)
    _PARSER = LineLoader
    return _PARSER


# A configuration file is a few KiB; anything near these bounds is a mistake or an attack.
MAX_FILE_BYTES = 4 * 1024 * 1024
# Values the document holds once YAML aliases are expanded: an alias bomb (`&a [*b, *b]`
# nested ten deep) stays small in memory but not when printed or walked; refuse it here.
MAX_VALUES = 100_000


def load(path: Path) -> Any:
    """Parse one YAML file; any failure is a ConfigError naming the file and line."""
    from gpuguard.io.bounded import BoundedReadError, read_bytes

    try:
        raw = read_bytes(path, MAX_FILE_BYTES, 5.0)
    except BoundedReadError as exc:
        raise ConfigError(path, None, str(exc).removeprefix(f"{path}: ")) from exc
    cached = _compiled(path, raw)
    if cached is not _MISS:
        return cached
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(path, None, f"not a text file (not UTF-8: {exc.reason} at byte "
                          f"{exc.start})") from exc
    return parse(text, path)


def parse(text: str, path: Path) -> Any:
    """A YAML document as Mapping/list/scalars, every key's line remembered."""
    import yaml

    loader = _parser()(text)
    loader.name = str(path)
    try:
        doc = loader.get_single_data()
        _check_size(doc, path)
        return doc
    except ConfigError:
        raise
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark else None
        raise ConfigError(path, line, f"invalid YAML: {exc.problem or exc.context}") from exc
    except yaml.YAMLError as exc:
        raise ConfigError(path, None, f"invalid YAML: {exc}") from exc
    except RecursionError as exc:
        raise ConfigError(path, None, "invalid YAML: nested too deep") from exc
    finally:
        loader.dispose()


_MISS = object()
_COMPILED_BY_DIR: dict[Path, dict[str, Any]] = {}


def _compiled(path: Path, raw: bytes) -> Any:
    """The document of `path` from its folder's COMPILED file when its hash matches."""
    folder = path.parent
    if folder not in _COMPILED_BY_DIR:
        try:
            _COMPILED_BY_DIR[folder] = json.loads((folder / COMPILED).read_bytes())["files"]
        except (OSError, ValueError, KeyError, TypeError):
            _COMPILED_BY_DIR[folder] = {}
    entry = _COMPILED_BY_DIR[folder].get(path.name)
    if not isinstance(entry, dict) or entry.get("sha256") != hashlib.sha256(raw).hexdigest():
        return _MISS
    return decode(entry["doc"])


def encode(doc: Any) -> Any:
    """A parsed document as JSON, keeping each Mapping's lines and its keys' types."""
    if isinstance(doc, Mapping):
        return {"line": doc.line, "items": [[k, doc.key_lines.get(k, doc.line), encode(v)]
                                            for k, v in doc.items()]}
    if isinstance(doc, list):
        return {"list": [encode(v) for v in doc]}
    return {"value": doc}


def decode(raw: Any) -> Any:
    if "items" in raw:
        out = Mapping()
        out.line = raw["line"]
        for key, line, value in raw["items"]:
            out[key] = decode(value)
            out.key_lines[key] = line
        return out
    if "list" in raw:
        return [decode(v) for v in raw["list"]]
    return raw["value"]


def _check_size(doc: Any, path: Path) -> None:
    """Count the values as a reader would see them, aliases expanded, and stop early."""
    count = 0
    stack: list[tuple[Any, int]] = [(doc, 1)]
    while stack:
        value, line = stack.pop()
        count += 1
        if count > MAX_VALUES:
            raise ConfigError(path, line, f"the document expands to more than {MAX_VALUES} "
                              "values (nested YAML aliases?)")
        if isinstance(value, Mapping):
            stack.extend((v, value.key_lines.get(k, value.line)) for k, v in value.items())
        elif isinstance(value, dict):
            stack.extend((v, line) for v in value.values())
        elif isinstance(value, list):
            stack.extend((v, line) for v in value)


_SHORT = reprlib.Repr()  # attributes, not keywords: Python 3.11 takes none
_SHORT.maxlist = _SHORT.maxdict = 4
_SHORT.maxstring = _SHORT.maxother = 40
_SHORT.maxlevel = 2


def short(value: Any) -> str:
    """repr() for error messages, cut to a line: a message never prints a whole document."""
    text = _SHORT.repr(value)
    return text if len(text) <= 80 else text[:77] + "..."
