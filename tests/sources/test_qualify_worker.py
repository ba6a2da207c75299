"""qualify's CUDA worker (gpuguard/sources/qualify/child.py, burn.py) on the fake
libcuda, which emulates the kernels as the PTX computes them: the results checked, a
corrupted SM located, a corruption everywhere not blamed on the GPU, a one-off not
reproduced, the drill found, a memory-test mismatch named, everything released.

The worker runs in a subprocess: libcuda.so.1 is found through LD_LIBRARY_PATH, read
when a process starts."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from gpuguard.sources.qualify import kernels
from tests.conftest import REPO

SCRIPT = """
import io, json, sys, tempfile
from gpuguard.sources.qualify import child, plan
opts = plan.options("quick", seed=5, burn_s=float(sys.argv[1]),
                    flip_sm=None if sys.argv[2] == "-" else int(sys.argv[2]))
out = io.StringIO()
with tempfile.TemporaryFile() as lock:
    child.run(out, 0, "00000000:10:00.0", [(1, "00000000:11:00.0")], opts, lock.fileno())
print(out.getvalue())
"""


def worker(fake_cuda: Path, burn_s: float = 0.4, flip: int | None = None,
           **switches: str | int) -> dict[str, Any]:
    env = {"LD_LIBRARY_PATH": str(fake_cuda), "PYTHONPATH": str(REPO),
           **{k.upper(): str(v) for k, v in switches.items()}}
    proc = subprocess.run([sys.executable, "-c", SCRIPT, str(burn_s),
                           "-" if flip is None else str(flip)],
                          capture_output=True, text=True, env=env, timeout=60, check=True)
    lines = [json.loads(line) for line in proc.stdout.splitlines() if line.strip()]
    out: dict[str, Any] = {"lines": lines}
    for m in lines:
        if m["t"] == "result":
            out[m["section"]] = m["value"]
        if m["t"] in ("cuda_error", "fatal"):
            out["error"] = m
    return out


def test_a_healthy_gpu_computes_every_tile_right_and_gives_everything_back(fake_cuda, tmp_path):
    log = tmp_path / "cuda.log"
    run = worker(fake_cuda, fake_cuda_log=str(log))
    compute = run["compute"]
    assert "error" not in run
    assert compute["mismatches"] == 0 and compute["examples"] == []
    assert compute["tiles_computed"] == compute["tiles_compared"] > 0
    assert compute["launches"] >= 2 and compute["sms"] == 10
    assert "located" not in run
    memtest = run["memtest"]
    assert memtest["mismatches"] == 0 and memtest["patterns"] == ["address", "random"]
    assert 0.9 <= memtest["bytes_tested"] / memtest["free_bytes"] <= 1.0
    assert run["bandwidth"]["h2d_gbps"] > 0 and run["bandwidth"]["d2d_gbps"] > 0
    assert run["peers"][0]["peer"] == 1 and run["peers"][0]["access"] is True
    taken = log.read_text().split("\n")
    for kind in ("device", "host", "event", "module", "context"):
        assert taken.count(f"take {kind}") == taken.count(f"give {kind}") > 0, kind


def test_one_bad_sm_is_located_and_named(fake_cuda):
    run = worker(fake_cuda, fake_cuda_sdc_sm=3)
    compute = run["compute"]
    assert compute["mismatches"] > 0
    assert {e["sm"] for e in compute["examples"]} == {3}
    example = compute["examples"][0]
    assert int(example["expected"], 16) ^ int(example["got"], 16) == 8   # bit 3, as made
    located = run["located"]
    assert located["outcome"] == "sm" and located["sms"] == [3]
    assert located["checked_sms"] == 10 and located["count"] > 0


def test_a_corruption_on_every_sm_is_not_blamed_on_one(fake_cuda):
    located = worker(fake_cuda, fake_cuda_sdc_sm="all")["located"]
    assert located["outcome"] == "every_sm"
    assert located["sms"] == list(range(10))


def test_a_one_off_that_the_rerun_does_not_reproduce(fake_cuda):
    run = worker(fake_cuda, fake_cuda_sdc_sm=3, fake_cuda_sdc_once=1)
    assert run["compute"]["mismatches"] > 0
    assert run["located"]["outcome"] == "not_reproduced"


def test_the_drill_flips_one_bit_on_its_sm_and_is_found_there(fake_cuda):
    run = worker(fake_cuda, flip=6)
    assert run["located"]["outcome"] == "sm" and run["located"]["sms"] == [6]
    example = run["compute"]["examples"][0]
    assert int(example["expected"], 16) ^ int(example["got"], 16) == 1


def test_a_memory_test_mismatch_names_its_addresses(fake_cuda):
    memtest = worker(fake_cuda, fake_cuda_corrupt="memtest")["memtest"]
    assert memtest["mismatches"] > 0
    first = memtest["first"][0]
    assert int(first["expected"], 16) ^ int(first["got"], 16) == 32


def test_a_cuda_error_is_a_line_naming_the_call(fake_cuda):
    run = worker(fake_cuda, fake_cuda_launch_error=719)
    assert run["error"]["t"] == "cuda_error" and run["error"]["code"] == 719
    assert run["error"]["call"] == "cuLaunchKernel"


@pytest.mark.parametrize("iters", [1, 7, 1000])
def test_the_exact_reference_is_iters_times_the_integer_product(iters):
    import random
    import struct

    inputs = kernels.ExactInputs(random.Random(2))
    expected = inputs.expected(iters)
    values = struct.unpack(f"<{kernels.BLOCK_OUT_BYTES // 4}f", expected[0])
    products = inputs.products[0]
    assert [int(v) for v in values] == [p * iters * kernels.COPIES for p in products]
    # the exact kind's bound holds at the most steps a launch may take
    top = max(abs(p) for per_set in inputs.products for p in per_set)
    assert top * kernels.EXACT_STEPS < 2 ** 24


def test_mix64_is_splitmix64():
    # word i of the seeded pattern is splitmix64's i-th output from state `seed`: its
    # published first output from state 0 is 0xe220a8397b1dcdaf
    assert kernels.mix64(1) == 0xE220A8397B1DCDAF
    assert kernels.mix64(0) == 0
    assert len({kernels.mix64(i) for i in range(1000)}) == 1000
