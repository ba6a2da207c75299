"""The failover policy as a pure function: counting, flapping, failback, manual mode."""

import pytest

from gpuguard.model.identity import GpuId
from gpuguard.model.results import Result, Status
from gpuguard.supervisor.policy import Counts, decide, outcome

TAGGED = {"memory.row_remap", "driver.responsive", "xid.recent"}


def results(*statuses, rule="memory.row_remap", gpu=0):
    return [Result(rule, s, Status.CRITICAL, "m", GpuId(gpu, "u", "p")) for s in statuses]


def run(seq, active="gpu", on_cpu_since=None, now=0.0, manual=False, min_cpu=0.0):
    counts = Counts()
    actions = []
    for i, out in enumerate(seq):
        counts, action = decide(active, counts, out, now + i, on_cpu_since, 3, 10, min_cpu,
                                manual)
        actions.append(action)
        if action:
            break
    return actions


def test_two_failed_cycles_do_nothing_three_fail_over():
    assert run(["failed", "failed"]) == [None, None]
    assert run(["failed", "failed", "failed"]) == [None, None, "to_cpu"]


def test_a_passing_cycle_resets_unknown_neither_counts_nor_resets():
    assert run(["failed", "failed", "passed", "failed", "failed"]) == [None] * 5
    assert run(["failed", "failed", "unknown", "failed"])[-1] == "to_cpu"
    assert run(["failed", "unknown", "unknown", "failed"])[-1] is None


def test_flapping_health_does_not_flap_the_service():
    assert all(a is None for a in run(["failed", "failed", "passed"] * 20))


def test_failback_needs_healthy_cycles_and_time_on_cpu():
    assert run(["passed"] * 10, active="cpu", on_cpu_since=0.0)[-1] == "to_gpu"
    assert run(["passed"] * 9, active="cpu", on_cpu_since=0.0)[-1] is None
    # ten healthy cycles, but only 9 s on CPU against a 300 s minimum
    assert run(["passed"] * 10, active="cpu", on_cpu_since=0.0, min_cpu=300)[-1] is None
    assert run(["passed"] * 10, active="cpu", on_cpu_since=0.0, now=300, min_cpu=300)[-1] \
        == "to_gpu"


def test_manual_failback_waits_for_the_command():
    assert all(a is None for a in run(["passed"] * 50, active="cpu", on_cpu_since=0.0,
                                      manual=True))


def test_outcome_counts_only_failover_rules_and_gpus():
    assert outcome(results(Status.CRITICAL), None, TAGGED, None)[0] == "failed"
    # a critical of a rule not tagged for failover does not count
    assert outcome(results(Status.CRITICAL, rule="power.limit"), None, TAGGED, None)[0] \
        == "passed"
    # a warning (row remap pending) is not a failure
    assert outcome(results(Status.WARNING), None, TAGGED, None)[0] == "passed"
    assert outcome(results(Status.UNKNOWN), None, TAGGED, None)[0] == "unknown"
    # the service uses GPUs 2 and 3: GPU 0's failure is not its problem
    assert outcome(results(Status.CRITICAL, gpu=0), None, TAGGED, [2, 3])[0] == "passed"
    # host rules count for every service
    host = [Result("driver.responsive", Status.CRITICAL, Status.CRITICAL, "m", None)]
    assert outcome(host, None, TAGGED, [2, 3])[0] == "failed"
    # a host result that names its GPUs (gpu.count's missing GPU 1) counts only for the
    # services on them
    gone = [Result("gpu.count", Status.CRITICAL, Status.CRITICAL, "m", None,
                   observed={"gpus": [1]})]
    assert outcome(gone, None, TAGGED | {"gpu.count"}, [2, 3])[0] == "passed"
    assert outcome(gone, None, TAGGED | {"gpu.count"}, [1])[0] == "failed"
    assert outcome(gone, None, TAGGED | {"gpu.count"}, None)[0] == "failed"
    # explicit rule list
    assert outcome(results(Status.CRITICAL, rule="power.limit"), ["power.*"], TAGGED,
                   None)[0] == "failed"


def test_service_results_do_not_count_while_on_cpu():
    """On the CPU variant service.* judges the CPU variant: a slow or failing CPU answer
    says nothing about the GPU and must not hold the service off it; on the GPU variant it
    counts as before. A GPU rule counts on either."""
    inference = Result("service.inference", Status.CRITICAL, Status.CRITICAL, "llm: failed",
                       observed={"service_status": {"llm": "critical"}})
    tagged = {*TAGGED, "service.inference"}
    assert outcome([inference], None, tagged, None, "llm", active="gpu")[0] == "failed"
    assert outcome([inference], None, tagged, None, "llm", active="cpu") == ("passed", [])
    # listed by the service's own `rules:` it is still about the CPU variant
    assert outcome([inference], ["service.*"], tagged, None, "llm", active="cpu")[0] \
        == "passed"
    assert outcome([inference, *results(Status.CRITICAL)], None, tagged, None, "llm",
                   active="cpu")[0] == "failed"


@pytest.mark.parametrize(("text", "line", "words"), [
    ("services:\n  - name: llm\n    backend: podman\n    probe: {http: x}\n", 3,
     "backend must be docker, systemd or exec"),
    ("services:\n  - name: llm\n    backend: docker\n    probe: {http: x}\n", 2,
     "needs a `docker:` section"),
    ("services:\n  - name: llm\n    backend: docker\n    probe: {http: x}\n    docker:\n"
     "      gpu: {name: a, image: b}\n", 5, "docker.cpu is missing"),
    ("services:\n  - name: llm\n    backend: exec\n    probe: {}\n    exec:\n"
     "      {start_gpu: [a], stop_gpu: [a], start_cpu: [a], stop_cpu: [a]}\n", 4,
     "probe needs"),
    ("services:\n  - name: llm\n    backend: systemd\n    probe: {http: x}\n    systemd:\n"
     "      gpu: a.service\n      cpu: b.service\n    failover_after: 0\n", 8,
     "services[0].failover_after: expected `int` >= 1"),
    ("services:\n  - name: llm\n    backend: systemd\n    probe: {http: x}\n    systemd:\n"
     "      gpu: a.service\n      cpu: b.service\n    fallback: manual\n", 8,
     "services[0].fallback: unknown key"),
])
def test_bad_service_config_names_file_and_line(tmp_path, text, line, words):
    from gpuguard.config.yamlfile import ConfigError
    from gpuguard.supervisor.config import load_services

    path = tmp_path / "gpuguard.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as caught:
        load_services(path)
    assert caught.value.line == line, str(caught.value)
    assert words in str(caught.value)


def test_corrupt_state_file_is_moved_aside(tmp_path):
    from gpuguard.supervisor import state

    path = state.path_for(tmp_path, "llm")
    path.write_text('{"active": "gpu", "since": ')
    with pytest.raises(state.CorruptState) as caught:
        state.load(path)
    assert not path.exists() and caught.value.moved_to.exists()
    assert state.load(path) is None
    good = state.ServiceState(active="cpu", reason="test")
    state.save(path, good)
    assert state.load(path).active == "cpu"
    path.write_text('{"active": "tpu"}')
    with pytest.raises(state.CorruptState):
        state.load(path)


def test_the_supervisor_on_cpu_counts_a_failed_inference_as_healthy(tmp_path):
    """The wiring: the supervisor passes its active variant to the outcome, so on CPU a
    critical service.inference cycle is a healthy cycle towards failback."""
    import json

    from gpuguard.supervisor.config import load_services
    from gpuguard.supervisor.service import Supervisor

    config = tmp_path / "gpuguard.yaml"
    config.write_text(json.dumps({"services": [{
        "name": "llm", "backend": "exec", "probe": {"exec": ["true"]},
        "exec": {"start_gpu": ["true"], "stop_gpu": ["true"], "start_cpu": ["true"],
                 "stop_cpu": ["true"]}}]}))
    [service] = load_services(config)
    supervisor = Supervisor(service, tmp_path / "state", {"service.inference"}, dry_run=True)
    inference = Result("service.inference", Status.CRITICAL, Status.CRITICAL, "llm: slow",
                       observed={"service_status": {"llm": "critical"}})
    supervisor.state.active = "cpu"
    supervisor.handle_cycle([inference], 0.0)
    assert (supervisor.state.failed_cycles, supervisor.state.healthy_cycles) == (0, 1)
    supervisor.state.active = "gpu"
    supervisor.handle_cycle([inference], 1.0)
    assert (supervisor.state.failed_cycles, supervisor.state.healthy_cycles) == (1, 0)
