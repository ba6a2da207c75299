"""Out-of-memory kills in the kernel log (host.memory): real line formats of Linux 4.x and
5.0+, host-wide and cgroup kills, one event per kill, bounded like Xids."""

from __future__ import annotations

import re

from gpuguard.sources import kmsg
from tests.conftest import FIXTURES

OOM_LOG = FIXTURES / "kmsg" / "oom.kmsg"
EXPECTED = [
    {"pid": 3111, "process": "python3", "scope": "host", "cgroup": None,
     "seq": 1201, "usec": 5_000_000_100},
    {"pid": 48213, "process": "python3", "scope": "host",
     "cgroup": "/system.slice/vllm-cpu.service", "seq": 2403, "usec": 90_000_000_100},
    {"pid": 52001, "process": "pt_main_thread", "scope": "cgroup",
     "cgroup": "/system.slice/docker-4f2a9c.scope", "seq": 3002, "usec": 99_000_000_100},
]


def test_each_kill_is_one_event_with_its_victim():
    log = kmsg.read_file(OOM_LOG).get()
    # the "invoked oom-killer" lines name the process that asked, not the victim; the
    # oom_reaper line is the same kill cleaned up: neither is an event
    assert log["ooms"] == EXPECTED
    assert log["ooms_dropped"] == 0 and log["xids"] == []


def test_dmesg_format_gives_the_same_kills(tmp_path):
    human = []
    for line in OOM_LOG.read_text().splitlines():
        _, _, usec, rest = line.split(",", 3)
        human.append(f"[{int(usec) // 10**6:>5}.{int(usec) % 10**6:06d}] {rest.split(';', 1)[1]}")
    path = tmp_path / "dmesg.log"
    path.write_text("\n".join(human) + "\n")
    log = kmsg.read_file(path).get()
    assert [{**e, "seq": None} for e in EXPECTED] == log["ooms"]


def test_a_kill_line_alone_counts(tmp_path):
    path = tmp_path / "dmesg.log"
    path.write_text("[ 10.000000] Memory cgroup out of memory: Killed process 7 (vllm) "
                    "total-vm:1kB, anon-rss:1kB, file-rss:0kB, shmem-rss:0kB, UID:0\n"
                    "[ 11.000000] Out of memory (oom_kill_allocating_task): Killed process 8 "
                    "(tritonserver) total-vm:1kB\n")
    assert [(e["pid"], e["process"], e["scope"]) for e in kmsg.read_file(path).get()["ooms"]] \
        == [(7, "vllm", "cgroup"), (8, "tritonserver", "host")]


def test_lines_that_only_look_like_kills_are_not(tmp_path):
    path = tmp_path / "dmesg.log"
    path.write_text("[ 1.0] systemd[1]: Killed process 99 (sleep) with signal SIGKILL.\n"
                    "[ 2.0] oom-kill:constraint=CONSTRAINT_NONE,task=x,pid=notanumber\n"
                    f"[ 3.0] Out of memory: Killed process {'9' * 30} (x) total-vm:1kB\n")
    assert kmsg.read_file(path).get()["ooms"] == []


def test_kills_are_bounded_and_the_rest_counted(tmp_path):
    n = kmsg.MAX_OOMS + 40
    path = tmp_path / "loop.log"
    path.write_text("".join(f"[{10 + i}.000000] Out of memory: Killed process {1000 + i} "
                            f"(worker) total-vm:1kB\n" for i in range(n)))
    log = kmsg.read_file(path).get()
    assert len(log["ooms"]) == kmsg.MAX_OOMS and log["ooms_dropped"] == 40
    assert log["ooms"][-1]["pid"] == 1000 + n - 1  # the newest are kept
    assert re.fullmatch(r"\d+", str(log["ooms"][0]["pid"]))
