"""Loading rules: the default pack, user rules with `when:`, overrides, and bad files."""

from pathlib import Path

import pytest

from gpuguard.engine import evaluate
from gpuguard.profile import Profile, load_profile
from gpuguard.results import Status
from gpuguard.ruleset import load_ruleset
from gpuguard.yamlfile import ConfigError
from tests.conftest import set_gpu


def write(tmp_path: Path, name: str, text: str) -> Path:
    folder = tmp_path / "rules.d"
    folder.mkdir(exist_ok=True)
    (folder / name).write_text(text)
    return folder


def test_every_rule_in_the_pack_has_its_check_and_its_tests(default_rules):
    """The registry is the list: each pack rule has a registered check in
    gpuguard/checks/<family>.py and is named by tests/checks/test_<family>.py."""
    from gpuguard import checks

    registered = {**checks.HOST_CHECKS, **checks.GPU_CHECKS}
    assert set(default_rules.rules) == set(registered)
    root = Path(__file__).resolve().parent
    for rule_id, fn in registered.items():
        family = rule_id.split(".")[0]
        assert fn.__module__ == f"gpuguard.checks.{family}", rule_id
        tests = (root / "checks" / f"test_{family}.py").read_text()
        assert f'"{rule_id}"' in tests, f"{rule_id} has no test in tests/checks/test_{family}.py"


def test_rule_lives_in_the_file_named_after_its_family(default_rules):
    for rule in default_rules.rules.values():
        family = rule.id.split(".")[0]
        assert Path(rule.origin.split(":")[0]).name == f"{family}.yaml", rule.id


def test_user_rule_with_condition(tmp_path, h200):
    rules = write(tmp_path, "site.yaml", """
rules:
  - id: site.hot_memory
    scope: gpu
    severity: warning
    summary: GPU runs hot for this site
    when: "temperature_c > 35 and name == 'NVIDIA H200'"
    message: "$name at $temperature_c C"
    remediation: call facilities
""")
    ruleset = load_ruleset([rules])
    [result] = evaluate(h200, ruleset, Profile(), only=["site.*"])
    assert result.status is Status.WARNING
    assert result.message == "NVIDIA H200 at 39 C"
    assert result.remediation == "call facilities"
    set_gpu(h200, temperature_c=30)
    [result] = evaluate(h200, ruleset, Profile(), only=["site.*"])
    assert result.status is Status.OK


def test_condition_on_unsupported_field_is_skipped(tmp_path, h200):
    rules = write(tmp_path, "site.yaml", """
rules:
  - id: site.retired
    scope: gpu
    severity: warning
    summary: any retired page
    when: "retired_pages_dbe > 0"
    message: retired
""")
    [result] = evaluate(h200, load_ruleset([rules]), Profile(), only=["site.retired"])
    assert result.status is Status.SKIPPED


def test_host_condition(tmp_path, h200):
    rules = write(tmp_path, "site.yaml", """
rules:
  - id: site.driver_branch
    scope: host
    severity: critical
    summary: the fleet runs the 580 branch
    when: "not driver_version.startswith('580.')"
    message: "driver $driver_version is not on the 580 branch"
""")
    [result] = evaluate(h200, load_ruleset([rules]), Profile(), only=["site.*"])
    assert result.status is Status.OK


def test_overrides_change_threshold_severity_and_enabled(tmp_path, h200):
    rules = write(tmp_path, "overrides.yaml", """
overrides:
  pcie.replays:
    severity: critical
    thresholds: {max_replays: 0}
  persistence.mode:
    enabled: false
""")
    ruleset = load_ruleset([rules])
    set_gpu(h200, pcie_replay_counter=1)
    results = evaluate(h200, ruleset, Profile(), only=["pcie.replays", "persistence.mode"])
    by_rule = {r.rule: r for r in results}
    assert by_rule["pcie.replays"].status is Status.CRITICAL
    assert by_rule["persistence.mode"].status is Status.SKIPPED
    assert "disabled" in by_rule["persistence.mode"].message
    assert "overrides.yaml:6" in by_rule["persistence.mode"].message


def test_lowered_severity_caps_a_two_level_rule(tmp_path, h200):
    rules = write(tmp_path, "soft.yaml", "overrides:\n  thermal.margin: {severity: warning}\n")
    set_gpu(h200, temperature_tlimit_margin_c=-5)
    [result] = evaluate(h200, load_ruleset([rules]), Profile(), only=["thermal.margin"])
    assert result.status is Status.WARNING


def test_profile_overrides_apply_last(tmp_path, h200):
    profile_path = tmp_path / "profile.yaml"
    profile_path.write_text("gpu_count: 1\nrules:\n  thermal.margin:\n"
                            "    thresholds: {warn_margin_c: 60}\n")  # the H200 has 48 C left
    profile = load_profile(profile_path)
    ruleset = load_ruleset([], (profile_path, profile.rule_overrides))
    [result] = evaluate(h200, ruleset, profile, only=["thermal.margin"])
    assert result.status is Status.WARNING


@pytest.mark.parametrize(
    ("text", "line", "words"),
    [
        ("rules:\n  - id: site.x\n    scope: gpu\n    severity: fatal\n    summary: s\n"
         "    when: 'index > 0'\n    message: m\n", 4, "severity must be one of"),
        ("rules:\n  - id: site.x\n    scope: gpu\n    severity: warning\n    summary: s\n"
         "    when: 'temprature_c > 80'\n    message: m\n", 6, "unknown field(s) temprature_c"),
        ("rules:\n  - id: site.x\n    scope: gpu\n    severity: warning\n    summary: s\n"
         "    when: 'index >'\n    message: m\n", 6, "invalid expression"),
        ("rules:\n  - id: site.x\n    scope: gpu\n    severity: warning\n    summary: s\n", 2,
         "needs a `when:` condition"),
        ("rules:\n  - id: pcie.replays\n    scope: gpu\n    severity: warning\n    summary: s\n"
         "    when: 'index > 0'\n    message: m\n", 6, "has Python logic already"),
        ("overrides:\n  pcie.replays:\n    thresholds:\n      max_replay: 5\n", 4,
         "unknown threshold 'max_replay' (this rule has: max_replays)"),
        ("overrides:\n  pcie.replays:\n    thresholds:\n      max_replays: lots\n", 4,
         "must be a number"),
        ("overrides:\n  pcie.nope: {enabled: false}\n", 2, "override for unknown rule"),
        ("overrides:\n  pcie.replays: {enabled: maybe}\n", 2, "enabled must be true or false"),
        ("rules:\n  - id: site.x\n    scope: gpu\n    scope: host\n", 4, "duplicate key 'scope'"),
        ("rules:\n  - id: site.x\n   scope: [\n", 3, "invalid YAML"),
        ("ruels: []\n", 1, "ruels: unknown key (allowed: overrides, rules, xid_catalog)"),
        ("rules:\n  - id: site.x\n    scope: gpu\n    severity: warning\n    summary: s\n"
         "    when: '__import__(\"os\").system(\"true\")'\n    message: m\n", 6,
         "unknown field(s) __import__"),
    ],
)
def test_bad_rule_file_names_file_and_line(tmp_path, text, line, words):
    folder = write(tmp_path, "bad.yaml", text)
    with pytest.raises(ConfigError) as caught:
        load_ruleset([folder])
    err = caught.value
    assert err.path.endswith("bad.yaml")
    assert err.line == line, str(err)
    assert words in str(err)
    assert str(err).startswith(f"{err.path}:{line}: ")


def test_binary_rule_file(tmp_path):
    folder = tmp_path / "rules.d"
    folder.mkdir()
    (folder / "junk.yaml").write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(ConfigError, match=r"junk\.yaml: not a text file \(not UTF-8"):
        load_ruleset([folder])


def test_missing_rules_dir(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_ruleset([tmp_path / "nope"])


@pytest.mark.parametrize(
    ("text", "line", "words"),
    [
        ("gpu_count: eight\n", 1, "gpu_count must be a whole number"),
        ("gpus: 8\n", 1, "gpus: unknown key (allowed: docker, driver, ecc, gpu_count, rules,"),
        ("driver:\n  min_version: 570.86\n", 2, "must be a quoted version"),
        ("driver:\n  min_version: 'five'\n", 2, "not a dotted version"),
        ("driver:\n  minimum: '570'\n", 2, "driver.minimum: unknown key (allowed: min_cuda_version, min_version)"),
        ("vbios:\n  allowed:\n    NVIDIA H200: 96.00\n", 3, "must be a list of quoted versions"),
        ("ecc: sometimes\n", 1, "ecc must be one of `disabled`, `enabled`, not 'sometimes'"),
    ],
)
def test_bad_profile_names_file_and_line(tmp_path, text, line, words):
    path = tmp_path / "profile.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as caught:
        load_profile(path)
    assert caught.value.line == line, str(caught.value)
    assert words in str(caught.value)


def test_profile_fields(tmp_path):
    path = tmp_path / "profile.yaml"
    path.write_text("""
gpu_count: 8
driver: {min_version: "570.86.15", min_cuda_version: "12.8"}
vbios:
  allowed:
    NVIDIA H200: ["96.00.a5.00.1a"]
ecc: enabled
""")
    profile = load_profile(path)
    assert profile.gpu_count == 8
    assert profile.driver_min_version == "570.86.15"
    assert profile.cuda_min_version == "12.8"
    assert profile.vbios_allowed == {"NVIDIA H200": ["96.00.A5.00.1A"]}
    assert profile.ecc_expected is True


def test_broken_check_is_unknown_not_a_crash(h200, default_rules):
    # A check that raises must not stop the others (AzNHC stops at the first failure).
    h200.gpus[0].temperature_c = None  # type: ignore[assignment]
    results = evaluate(h200, default_rules, Profile())
    thermal = [r for r in results if r.rule == "thermal.margin"]
    assert thermal[0].status is Status.UNKNOWN
    assert "check failed" in thermal[0].message
    assert len({r.rule for r in results}) == len(default_rules.rules)


def test_docs_list_every_rule(default_rules):
    import subprocess
    import sys

    from tests.conftest import REPO

    text = (REPO / "docs" / "rules.md").read_text()
    missing = [rule_id for rule_id in default_rules.rules if f"`{rule_id}`" not in text]
    assert not missing, f"docs/rules.md does not list {missing}"
    check = subprocess.run([sys.executable, "scripts/gen_rules_doc.py", "--check"], cwd=REPO,
                           capture_output=True, text=True, check=False)
    assert check.returncode == 0, check.stderr


def _thresholds_read(fn, seen=None) -> set[str]:
    """Threshold names a check's code reads (`ctx.threshold("x")`), following the helpers of
    its own module that it calls: read from the bytecode, so no declaration can drift."""
    import dis
    import types

    seen = set() if seen is None else seen
    if fn in seen:
        return set()
    seen.add(fn)
    names: set[str] = set()
    codes = [fn.__code__, *(c for c in fn.__code__.co_consts if isinstance(c, types.CodeType))]
    for code in codes:
        ins = list(dis.get_instructions(code))
        for i, inst in enumerate(ins):
            if inst.argval == "threshold" and inst.opname in ("LOAD_ATTR", "LOAD_METHOD") \
                    and ins[i + 1].opname == "LOAD_CONST":
                names.add(ins[i + 1].argval)
            if inst.opname == "LOAD_GLOBAL":
                helper = fn.__globals__.get(inst.argval)
                if isinstance(helper, types.FunctionType) and helper.__module__ == fn.__module__:
                    names |= _thresholds_read(helper, seen)
    return names


def test_each_check_declares_exactly_the_thresholds_it_reads(default_rules):
    from gpuguard import checks

    for rule_id, fn in {**checks.HOST_CHECKS, **checks.GPU_CHECKS}.items():
        declared = set(checks.THRESHOLDS[rule_id])
        assert _thresholds_read(fn) == declared, rule_id
        assert set(default_rules.rules[rule_id].thresholds) == declared, rule_id


def test_a_pack_file_missing_a_threshold_its_check_reads_is_a_load_error(tmp_path):
    import shutil

    from gpuguard.ruleset import default_pack_dir

    pack = tmp_path / "pack"
    shutil.copytree(default_pack_dir(), pack)
    text = (pack / "thermal.yaml").read_text()
    (pack / "thermal.yaml").write_text(text.replace("warn_margin_c", "warn_margin"))
    with pytest.raises(ConfigError, match=r"thermal\.yaml:\d+: thermal.margin: its check reads "
                                          r"threshold\(s\) warn_margin_c"):
        load_ruleset(pack_dir=pack)
