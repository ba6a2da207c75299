"""What the JSON-output tests share: a validator of a command's document against its
committed schema (gpuguard/outputs/schemas/), and the daemon the `status` test asks."""

from __future__ import annotations

import json
import subprocess
from typing import Any

from jsonschema import Draft202012Validator
from referencing import Registry, Resource

from gpuguard.outputs import schemas
from tests.daemon.conftest import start_daemon

__all__ = ["document_of", "start_daemon", "validate", "validator"]


def registry() -> Registry[Any]:
    """Every committed schema under its $id: a relative $ref resolves among them."""
    loaded = [schemas.load(name) for name in schemas.names()]
    return Registry().with_resources(
        (schema["$id"], Resource.from_contents(schema)) for schema in loaded)


def validator(name: str) -> Draft202012Validator:
    schema = schemas.load(name)
    Draft202012Validator.check_schema(schema)
    return Draft202012Validator(schema, registry=registry())


def problems(document: object, name: str) -> list[str]:
    """Each way `document` breaks schema `name`, as `path: message`."""
    return [f"{'/'.join(map(str, e.absolute_path)) or '(top)'}: {e.message}"
            for e in validator(name).iter_errors(document)]


def validate(document: object, name: str) -> None:
    found = problems(document, name)
    assert found == [], found


def document_of(proc: subprocess.CompletedProcess[str], *codes: int) -> Any:
    """The JSON a command printed, after it exited with one of `codes`."""
    assert proc.returncode in codes, (proc.returncode, proc.stderr[-2000:])
    assert "Traceback" not in proc.stderr, proc.stderr
    return json.loads(proc.stdout)
