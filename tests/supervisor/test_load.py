"""Requests without pause while the service fails over and back (loopback, bounded).

With the nginx router no request may fail: that is asserted. Without a router the
switch is stop-then-start on one port; its cost is measured, not asserted. With
GPUGUARD_LOAD_REPORT=FILE the numbers are written there (bench/failover_load.sh).
"""

import http.client
import json
import os
import threading
import time
import urllib.request
from datetime import datetime

from tests.supervisor.conftest import settled_on, start_supervised, state_of, wait

LIMIT_S = 90  # the client stops by itself after this, whatever happens


class Client:
    def __init__(self, url):
        self.url = url
        self.results = []  # (time, variant or None)
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)

    def run(self):
        end = time.monotonic() + LIMIT_S
        while not self.stop.is_set() and time.monotonic() < end:
            t = time.time()
            try:
                with urllib.request.urlopen(self.url, timeout=2) as resp:
                    self.results.append((t, resp.read().decode().strip()))
            except (OSError, http.client.HTTPException):
                # a server killed mid-response fails the request; it must not end the client
                self.results.append((t, None))

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join()

    def summary(self):
        failed = [t for t, v in self.results if v is None]
        return {"requests": len(self.results), "failed": len(failed),
                "downtime_s": round(failed[-1] - failed[0], 3) if failed else 0.0}

    def first_answer(self, variant, after):
        return next((t for t, v in self.results if v == variant and t >= after), None)


def event_time(log_text, event):
    for line in log_text.splitlines():
        if f'"event": "{event}"' in line:
            stamp = json.loads(line)["timestamp"]
            return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()
    return None


def report(name, data):
    path = os.environ.get("GPUGUARD_LOAD_REPORT")
    if path:
        with open(path, "a") as out:
            out.write(json.dumps({"case": name, **data}) + "\n")


def cycle_out_and_back(daemon, setup, client):
    setup["faulty"](True)
    assert wait(lambda: settled_on(setup, "cpu"), 60), state_of(setup)
    to_cpu = event_time(daemon.log.read_text(), "failover_started")
    cpu_answered = client.first_answer("cpu", to_cpu or 0)
    setup["faulty"](False)
    assert wait(lambda: settled_on(setup, "gpu"), 60), state_of(setup)
    return {"third_failed_cycle_to_cpu_answering_s":
            round(cpu_answered - to_cpu, 3) if to_cpu and cpu_answered else None}


def test_no_request_is_lost_with_the_router(start_daemon, service_setup):
    setup = service_setup
    daemon = start_supervised(start_daemon, setup, setup["write"]())
    assert wait(lambda: settled_on(setup, "gpu"))
    with Client(setup["nginx"]["url"] + "/variant") as client:
        time.sleep(1)
        timing = cycle_out_and_back(daemon, setup, client)
        time.sleep(1)
    summary = client.summary()
    report("nginx router", {**summary, **timing})
    served = {v for _, v in client.results}
    assert {"gpu", "cpu"} <= served
    assert summary["failed"] == 0, summary


def test_without_a_router_the_switch_is_measured(start_daemon, service_setup):
    setup = service_setup
    daemon = start_supervised(start_daemon, setup, setup["write"](router=False))
    port = setup["ports"]["gpu"]
    url = f"http://127.0.0.1:{port}/variant"

    def settled(variant):
        st = state_of(setup)
        return bool(st and st["active"] == variant and st["transition"] is None
                    and setup["running"]() == {variant})

    assert wait(lambda: settled("gpu"))
    with Client(url) as client:
        time.sleep(1)
        setup["faulty"](True)
        assert wait(lambda: settled("cpu"), 60)
        to_cpu = event_time(daemon.log.read_text(), "failover_started")
        assert wait(lambda: client.first_answer("cpu", to_cpu or 0) is not None, 30), (
            to_cpu, client.results[-3:], sorted({v for _, v in client.results}, key=str))
        time.sleep(1)
    summary = client.summary()
    cpu_answered = client.first_answer("cpu", to_cpu or 0)
    report("no router (stop, then start on one port)",
           {**summary, "third_failed_cycle_to_cpu_answering_s":
            round(cpu_answered - to_cpu, 3) if to_cpu and cpu_answered else None})
    assert {v for _, v in client.results} >= {"gpu", "cpu"}
