#!/usr/bin/env python3
"""A sustained bf16 matmul on every GPU (or --gpus), for --seconds: the "busy inference
host" that gpuguard must not raise an alert for. PyTorch, one process per GPU. It only
computes: no GPU setting is changed."""

from __future__ import annotations

import argparse
import multiprocessing
import os
import time


def burn(gpu: int, seconds: float, size: int) -> None:
    import torch

    torch.cuda.set_device(gpu)
    a = torch.randn(size, size, dtype=torch.bfloat16, device=f"cuda:{gpu}")
    b = torch.randn(size, size, dtype=torch.bfloat16, device=f"cuda:{gpu}")
    end = time.monotonic() + seconds
    n = 0
    while time.monotonic() < end:
        for _ in range(20):
            torch.matmul(a, b)
        torch.cuda.synchronize()
        n += 20
    tflops = 2 * size**3 * n / seconds / 1e12
    print(f"gpu {gpu}: {n} matmuls of {size}, {tflops:.0f} TFLOP/s", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=120)
    parser.add_argument("--size", type=int, default=8192)
    parser.add_argument("--gpus", type=str, default="")
    args = parser.parse_args()
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    import torch

    gpus = [int(g) for g in args.gpus.split(",")] if args.gpus else \
        list(range(torch.cuda.device_count()))
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=burn, args=(g, args.seconds, args.size)) for g in gpus]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join()


if __name__ == "__main__":
    main()
