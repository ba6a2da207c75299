"""Issue 34, item 1: the real commands' `--format json` documents, validated against the
schema files committed in gpuguard/outputs/schemas/ (replayed snapshots, the fake NVML, fixture
state dirs, the fake Slurm; never the host)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from gpuguard.cli.main import main
from gpuguard.events import store
from gpuguard.events.writer import EventWriter
from gpuguard.supervisor import state as supervisor_state
from tests.conftest import FIXTURES, gpuguard, own_host
from tests.daemon.conftest import host_snapshot, write_snapshot
from tests.schemas.conftest import document_of, problems, validate
from tests.slurm.test_slurm_scripts import FAKE_SLURM
from tests.test_one_verdict_differential import SNAPSHOTS

XIDS = "".join(f"4,{100 + i},{(1000 + i * 60) * 1_000_000},-;NVRM: Xid (PCI:0000:10:00): 79, "
               "pid='<unknown>', name=<unknown>, GPU has fallen off the bus.\n"
               for i in range(2))


def dropped_each(doc: dict[str, Any], name: str) -> None:
    """The schema is strict enough to miss each top-level field the command printed."""
    for key in doc:
        if key != "notes":  # check's only optional field: printed only when there are notes
            assert problems({k: v for k, v in doc.items() if k != key}, name), key


@pytest.mark.parametrize("snapshot", SNAPSHOTS, ids=lambda p: str(p.relative_to(FIXTURES)))
def test_check_on_every_recorded_snapshot(snapshot):
    doc = document_of(gpuguard("check", "--input", str(snapshot), "--format", "json"),
                      0, 1, 2, 3)
    validate(doc, "check")
    dropped_each(doc, "check")
    if doc["results"]:
        result = doc["results"][0]
        for key in result:
            broken = {**doc, "results": [{k: v for k, v in result.items() if k != key}]}
            assert problems(broken, "check"), key


def test_check_live_on_the_fake_nvml_with_a_lost_gpu(fake_env, host_args):
    doc = document_of(gpuguard("check", *host_args, "--format", "json",
                               env=fake_env(gpus=2, lost_gpu=1)), 2)
    validate(doc, "check")


def test_status_is_the_daemons_verdict_in_checks_document(start_daemon, tmp_path):
    snap = tmp_path / "hot.json"
    write_snapshot(snap, host_snapshot(2, {(0, "temperature_tlimit_margin_c"): -5}))
    sock = tmp_path / "status.sock"
    start_daemon("--input", str(snap), "--status-socket", str(sock), "--fast-interval", "1")
    doc = document_of(gpuguard("status", "--socket", str(sock), "--format", "json",
                               timeout=30), 2)
    validate(doc, "check")
    assert doc["notes"]  # the daemon says whose verdict it is: the optional field, present
    dropped_each(doc, "check")


def test_qualify_prints_checks_document(fake_nvml, fake_cuda, tmp_path):
    from tests.qualify.test_qualify_cli import FAKE_TARGETS, environment, host

    proc = gpuguard("qualify", *host(tmp_path / "host"), "--level", "quick", "--seconds", "1",
                    "--format", "json", "--targets", str(FAKE_TARGETS),
                    env=environment(fake_nvml, fake_cuda, {}), timeout=120)
    doc = document_of(proc, 0)
    validate(doc, "check")
    assert doc["results"] and all(r["rule"].startswith("qualify.") for r in doc["results"])


def recorded_state(tmp_path: Path, fake_env: Any) -> Path:
    """A state dir whose store holds rule transitions, Xids and an ack (a live `check
    --record` on the fake NVML, and `gpuguard ack`)."""
    host = own_host(tmp_path / "host", kmsg=XIDS)
    document_of(gpuguard("check", *host, "--record", "--format", "json",
                         env=fake_env(gpus=2)), 2)
    state = Path(host[host.index("--state-dir") + 1])
    acked = gpuguard("ack", "xid.recent", "--gpu", "0", "--reason", "RMA case 1",
                     "--state-dir", str(state), "--path.procfs", host[1],
                     "--kmsg-file", host[host.index("--kmsg-file") + 1])
    assert acked.returncode == 0, acked.stderr
    return state


def test_events_of_a_recorded_store_and_of_none(tmp_path, fake_env):
    state = recorded_state(tmp_path, fake_env)
    doc = document_of(gpuguard("events", "--state-dir", str(state), "--format", "json"), 0)
    validate(doc, "events")
    assert {e["kind"] for e in doc["events"]} >= {"rule", "xid", "ack"}
    dropped_each(doc, "events")
    event = doc["events"][0]
    for key in event:
        assert problems({**doc, "events": [{k: v for k, v in event.items() if k != key}]},
                        "events"), key
    empty = document_of(gpuguard("events", "--state-dir", str(state), "--kind", "repair",
                                 "--format", "json"), 0)
    assert empty["events"] == []
    validate(empty, "events")


def cli(*args: str) -> Any:
    """The command run in this process (click's runner): for the runs by the hundred."""
    out = CliRunner().invoke(main, list(args), catch_exceptions=False)
    assert out.exit_code == 0, out.output
    return json.loads(out.output)


def test_rules_list_and_fields(tmp_path):
    doc = document_of(gpuguard("rules", "list", "--format", "json"), 0)
    validate(doc, "rules-list")
    dropped_each(doc, "rules-list")
    for key in doc["rules"][0]:
        assert problems({**doc, "rules": [{k: v for k, v in doc["rules"][0].items()
                                           if k != key}]}, "rules-list"), key
    fields = document_of(gpuguard("rules", "fields", "--format", "json"), 0)
    validate(fields, "rules-fields")
    dropped_each(fields, "rules-fields")


def test_rules_explain_of_every_rule_and_an_overridden_one(tmp_path):
    ids = [r["id"] for r in cli("rules", "list", "--format", "json")["rules"]]
    for rule_id in ids:
        validate(cli("rules", "explain", rule_id, "--format", "json"), "rules-explain")
    rules = tmp_path / "rules.d"
    rules.mkdir()
    (rules / "site.yaml").write_text("overrides:\n  thermal.margin: {thresholds: "
                                     "{warn_margin_c: 9}}\n")
    doc = document_of(gpuguard("rules", "explain", "thermal.margin", "--rules", str(rules),
                               "--format", "json"), 0)
    validate(doc, "rules-explain")
    assert doc["rule"]["changed_at"] and doc["rule"]["thresholds"]["warn_margin_c"] == 9
    for key in doc["rule"]:
        assert problems({**doc, "rule": {k: v for k, v in doc["rule"].items() if k != key}},
                        "rules-explain"), key


def supervised(state: Path) -> None:
    """Two services' state files (one on CPU, moving back), a file that is not one, and a
    failover in the store."""
    on_cpu = supervisor_state.ServiceState(active="cpu", reason="xid.recent critical")
    on_cpu.transition = supervisor_state.Transition("gpu", "stopping_cpu", "healthy", 1.0e9)
    on_cpu.qualify_after = 1.0e9
    supervisor_state.save(supervisor_state.path_for(state, "llm"), on_cpu)
    supervisor_state.save(supervisor_state.path_for(state, "embed"),
                          supervisor_state.ServiceState())
    supervisor_state.path_for(state, "broken").write_text("{not json")
    writer = EventWriter(store.path_in(state), integrity_check=False)
    writer.record(store.Event(kind="supervisor", source="supervisor", rule="llm",
                              status="on_cpu", action="reset_gpu", message="to CPU"))
    writer.flush()
    writer.close()


def test_failover_status_of_services_a_bad_file_and_the_store(tmp_path):
    state = tmp_path / "state"
    state.mkdir()
    supervised(state)
    # an unreadable state file is exit 3, as the text's is, after the document
    doc = document_of(gpuguard("failover", "status", "--state-dir", str(state),
                               "--format", "json"), 3)
    validate(doc, "failover-status")
    assert [s["service"] for s in doc["services"]] == ["embed", "llm"]
    assert len(doc["unreadable"]) == 1 and doc["transitions"][0]["kind"] == "supervisor"
    dropped_each(doc, "failover-status")
    llm = doc["services"][1]
    for key in llm:
        assert problems({**doc, "services": [{k: v for k, v in llm.items() if k != key}]},
                        "failover-status"), key
    nothing = document_of(gpuguard("failover", "status", "--state-dir", str(tmp_path / "no"),
                                   "--format", "json"), 0)
    validate(nothing, "failover-status")


def health(tmp_path: Path, snapshot: Path, nodes: str | None) -> Any:
    slurm = tmp_path / "slurm"
    slurm.mkdir(parents=True, exist_ok=True)
    if nodes is not None:
        (slurm / "nodes").write_text(nodes)
    state = tmp_path / "state"
    proc = gpuguard("slurm", "health", "--no-daemon", "--brake-jitter", "0", "--node", "n1",
                    "--slurm-bin", str(FAKE_SLURM), "--slurm-conf", str(slurm / "slurm.conf"),
                    "--input", str(snapshot), "--state-dir", str(state), "--no-qualify",
                    "--path.procfs", own_host(tmp_path / "host")[1], "--format", "json",
                    env={"PATH": os.environ["PATH"]}, timeout=120)
    return document_of(proc, 0, 3)


def test_slurm_health_drains_and_says_so_in_the_verdict_schema(tmp_path):
    hot = tmp_path / "hot.json"
    write_snapshot(hot, host_snapshot(2, {(0, "remapped_rows_failure"): True}))
    doc = health(tmp_path, hot, "n1|IDLE|Unknown|gpu|none\n")
    validate(doc, "slurm-health")
    assert doc["plan"]["do"] == "drain" and doc["verdict"]["results"], doc
    dropped_each(doc, "slurm-health")
    for key in doc["verdict"]:
        assert problems({**doc, "verdict": {k: v for k, v in doc["verdict"].items()
                                            if k != key}}, "slurm-health"), key
    # Slurm not answering: exit 3, a verdict but no plan
    unknown = health(tmp_path / "gone", hot, None)
    validate(unknown, "slurm-health")
    assert unknown["exit_code"] == 3 and unknown["plan"] is None
