"""gpuguard.config.schema: a YAML tree checked against msgspec Structs, each error at its line."""

from typing import Annotated

import msgspec
import pytest

from gpuguard.config.schema import convert
from gpuguard.config.yamlfile import ConfigError, load


class Inner(msgspec.Struct, forbid_unknown_fields=True):
    command: Annotated[list[str], msgspec.Meta(min_length=1)]
    timeout: Annotated[float, msgspec.Meta(gt=0)] = 1.0
    env: dict[str, str] | None = None


class Item(msgspec.Struct, forbid_unknown_fields=True):
    name: str
    inner: Inner


class Doc(msgspec.Struct, forbid_unknown_fields=True):
    items: list[Item]


GOOD = "items:\n  - name: a\n    inner:\n      command: [x, y]\n      timeout: 2\n"


def parse(tmp_path, text):
    path = tmp_path / "doc.yaml"
    path.write_text(text)
    return convert(load(path), Doc, path)


def test_a_good_document_converts(tmp_path):
    doc = parse(tmp_path, GOOD)
    assert doc.items[0].inner.command == ["x", "y"] and doc.items[0].inner.timeout == 2.0


@pytest.mark.parametrize(("text", "line", "problem"), [
    # a misspelled key, three levels down: the line of that key
    (GOOD.replace("timeout", "timeot"), 5, "items[0].inner.timeot: unknown key"),
    # a list holding a boolean where a command was meant: the line of the list's key
    (GOOD.replace("[x, y]", "[true]"), 4,
     "items[0].inner.command[0]: expected `str`, got `bool`"),
    (GOOD.replace("[x, y]", "[]"), 4, "items[0].inner.command: expected `array` of length >= 1"),
    (GOOD.replace("timeout: 2", "timeout: soon"), 5,
     "items[0].inner.timeout: expected `float`, got `str`"),
    (GOOD.replace("timeout: 2", "timeout: 0"), 5, "items[0].inner.timeout: expected `float` > 0"),
    # a wrong value inside a free-form mapping: the key that holds it, and its line
    (GOOD + "      env: {A: b, C: 1}\n", 6,
     "items[0].inner.env['C']: expected `str`, got `int`"),
    (GOOD + "      env:\n        A: b\n        C: 1\n", 8,
     "items[0].inner.env['C']: expected `str`, got `int`"),
    # a missing field: the line of the key that opens the object that lacks it
    ("items:\n  - name: a\n    inner:\n      timeout: 2\n", 3,
     "items[0].inner.command is missing"),
    ("items:\n  - inner: {command: [x]}\n", 2, "items[0].name is missing"),
    ("items:\n  - name: a\n    inner: {command: [x]}\n    7: x\n", 4,
     "items[0]: every key must be text"),
    ("- a\n- b\n", None, "expected `object`, got `array`"),
])
def test_each_error_names_the_line_and_the_place(tmp_path, text, line, problem):
    with pytest.raises(ConfigError) as caught:
        parse(tmp_path, text)
    assert caught.value.line == line, str(caught.value)
    assert caught.value.problem.startswith(problem), str(caught.value)
    assert str(caught.value).startswith(f"{tmp_path / 'doc.yaml'}")
