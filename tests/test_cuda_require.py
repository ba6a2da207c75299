"""NVIDIA_REQUIRE_* as the container toolkit judges them (gpuguard/model/cuda_require.py),
case by case from its documentation (nvidia-container-toolkit's
cmd/nvidia-container-runtime/README.md: "space-separated constraints are ORed,
comma-separated constraints are ANDed", several NVIDIA_REQUIRE_* ANDed,
NVIDIA_DISABLE_REQUIRE, the legacy CUDA_VERSION) and its code (libnvidia-container's
src/cli/dsl.c and configure.c; the toolkit's internal/config/image/cuda_image.go)."""

from __future__ import annotations

import pytest

from gpuguard.model.cuda_require import (
    CUDA_HINT,
    Device,
    check,
    compare_version,
    evaluate,
    requirements,
)

TESLA = Device(0, "Tesla", "9.0")
GEFORCE = Device(1, "GeForce", "8.9")


def state(predicate: str, cuda: str = "12.4", driver: str = "550.54.15",
          device: Device | None = TESLA) -> str:
    return evaluate(predicate, cuda, driver, device).state


# --- the grammar ------------------------------------------------------------------------


def test_a_space_separates_alternatives_any_of_which_may_hold():
    assert state("cuda>=12.8 driver>=550") == "ok"  # the second alternative holds
    assert state("cuda>=12.8 driver>=560") == "refused"
    assert state("cuda>=12.4 driver>=999") == "ok"  # the first holds


def test_a_comma_joins_conditions_that_must_all_hold():
    assert state("brand=tesla,driver>=550") == "ok"
    assert state("brand=tesla,driver>=550", device=GEFORCE) == "refused"
    assert state("brand=tesla,driver>=550,driver<551") == "ok"
    assert state("brand=tesla,driver>=535,driver<536") == "refused"


def test_forward_compatibility_ranges_as_the_cuda_images_write_them():
    predicate = ("cuda>=12.8 brand=tesla,driver>=535,driver<536 "
                 "brand=tesla,driver>=550,driver<551")
    assert state(predicate, "12.4", "550.54.15") == "ok"  # the 550 long-term branch
    assert state(predicate, "12.2", "535.230.02") == "ok"
    assert state(predicate, "12.3", "545.23.08") == "refused"  # not a branch it lists
    assert state(predicate, "12.4", "550.54.15", GEFORCE) == "refused"
    assert state(predicate, "13.0", "580.65.06", GEFORCE) == "ok"  # new enough: no brand asked


def test_every_operator():
    assert [state(f"cuda{op}12.4") for op in ("=", "!=", "<", "<=", ">", ">=")] == \
        ["ok", "refused", "refused", "ok", "refused", "ok"]
    assert [state(f"arch{op}9.0") for op in ("=", "!=", "<", "<=", ">", ">=")] == \
        ["ok", "refused", "refused", "ok", "refused", "ok"]


def test_versions_compare_number_by_number_and_trailing_zeros_do_not_count():
    assert compare_version("12.0", "=", "12") and compare_version("12", "=", "12.0.0")
    assert compare_version("550.54.15", ">=", "550") and compare_version("550.54.15", "<", "551")
    assert compare_version("12.10", ">", "12.9")  # numbers, not text
    assert not compare_version("12.4", ">=", "12.40")
    assert compare_version("13.0", ">", "12.9")


def test_brand_is_text_compared_without_regard_to_case():
    assert state("brand=TESLA") == "ok" and state("brand=tesla") == "ok"
    assert state("brand!=tesla") == "refused" and state("brand!=geforce") == "ok"
    assert state("brand>=tesla") == "refused"  # only = and != : an invalid expression
    assert evaluate("brand>=tesla", "12.4", "550", TESLA).message == "invalid expression"


def test_arch_is_the_compute_capability_of_each_gpu():
    assert state("arch>=9.0") == "ok"
    assert state("arch>=9.0", device=GEFORCE) == "refused"
    assert state("arch=8.9 arch=9.0", device=GEFORCE) == "ok"


def test_without_a_device_arch_and_brand_hold_as_the_toolkit_assumes():
    assert state("brand=geforce,arch>=10.0", device=None) == "ok"
    assert state("brand=geforce,cuda>=12.8", device=None) == "refused"


def test_what_the_toolkit_cannot_evaluate_refuses_the_container():
    for bad in ("foo>=1", "cuda>=12.x", "cuda", "cuda=>12", "cuda>=", ">=12", "cuda==12",
                "cuda<>12", "cuda>=.5"):
        outcome = evaluate(bad, "12.4", "550.54.15", TESLA)
        assert (outcome.state, outcome.message) == ("refused", "invalid expression"), bad


def test_an_invalid_condition_counts_only_when_it_is_reached():
    assert state("cuda>=12.0 foo>=1") == "ok"  # the first alternative holds: never read
    assert state("cuda>=99,foo>=1 cuda>=12.0") == "ok"  # cut short by the failing condition
    # reached only if a brand not known here is Tesla: not known whether it refuses
    nobrand = Device(0, None, "9.0")
    assert state("brand=tesla,foo>=1", device=nobrand) == "unknown"
    assert state("brand=tesla cuda>=99,foo>=1", device=nobrand) == "unknown"


def test_the_quirks_of_the_toolkit_code():
    # a lone "!" is read as "!=" (the operator is matched by its first characters)
    assert state("brand!tesla") == "refused" and state("brand!geforce") == "ok"
    # an alternative of empty conditions ends the evaluation with the value before it
    assert state("cuda>=99 , cuda>=1") == "refused"
    assert state(", cuda>=99") == "ok"
    # spaces around are empty alternatives: skipped
    assert state("  cuda>=12.0   ") == "ok"
    assert state("") == "ok"


def test_the_message_is_the_first_alternative_with_the_toolkits_hint():
    outcome = evaluate("cuda>=12.8 brand=tesla,driver>=535,driver<536", "12.4", "550.54.15",
                       TESLA)
    assert outcome.message == "unsatisfied condition: cuda>=12.8" + CUDA_HINT
    assert evaluate("arch>=10.0", "12.4", "550", TESLA).message == \
        "unsatisfied condition: arch>=10.0"


def test_a_fact_not_known_here_makes_only_what_needs_it_unknown():
    nobrand = Device(0, None, "9.0")
    assert state("cuda>=12.4 brand=tesla", device=nobrand) == "ok"  # not needed
    outcome = evaluate("cuda>=12.8 brand=tesla,driver>=550", "12.4", "550.54.15", nobrand)
    assert (outcome.state, outcome.message) == ("unknown", "brand=tesla is not known here")
    # a condition that fails whatever the brand is still refuses
    assert state("cuda>=12.8 brand=tesla,driver>=999", device=nobrand) == "refused"
    assert evaluate("cuda>=12.8", None, "550", TESLA).state == "unknown"


# --- which variables ---------------------------------------------------------------------


def test_every_nvidia_require_variable_counts_and_they_all_must_hold():
    env = {"NVIDIA_REQUIRE_CUDA": "cuda>=12.0", "NVIDIA_REQUIRE_ARCH": "arch>=9.0"}
    assert check(env, "12.4", "550.54.15", [TESLA]).state == "ok"
    refused = check(env, "12.4", "550.54.15", [TESLA, GEFORCE])
    assert (refused.state, refused.device, refused.requirement) == ("refused", 1, "arch>=9.0")


def test_jetpack_requirements_are_not_checked():
    env = {"NVIDIA_REQUIRE_JETPACK": "csv-mounts=all", "NVIDIA_REQUIRE_JETPACK_HOST_MOUNTS": "x"}
    assert requirements(env) == []


@pytest.mark.parametrize("value, off", [
    ("1", True), ("true", True), ("TRUE", True), ("True", True), ("t", True),
    ("0", False), ("false", False), ("yes", False), ("on", False), ("", False)])
def test_nvidia_disable_require_is_a_go_boolean(value, off):
    env = {"NVIDIA_REQUIRE_CUDA": "cuda>=99.0", "NVIDIA_DISABLE_REQUIRE": value}
    assert (check(env, "12.4", "550", [TESLA]).state == "ok") is off


def test_a_legacy_image_requires_its_cuda_version():
    assert requirements({"CUDA_VERSION": "12.8.1"}) == ["cuda>=12.8"]
    assert requirements({"CUDA_VERSION": "v9.0"}) == ["cuda>=9.0"]
    # NVIDIA_REQUIRE_CUDA set (not empty) replaces it
    assert requirements({"CUDA_VERSION": "12.8.1", "NVIDIA_REQUIRE_CUDA": "cuda>=12.0"}) == \
        ["cuda>=12.0"]
    refused = check({"CUDA_VERSION": "12.8.1"}, "12.4", "550", [TESLA])
    assert refused.message == "unsatisfied condition: cuda>=12.8" + CUDA_HINT
    bad = check({"CUDA_VERSION": "twelve"}, "12.4", "550", [TESLA])
    assert bad.state == "refused" and "failed to get requirements" in bad.message


def test_no_gpu_given_is_evaluated_once_without_a_device():
    env = {"NVIDIA_REQUIRE_CUDA": "cuda>=12.8 brand=tesla,driver>=550"}
    assert check(env, "12.4", "550.54.15", []).state == "ok"  # brand assumed to hold


# --- the driver capabilities ---------------------------------------------------------------


def test_driver_capabilities_as_the_runtime_hook_reads_them():
    from gpuguard.model.cuda_require import CAPABILITIES, Invalid, driver_capabilities

    assert driver_capabilities({}) == {"utility", "compute"}  # the default
    assert driver_capabilities({"NVIDIA_DRIVER_CAPABILITIES": ""}) == {"utility", "compute"}
    assert driver_capabilities({"CUDA_VERSION": "9.0"}) == CAPABILITIES  # legacy: all
    assert driver_capabilities({"NVIDIA_DRIVER_CAPABILITIES": " utility , video,"}) == \
        {"utility", "video"}
    assert driver_capabilities({"NVIDIA_DRIVER_CAPABILITIES": "all"}) == CAPABILITIES
    assert driver_capabilities({"NVIDIA_DRIVER_CAPABILITIES": ","}) == set()
    with pytest.raises(Invalid, match="unsupported capabilities found in 'comptue,utility'"):
        driver_capabilities({"NVIDIA_DRIVER_CAPABILITIES": "comptue,utility"})


# --- issue 28, item 4: every NVIDIA_REQUIRE_ name, and numbers the toolkit cannot hold ------


def test_every_name_with_the_prefix_is_a_requirement():
    """GetRequirements (internal/config/image/cuda_image.go): strings.HasPrefix(name,
    "NVIDIA_REQUIRE_"), whatever follows; NVIDIA_REQUIRE_JETPACK* is left out."""
    env = {"NVIDIA_REQUIRE_CUDA": "cuda>=12.0", "NVIDIA_REQUIRE_CUDA.OLD": "cuda>=99.0",
           "NVIDIA_REQUIRE_ x-y": "driver>=1", "NVIDIA_REQUIRE_JETPACK_HOST_MOUNTS": "x"}
    assert requirements(env) == ["driver>=1", "cuda>=12.0", "cuda>=99.0"]  # in name order
    refused = check(env, "12.4", "550", [TESLA])
    assert (refused.state, refused.variable) == ("refused", "NVIDIA_REQUIRE_CUDA.OLD")


def test_at_most_32_requirements_as_nvidia_container_cli_takes():
    """src/cli/cli.h `char *reqs[32]`; configure.c: "too many requirements", the container
    does not start."""
    env = {f"NVIDIA_REQUIRE_{i:02d}": "cuda>=1.0" for i in range(32)}
    assert check(env, "12.4", "550", [TESLA]).state == "ok"
    env["NVIDIA_REQUIRE_32"] = "cuda>=1.0"
    refused = check(env, "12.4", "550", [TESLA])
    assert (refused.state, refused.message) == ("refused", "input error: too many requirements")


def test_a_number_past_uintmax_is_an_invalid_expression_not_a_python_error():
    """dsl_compare_version reads each number with strtoumax: UINTMAX_MAX (an overflow, or
    exactly 2**64-1) is -1, "invalid expression". Thousands of digits are past Python's
    int conversion limit too: refused, never ValueError."""
    from gpuguard.model.cuda_require import Invalid

    assert compare_version("12.4", ">=", str(2**64 - 2)) is False
    for number in (str(2**64 - 1), str(2**64), "1" + "0" * 5000, "0" * 6000 + "1" + "0" * 30):
        with pytest.raises(Invalid, match="64-bit"):
            compare_version("12.4", ">=", number)
    assert compare_version("12.4", ">=", "0" * 6000 + "12.4") is True  # leading zeros: 12
    outcome = check({"NVIDIA_REQUIRE_CUDA": "cuda>=" + "9" * 5000}, "12.4", "550", [TESLA])
    assert (outcome.state, outcome.message, outcome.variable) == \
        ("refused", "invalid expression", "NVIDIA_REQUIRE_CUDA")
    assert "5000 digits" in outcome.detail


def test_a_legacy_cuda_version_must_fit_the_toolkits_uint32():
    """parseMajorMinorVersion: strconv.ParseUint(major, 10, 32), and the minor: past
    4294967295 the hook cannot get the requirements."""
    assert requirements({"CUDA_VERSION": "4294967295.4294967295"}) == \
        ["cuda>=4294967295.4294967295"]
    for version in ("4294967296.0", "12.4294967296", "1" + "0" * 5000 + ".0"):
        refused = check({"CUDA_VERSION": version}, "12.4", "550", [TESLA])
        assert refused.state == "refused" and refused.variable == "CUDA_VERSION", version
        assert "failed to get requirements" in refused.message and \
            "32-bit" in refused.message and len(refused.message) < 300, refused.message


def test_a_failed_condition_too_long_to_quote_is_an_invalid_expression():
    """evaluate_rule (src/cli/dsl.c) quotes a failed condition as "NAME OP VALUE" into a
    buffer of EXPR_MAX (128): one that does not fit gives -1, "invalid expression", and
    dsl_evaluate stops there: the alternative after it, which holds, is never reached."""
    long_value = "99." + "0" * 130
    assert state(f"cuda>={long_value} cuda>=1.0") == "refused"
    assert evaluate(f"cuda>={long_value}", "12.4", "550", TESLA).message == "invalid expression"
    assert state(f"cuda<={long_value} cuda>=99.0") == "ok"  # it held: never quoted
    assert state("brand=" + "x" * 119 + " cuda>=1.0") == "ok"  # 127 bytes quoted: fits
    assert state("brand=" + "x" * 120 + " cuda>=1.0") == "refused"
