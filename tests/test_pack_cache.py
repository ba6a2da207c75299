"""The shipped pack from rules/compiled-ruleset.json (config/pack_cache.py) is the pack the
full loader (schema, msgspec, every file:line check) gives, and is trusted only while it
is the compiled form of the YAML files there now and is itself intact."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from gpuguard.config import pack_cache
from gpuguard.config.ruleset import default_pack_dir, load_pack_in_full, load_ruleset
from gpuguard.config.yamlfile import ConfigError
from gpuguard.judge import registry
from tests.conftest import REPO


def _yaml(pack: Path) -> list[Path]:
    return sorted(p for p in pack.iterdir() if p.suffix in (".yaml", ".yml"))


def _copy(tmp_path: Path) -> Path:
    pack = tmp_path / "pack"
    shutil.copytree(default_pack_dir(), pack)
    return pack


def test_the_compiled_pack_is_the_pack_loaded_in_full() -> None:
    registry.load_all()
    pack = default_pack_dir()
    cached = pack_cache.load_cached(pack, _yaml(pack))
    assert cached is not None
    assert cached == load_pack_in_full(pack, _yaml(pack))


def test_a_copied_pack_names_its_own_paths(tmp_path: Path) -> None:
    registry.load_all()
    pack = _copy(tmp_path)
    cached = pack_cache.load_cached(pack, _yaml(pack))
    assert cached is not None and cached == load_pack_in_full(pack)
    assert cached.rules["thermal.margin"].origin.startswith(f"{pack}/thermal.yaml:")


def test_an_edited_yaml_file_makes_the_compiled_pack_stale(tmp_path: Path) -> None:
    pack = _copy(tmp_path)
    path = pack / "thermal.yaml"
    path.write_text(path.read_text().replace("warn_margin_c: 5", "warn_margin_c: 12"))
    assert pack_cache.load_cached(pack, _yaml(pack)) is None
    assert load_ruleset(pack_dir=pack).rules["thermal.margin"].thresholds["warn_margin_c"] == 12


def test_an_added_yaml_file_makes_the_compiled_pack_stale(tmp_path: Path) -> None:
    pack = _copy(tmp_path)
    (pack / "zz-extra.yaml").write_text("rules:\n  - id: nothing.here\n")
    assert pack_cache.load_cached(pack, _yaml(pack)) is None
    with pytest.raises(ConfigError, match=r"zz-extra\.yaml:2: rules\[0\]\.scope is missing"):
        load_ruleset(pack_dir=pack)  # the full path's file:line error, as before


def test_a_hand_edited_compiled_file_is_not_trusted(tmp_path: Path) -> None:
    pack = _copy(tmp_path)
    compiled = pack / pack_cache.COMPILED_RULESET
    head, body = compiled.read_text().split("\n", 1)
    doc = json.loads(body)
    rule = next(r for r in doc["rules"] if r["id"] == "thermal.margin")
    assert rule["severity"] != "unknown"
    rule["severity"] = "unknown"
    compiled.write_text(head + "\n" + json.dumps(doc, separators=(",", ":")) + "\n")
    assert pack_cache.load_cached(pack, _yaml(pack)) is None
    assert load_ruleset(pack_dir=pack).rules["thermal.margin"].severity != "unknown"


@pytest.mark.parametrize("text", ["", "not json\n{}\n", '{"format": 99}\n{}\n'])
def test_a_missing_or_foreign_compiled_file_is_not_trusted(tmp_path: Path, text: str) -> None:
    pack = _copy(tmp_path)
    (pack / pack_cache.COMPILED_RULESET).write_text(text)
    assert pack_cache.load_cached(pack, _yaml(pack)) is None
    (pack / pack_cache.COMPILED_RULESET).unlink()
    assert pack_cache.load_cached(pack, _yaml(pack)) is None
    assert load_ruleset(pack_dir=pack) == load_pack_in_full(pack)


def test_loading_the_shipped_pack_imports_no_schema() -> None:
    probe = ("import sys; from gpuguard.config.ruleset import load_ruleset; load_ruleset(); "
             "print(sorted(m for m in ('msgspec', 'gpuguard.config.schema', "
             "'gpuguard.config.shapes', 'yaml') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", probe], cwd=REPO, capture_output=True,
                         text=True, check=True).stdout.strip()
    assert out == "[]"
