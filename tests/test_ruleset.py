"""Loading rules: the default pack, user rules with `when:`, overrides, and bad files."""

from pathlib import Path

import pytest

from gpuguard.config.profile import load_profile
from gpuguard.config.ruleset import load_ruleset
from gpuguard.config.yamlfile import ConfigError
from gpuguard.judge.engine import evaluate
from gpuguard.model.profile import Profile
from gpuguard.model.results import Status
from tests.conftest import set_gpu


def write(tmp_path: Path, name: str, text: str) -> Path:
    folder = tmp_path / "rules.d"
    folder.mkdir(exist_ok=True)
    (folder / name).write_text(text)
    return folder


def test_every_rule_in_the_pack_has_its_check_and_its_tests(default_rules):
    """The registry is the list: each pack rule has a registered check in
    gpuguard/checks/<family>.py and is named by tests/checks/test_<family>.py."""
    from gpuguard.judge import registry

    registered = {**registry.HOST_CHECKS, **registry.GPU_CHECKS}
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
        # .nan passes a type check and then silently disables the warning (issue 20)
        ("overrides:\n  thermal.margin:\n    thresholds:\n      warn_margin_c: .nan\n", 4,
         "threshold 'warn_margin_c' must be a finite number, not nan"),
        ("overrides:\n  pcie.replays:\n    thresholds:\n      max_replays: .inf\n", 4,
         "must be a finite number, not inf"),
        ("rules:\n  - id: site.x\n    scope: gpu\n    severity: warning\n    summary: s\n"
         "    when: 'index > 0'\n    message: m\n    thresholds: {x: .nan}\n", 8,
         "threshold 'x' must be a finite number"),
        ("overrides:\n  pcie.nope: {enabled: false}\n", 2, "override for unknown rule"),
        ("overrides:\n  pcie.replays: {enabled: maybe}\n", 2, "enabled must be true or false"),
        ("rules:\n  - id: site.x\n    scope: gpu\n    scope: host\n", 4, "duplicate key 'scope'"),
        ("rules:\n  - id: site.x\n   scope: [\n", 3, "invalid YAML"),
        ("ruels: []\n", 1,
         "ruels: unknown key (allowed: overrides, rules, sxid_catalog, sxid_catalog_source, "
         "xid_catalog, xid_catalog_source)"),
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
        ("gpus: 8\n", 1, "gpus: unknown key (allowed: active_probe, disk_paths, docker, "
         "driver, ecc, gpu_count, gpudirect_rdma, metrics_compat, mig, nvlink_links_per_gpu, "
         "p2p, rules, status_page,"),
        ("disk_paths: [models]\n", 1, "disk_paths: 'models' is not an absolute path"),
        ("disk_paths: /models\n", 1, "disk_paths must be a list of absolute paths"),
        ("driver:\n  min_version: 570.86\n", 2, "must be a quoted version"),
        ("driver:\n  min_version: 'five'\n", 2, "not a dotted version"),
        ("driver:\n  minimum: '570'\n", 2,
         "driver.minimum: unknown key (allowed: min_cuda_version, min_version)"),
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
    from gpuguard.judge import registry

    for rule_id, fn in {**registry.HOST_CHECKS, **registry.GPU_CHECKS}.items():
        declared = set(registry.THRESHOLDS[rule_id])
        assert _thresholds_read(fn) == declared, rule_id
        assert set(default_rules.rules[rule_id].thresholds) == declared, rule_id


def test_a_pack_file_missing_a_threshold_its_check_reads_is_a_load_error(tmp_path):
    import shutil

    from gpuguard.config.ruleset import default_pack_dir

    pack = tmp_path / "pack"
    shutil.copytree(default_pack_dir(), pack)
    text = (pack / "thermal.yaml").read_text()
    (pack / "thermal.yaml").write_text(text.replace("warn_margin_c", "warn_margin"))
    with pytest.raises(ConfigError, match=r"thermal\.yaml:\d+: thermal.margin: its check reads "
                                          r"threshold\(s\) warn_margin_c"):
        load_ruleset(pack_dir=pack)


def test_the_compiled_pack_is_current_and_saves_the_yaml_import():
    import subprocess
    import sys

    from tests.conftest import REPO

    check = subprocess.run([sys.executable, "scripts/gen_pack_cache.py", "--check"], cwd=REPO,
                           capture_output=True, text=True, check=False)
    assert check.returncode == 0, check.stderr
    probe = ("import sys; from gpuguard.config.ruleset import load_ruleset; "
             "rules = load_ruleset(); print(len(rules.rules), 'yaml' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", probe], cwd=REPO, capture_output=True,
                         text=True, check=True).stdout.split()
    assert out[1] == "False" and int(out[0]) == len(load_ruleset().rules)


def test_an_edited_pack_file_is_read_from_its_yaml_not_the_cache(tmp_path):
    import shutil

    from gpuguard.config.ruleset import default_pack_dir

    pack = tmp_path / "pack"
    shutil.copytree(default_pack_dir(), pack)
    path = pack / "thermal.yaml"
    path.write_text(path.read_text().replace("warn_margin_c: 5", "warn_margin_c: 12"))
    assert load_ruleset(pack_dir=pack).rules["thermal.margin"].thresholds["warn_margin_c"] == 12


SITE_RULE = ("rules:\n  - id: site.x\n    scope: gpu\n    severity: warning\n    summary: s\n"
             "    when: 'index > 0'\n    message: m\n")


@pytest.mark.parametrize(("text", "line", "problem"), [
    # an unknown key at each depth, with the keys its place allows
    (SITE_RULE + "    sumary: s\n", 8,
     "rules[0].sumary: unknown key (allowed: action, auto_clear, cadence,"),
    ("overrides:\n  pcie.replays:\n    treshold: {max_replays: 5}\n", 3,
     "overrides['pcie.replays'].treshold: unknown key (allowed: action, enabled, remediation,"),
    ("xid_catalog:\n  48:\n    severity: warning\n    sevrity: critical\n", 4,
     "xid_catalog[48].sevrity: unknown key (allowed: action, meaning, mnemonic, "
     "nvidia, reason, severity)"),
    # thresholds hold numbers, text, booleans or flat lists of them, at any depth
    (SITE_RULE + "    thresholds:\n      limits: [1, {y: 2}]\n", 9,
     "rules[0].thresholds['limits'][1]: expected `bool | int | float | str`, got `object`"),
    (SITE_RULE + "    thresholds:\n      a: 1\n      x: {y: 1}\n", 10,
     "rules[0].thresholds['x'] must be a number, text, true or false, or a list of them, "
     "not {'y': 1}"),
    ("overrides:\n  pcie.replays:\n    thresholds: {x: {y: 1}}\n", 3,
     "overrides['pcie.replays'].thresholds['x'] must be a number, text"),
    # the Xid catalog: each entry's values, on the line of their key
    ("xid_catalog:\n  13: {severity: warning}\n  48:\n    meaning: [double, bit]\n", 4,
     "xid_catalog[48]: meaning must be text, not ['double', 'bit']"),
    ("xid_catalog:\n  48: {action: [reset_gpu, reboot_now]}\n", 2,
     "xid_catalog[48].action[1] must be one of `contact_vendor`,"),
    ("xid_catalog:\n  48: {action: []}\n", 2,
     "xid_catalog[48]: action must be one of `contact_vendor`, `follow_text`, `ignore`, "
     "`inspect_hardware`, `reboot`, `reset_gpu`, `restart_app`, `update_software`, not []"),
    ("xid_catalog:\n  forty-eight: {severity: warning}\n", 2,
     "xid_catalog: key 'forty-eight': expected `int`, got `str`"),
    # null is not "left out": a key written without a value is a mistake
    ("overrides:\n  pcie.replays:\n    severity:\n", 3,
     "overrides['pcie.replays']: severity must be one of `critical`, `warning`, not None"),
    (SITE_RULE.replace("message: m", "message:"), 7, "rules[0]: message must be text, not None"),
    (SITE_RULE.replace("id: site.x", "id: Site.X"), 2,
     "rules[0]: id must be a lowercase id such as `family.name`"),
    (SITE_RULE.replace("scope: gpu", "scope: node"), 3,
     "rules[0]: scope must be one of `gpu`, `host`, not 'node'"),
    (SITE_RULE.replace("summary: s", "summary: s\n    cadence: sometimes"), 6,
     "rules[0]: cadence must be one of `fast`, `slow`, not 'sometimes'"),
    (SITE_RULE.replace("summary: s", "summary: s\n    tags: [a, 1]"), 6,
     "rules[0].tags[1]: expected `str`, got `int`"),
    (SITE_RULE.replace("    message: m\n", ""), 2, "site.x: a `when:` rule needs a `message`"),
    ("rules:\n  - id: site.x\n    scope: gpu\n    severity: warning\n", 2,
     "rules[0].summary is missing"),
])
def test_a_bad_value_anywhere_in_a_rule_file_is_file_line_and_what(tmp_path, text, line,
                                                                   problem):
    folder = write(tmp_path, "bad.yaml", text)
    with pytest.raises(ConfigError) as caught:
        load_ruleset([folder])
    err = caught.value
    assert err.path.endswith("bad.yaml") and err.line == line, str(err)
    assert err.problem.startswith(problem), str(err)
    assert str(err).startswith(f"{err.path}:{line}: ")


def test_an_override_keeps_a_list_threshold_a_flat_list(tmp_path):
    folder = write(tmp_path, "a.yaml", SITE_RULE + "    thresholds:\n      names: [a, b]\n")
    (folder / "b.yaml").write_text("overrides:\n  site.x:\n    thresholds:\n"
                                   "      names: [a, {b: c}]\n")
    with pytest.raises(ConfigError) as caught:
        load_ruleset([folder])
    assert caught.value.path.endswith("b.yaml") and caught.value.line == 4, str(caught.value)
    assert "overrides['site.x'].thresholds['names'][1]: expected" in str(caught.value)


def test_a_rule_file_with_every_key_loads(tmp_path):
    folder = write(tmp_path, "site.yaml", SITE_RULE + """\
    problem: p
    remediation: "  r  "
    thresholds: {limit: 3, names: [a, b], strict: true, ratio: 0.5, label: x}
    enabled: false
    tags: [failover, site]
    cadence: slow
overrides:
  pcie.replays:
    {severity: critical, enabled: false, remediation: call, thresholds: {max_replays: 9}}
xid_catalog:
  48: {severity: warning}
  777: {severity: critical, action: [reset_gpu, reboot], meaning: site fault}
""")
    ruleset = load_ruleset([folder])
    rule = ruleset.rules["site.x"]
    assert (rule.problem, rule.remediation, rule.enabled, rule.cadence) == ("p", "r", False, "slow")
    assert rule.thresholds == {"limit": 3, "names": ["a", "b"], "strict": True, "ratio": 0.5,
                               "label": "x"}
    assert rule.tags == ("failover", "site") and rule.message == "m"
    replays = ruleset.rules["pcie.replays"]
    assert replays.severity is Status.CRITICAL and replays.enabled is False
    assert replays.remediation == "call" and replays.thresholds["max_replays"] == 9
    assert replays.overrides == [f"{folder / 'site.yaml'}:15"]
    assert ruleset.xid_catalog[48].severity == "warning"
    assert ruleset.xid_catalog[48].actions == ("reset_gpu", "reboot")  # kept from the pack
    assert ruleset.xid_catalog[777].actions == ("reset_gpu", "reboot")
    assert ruleset.xid_catalog[777].origin == f"{folder / 'site.yaml'}:19"
