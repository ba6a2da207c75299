"""The targets per GPU model of `gpuguard qualify` (rules/gpus/*.yaml, issue 29 item 5):
every shipped file loads, every value names where it comes from, the product names NVML
gives in the repository's fixtures find their model, an unknown model finds none, and a
bad file is `file:line: what is wrong`."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from gpuguard.checks.memory import HBM_GBPS
from gpuguard.config.gpu_targets import gpus_dir, load_targets, targets_for
from gpuguard.config.yamlfile import ConfigError
from gpuguard.model.gpu_target import JUDGED, SPEC
from tests.conftest import FIXTURES, REPO

# The models issue 29 names (H200 SXM, H100 SXM and PCIe, A100, L40S, B200).
REQUIRED = {"h200-sxm", "h100-sxm", "h100-pcie", "a100-sxm4-80gb", "a100-pcie-80gb", "l40s",
            "b200"}
# A source is pinned: a repository at a commit, gpuguard's issue, a URL, a fixture of the
# lent machines, a named NVIDIA document or MLPerf result, or gpuguard saying it is its own.
PINNED = re.compile(r"@[0-9a-f]{7}|gpuguard issue \d+|https://|tests/fixtures/|"
                    r"gpuguard's own|NVIDIA [\w ]+(Product Brief|data sheet|\(white paper)|"
                    r"MLPerf Inference|diag-skus\.yaml\.in")


def catalog():
    return load_targets.__wrapped__(gpus_dir())


def fixture_names() -> set[str]:
    """Every product name the repository's NVML and nvidia-smi fixtures hold."""
    found: set[str] = set()
    for path in sorted(FIXTURES.rglob("*")):
        if path.suffix == ".xml":
            found.update(re.findall(r"<product_name>([^<]+)</product_name>", path.read_text()))
        elif path.suffix == ".json":
            found.update(re.findall(r'"name": "((?:NVIDIA|Tesla) [^"]+)"', path.read_text()))
    return found


def test_every_shipped_file_loads_with_the_required_models():
    models = catalog().models
    assert set(models) >= REQUIRED
    for model, targets in models.items():
        assert Path(targets.origin).stem == model
        assert targets.names and targets.title


def test_every_target_and_fact_has_a_pinned_source():
    for model, targets in catalog().models.items():
        assert set(targets.targets) <= set(JUDGED) and set(targets.spec) <= set(SPEC)
        for key, target in [*targets.targets.items(), *targets.spec.items()]:
            assert target.value > 0, (model, key)
            assert PINNED.search(target.source), (model, key, target.source)
        # every judged key is either given or its absence explained
        assert set(targets.targets) | set(targets.not_judged) == set(JUDGED), model
        assert 0 < targets.targets["power_share"].value <= 1


def test_the_floors_leave_the_lent_h200_clear():
    """What the H200 measured (docs/benchmarks.md, issue 29): pinned copies 54.4-55.0 GB/s,
    device-to-device 4136-4190 GB/s read + written, peer 385-392 GB/s each way."""
    h200 = targets_for("NVIDIA H200", gpus_dir())
    assert h200 is not None and h200.model == "h200-sxm"
    floors = {k: t.value for k, t in h200.targets.items()}
    assert floors["h2d_gbps"] < 54.4 * 0.9 and floors["d2h_gbps"] < 54.4 * 0.9
    assert floors["hbm_gbps"] < 4136 * 0.9
    assert floors["p2p_gbps"] < 385 * 0.9
    assert floors["power_share"] < 690 / 700


def test_every_name_in_the_fixtures_and_the_memory_table_finds_its_model():
    names = fixture_names() | set(HBM_GBPS)
    assert {"NVIDIA H200", "NVIDIA A100-SXM4-80GB"} <= names
    found = {name: model_of(name) for name in sorted(names)}
    assert {n: m for n, m in found.items() if m is None} == {}
    assert found["NVIDIA H200"] == "h200-sxm"
    assert found["NVIDIA A100-SXM4-80GB"] == "a100-sxm4-80gb"
    assert found["NVIDIA H100 80GB HBM3"] == "h100-sxm"
    assert model_of(" NVIDIA L40S\n") == "l40s"


def model_of(name: str | None) -> str | None:
    targets = targets_for(name, gpus_dir())
    return targets.model if targets is not None else None


def test_an_unknown_model_has_no_targets():
    for name in ("Tesla K80", "NVIDIA GeForce RTX 4090", "NVIDIA H200 SXM", "nvidia h200",
                 "", None):
        assert model_of(name) is None


def test_the_reading_holds_the_judged_keys_only():
    h200 = targets_for("NVIDIA H200", gpus_dir())
    assert h200 is not None
    reading = h200.to_reading()
    assert reading["model"] == "h200-sxm"
    assert set(reading) == {"model", "power_share", "hbm_gbps", "h2d_gbps", "d2h_gbps",
                            "p2p_gbps"}
    assert reading["power_share"] == {"value": 0.9, "source": h200.targets["power_share"]
                                      .source}
    assert all(set(v) == {"value", "source"} for k, v in reading.items() if k != "model")
    l40s = targets_for("NVIDIA L40S", gpus_dir())
    assert l40s is not None and "p2p_gbps" not in l40s.to_reading()
    assert "NVLink" in l40s.not_judged["p2p_gbps"]


def test_the_docs_table_is_the_files():
    """docs/qualify-targets.md has a row `| key | value | ...` for every target."""
    doc = (REPO / "docs" / "qualify-targets.md").read_text()
    sections = dict(re.findall(r"^## `([\w-]+)`\n(.*?)(?=^## |\Z)", doc, re.M | re.S))
    for model, targets in catalog().models.items():
        assert model in sections, f"docs/qualify-targets.md has no section for {model}"
        rows = dict(re.findall(r"^\| `(\w+)` \| ([\d.]+) \|", sections[model], re.M))
        assert {k: float(v) for k, v in rows.items() if k in JUDGED} == \
            {k: t.value for k, t in targets.targets.items()}, model


GOOD = """\
model: {stem}
title: A GPU
names:
  - NVIDIA Test GPU
targets:
  power_share: {{value: 0.9, source: gpuguard issue 29}}
  hbm_gbps:
    value: 100
    source: somewhere precise
not_judged:
  h2d_gbps: no source
  d2h_gbps: no source
  p2p_gbps: no NVLink
  correctable_ecc_per_hour: no source
  sm_clock_mhz: no source
"""


def write(folder: Path, stem: str, text: str) -> Path:
    folder.mkdir(exist_ok=True)
    path = folder / f"{stem}.yaml"
    path.write_text(text)
    return path


def refused(folder: Path) -> ConfigError:
    with pytest.raises(ConfigError) as caught:
        load_targets.__wrapped__(folder)
    return caught.value


def test_a_good_file_in_a_folder_of_its_own_loads(tmp_path):
    write(tmp_path, "test-gpu", GOOD.format(stem="test-gpu"))
    found = targets_for("NVIDIA Test GPU", tmp_path)
    assert found is not None and found.targets["hbm_gbps"].value == 100.0
    assert found.to_reading()["hbm_gbps"] == {"value": 100.0, "source": "somewhere precise"}


@pytest.mark.parametrize(("change", "line", "words"), [
    # an unknown key, named with the keys its place allows
    (("  hbm_gbps:\n", "  hbm_gbs:\n"), 7, "targets.hbm_gbs: unknown key"),
    (("title: A GPU\n", "title: A GPU\ncolour: green\n"), 3, "colour: unknown key"),
    # a target without its source
    (("    source: somewhere precise\n", ""), 7, "targets.hbm_gbps.source is missing"),
    (("    source: somewhere precise\n", "    source: ''\n"), 9, "hbm_gbps.source"),
    # a value that is no positive number
    (("    value: 100\n", "    value: -5\n"), 8, "targets.hbm_gbps: value must be a number "
                                                  "above 0, not -5"),
    (("    value: 100\n", "    value: 0\n"), 8, "must be a number above 0"),
    (("    value: 100\n", "    value: '100'\n"), 8, "must be a number above 0"),
    (("    value: 100\n", "    value: .inf\n"), 8, "must be a finite number"),
    # a power share outside (0, 1]
    (("value: 0.9,", "value: 90,"), 6, "power_share: value must be a share above 0"),
    # a judged key neither given nor explained
    (("  sm_clock_mhz: no source\n", ""), 5, "no sm_clock_mhz and no reason"),
    # given and explained: one of them is wrong
    (("  p2p_gbps: no NVLink\n", "  p2p_gbps: no NVLink\n  hbm_gbps: why\n"), 14,
     "not_judged.hbm_gbps: test-gpu has a target for hbm_gbps"),
    (("  p2p_gbps: no NVLink\n", "  p2p_gbs: no NVLink\n"), 13, "not_judged"),
    # the model is its file's name
    (("model: test-gpu\n", "model: other-gpu\n"), 1, "is not the file's name (test-gpu)"),
    (("  - NVIDIA Test GPU\n", "  - NVIDIA Test GPU\n  - NVIDIA Test GPU\n"), 3,
     "names[1]: 'NVIDIA Test GPU' is listed twice"),
    # not YAML at all
    (("names:\n", "names: [\n"), 4, "invalid YAML"),
])
def test_a_bad_file_is_file_line_and_what(tmp_path, change, line, words):
    good = GOOD.format(stem="test-gpu")
    old, new = change
    assert old in good
    path = write(tmp_path, "test-gpu", good.replace(old, new, 1))
    error = refused(tmp_path)
    assert str(error).startswith(f"{path}:"), str(error)
    assert error.line == line, str(error)
    assert words in error.problem, str(error)


def test_a_name_two_files_claim_is_refused(tmp_path):
    write(tmp_path, "gpu-a", GOOD.format(stem="gpu-a"))
    second = write(tmp_path, "gpu-b", GOOD.format(stem="gpu-b"))
    error = refused(tmp_path)
    assert str(error).startswith(f"{second}:3: names[0]: 'NVIDIA Test GPU' is claimed by "
                                 "gpu-a too"), str(error)


def test_an_empty_folder_and_a_file_that_is_no_mapping_are_refused(tmp_path):
    assert "no GPU target file found" in str(refused(tmp_path))
    write(tmp_path, "x", "- just\n- a list\n")
    assert str(refused(tmp_path)).startswith(f"{tmp_path / 'x.yaml'}")


def test_the_pack_folder_ships_with_the_rules():
    """The wheel carries rules/ as gpuguard/_rules (pyproject.toml force-include), so
    rules/gpus travels with it; the rule pack itself reads only rules/*.yaml."""
    assert gpus_dir().name == "gpus" and gpus_dir().parent.name in ("rules", "_rules")
    assert '"rules" = "gpuguard/_rules"' in (REPO / "pyproject.toml").read_text()
