"""Issue 34, item 1: every command that prints results has `--format json` and a schema
committed for its document; a new command that is in neither DOCUMENTS nor NO_RESULTS
(gpuguard/outputs/schemas/__init__.py) fails here, as does a mapped schema file that is gone."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import click
import pytest
from jsonschema import Draft202012Validator

from gpuguard.cli.main import main
from gpuguard.outputs import schemas
from tests.conftest import REPO
from tests.schemas.conftest import problems

SCHEMA_DIR = REPO / "gpuguard" / "outputs" / "schemas"


def leaves(group: click.Group, path: tuple[str, ...] = ()) -> Iterator[
        tuple[tuple[str, ...], click.Command]]:
    """Every command a user can run, by its words (`rules explain`), groups walked."""
    ctx = click.Context(group)
    for name in group.list_commands(ctx):
        command = group.get_command(ctx, name)
        assert command is not None, name
        if isinstance(command, click.Group):
            yield from leaves(command, (*path, name))
        else:
            yield (*path, name), command


def commands() -> dict[tuple[str, ...], click.Command]:
    main.load_all()
    return dict(leaves(main))


def json_choice(command: click.Command) -> bool:
    fmt = next((p for p in command.params if "--format" in getattr(p, "opts", ())), None)
    return fmt is not None and isinstance(fmt.type, click.Choice) and \
        "json" in fmt.type.choices


def test_every_command_is_judged_results_or_not():
    found = set(commands())
    unjudged = found - set(schemas.DOCUMENTS) - set(schemas.NO_RESULTS)
    assert unjudged == set(), f"{sorted(unjudged)}: give each --format json and a schema " \
        "(gpuguard/outputs/schemas/__init__.py DOCUMENTS), or say in NO_RESULTS why it prints none"
    assert set(schemas.DOCUMENTS) & set(schemas.NO_RESULTS) == set()
    assert set(schemas.DOCUMENTS) | set(schemas.NO_RESULTS) <= found  # no stale entry


@pytest.mark.parametrize("words", sorted(schemas.DOCUMENTS), ids=" ".join)
def test_a_results_command_has_format_json_and_its_schema(words):
    command = commands()[words]
    assert json_choice(command), f"`gpuguard {' '.join(words)}` has no --format json"
    name = schemas.DOCUMENTS[words]
    assert (SCHEMA_DIR / f"{name}.schema.json").is_file(), f"no schema file for {name}"
    Draft202012Validator.check_schema(schemas.load(name))


def test_the_walk_sees_a_command_without_json():
    """The check above can fail: a results command whose --format lacks json is caught."""
    bare = click.Command("bare", params=[click.Option(["--format"],
                                                      type=click.Choice(["text"]))])
    assert not json_choice(bare)
    assert not json_choice(click.Command("none"))


@pytest.mark.parametrize("name", schemas.names())
def test_each_schema_file_is_draft_2020_12_named_by_its_file(name):
    schema = json.loads((SCHEMA_DIR / f"{name}.schema.json").read_text())
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    assert schema["$id"] == f"{schemas.ID_BASE}{name}.schema.json"
    Draft202012Validator.check_schema(schema)
    if name != "verdict":  # a document: it carries its version, and says which it is
        assert schema["properties"]["schema"] == {"const": 1, **{
            k: v for k, v in schema["properties"]["schema"].items() if k != "const"}}
        assert "schema" in schema["required"]


def refs(node: object) -> Iterator[str]:
    if isinstance(node, dict):
        if isinstance(node.get("$ref"), str):
            yield node["$ref"]
        for value in node.values():
            yield from refs(value)
    elif isinstance(node, list):
        for value in node:
            yield from refs(value)


@pytest.mark.parametrize("name", ["check", "slurm-health"])
def test_the_verdict_part_is_the_one_verdict_schema_by_ref(name):
    """check's (and so status's and qualify's) results and slurm health's verdict are the
    verdict schema's, referred to, not copied: no schema but verdict defines a result."""
    schema = schemas.load(name)
    assert any(r.startswith("verdict.schema.json") for r in refs(schema))
    assert "result" not in schema.get("$defs", {}) and "gpu" not in schema.get("$defs", {})


def test_every_schema_ref_resolves():
    for name in schemas.names():
        for ref in refs(schemas.load(name)):
            target = ref.split("#")[0]
            assert target == "" or (SCHEMA_DIR / target).is_file(), (name, ref)


def test_the_verdict_schema_takes_verdict_to_json(h200, default_rules):
    from gpuguard.judge.actions import Action
    from gpuguard.judge.engine import evaluate
    from gpuguard.model.profile import Profile
    from gpuguard.model.results import Status, Verdict

    verdict = Verdict(evaluate(h200, default_rules, Profile()), source="a cold check",
                      failover_rules=frozenset(default_rules.failover_rules()))
    doc = verdict.to_json()
    assert problems(doc, "verdict") == []
    # the enums are the code's own words, not a copy that may drift
    defs = schemas.load("verdict")["$defs"]
    assert defs["action"]["enum"] == [a.value for a in Action]
    assert defs["status"]["enum"] == [s.value for s in Status]
    for key in list(doc):
        assert problems({k: v for k, v in doc.items() if k != key}, "verdict"), key
    result = doc["results"][0]
    for key in list(result):
        broken = {**doc, "results": [{k: v for k, v in result.items() if k != key}]}
        assert problems(broken, "verdict"), key


def test_the_schemas_ship_in_the_package():
    """The wheel takes gpuguard/ whole (pyproject.toml): the schemas are package data,
    read through importlib.resources, so an installed gpuguard carries them."""
    assert set(schemas.names()) == {p.name.removesuffix(".schema.json")
                                    for p in SCHEMA_DIR.glob("*.schema.json")}
    assert Path(schemas.__file__).parent == SCHEMA_DIR
