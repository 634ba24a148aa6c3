#!/usr/bin/env python3
"""The L2 plan around the all-reduces of a small forward (one GPU, a one-rank NCCL group).

Each layer all-reduces its activations, then reads two weights; the plan learns those weights
per collective in the first eager forwards and prefetches them into L2 while each all-reduce
runs in later ones. Checks that the output is bit-identical with and without the plan, eagerly
and replayed from a CUDA graph, and prints the plan's counters.

    python3 examples/l2_plan_allreduce.py

Exits 0 when every check passes.
"""
import os
import sys
import tempfile

import torch
import torch.distributed as dist

import fetchahead

LAYERS, K, N, TOKENS = 8, 4096, 4096, 8


def main():
    if not torch.cuda.is_available():
        print("SKIP: no CUDA device")
        return 0
    dev = torch.device("cuda", 0)
    torch.cuda.set_device(dev)
    store = dist.FileStore(os.path.join(tempfile.mkdtemp(), "store"), 1)
    dist.init_process_group("nccl", store=store, rank=0, world_size=1)
    gen = torch.Generator(device=dev).manual_seed(0)
    down = [torch.randn(N, K, generator=gen, device=dev, dtype=torch.bfloat16) / 64 for _ in range(LAYERS)]
    up = [torch.randn(K, N, generator=gen, device=dev, dtype=torch.bfloat16) / 64 for _ in range(LAYERS)]
    # --- fetchahead: one plan per device
    plan = fetchahead.L2Plan()

    def forward(x, use_plan):
        for d, u in zip(down, up):
            if use_plan:
                plan.collective()  # right before the engine's collective
            dist.all_reduce(x)
            if use_plan:
                plan.consume(d)  # the weights the kernels after it read
                plan.consume(u)
            x = (x @ d.t()) @ u.t()
        return x

    x0 = torch.randn(TOKENS, K, device=dev, dtype=torch.bfloat16)
    dist.all_reduce(x0.clone())  # NCCL's first call sets up its communicator, outside capture
    want = forward(x0.clone(), use_plan=False)
    failures = 0
    for step in range(4):
        with plan.forward(signature=TOKENS) as f:
            got = forward(x0.clone(), use_plan=True)
        same = torch.equal(got, want)
        failures += not same
        print(f"eager forward {step} ({f.summary['learned']}): {'bit-identical' if same else 'DIFFERS'}")
    x = x0.clone()
    out = torch.empty_like(want)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        with plan.forward(signature=TOKENS):
            out.copy_(forward(x, use_plan=True))
    for step in range(3):
        x.copy_(x0)
        graph.replay()
        same = torch.equal(out, want)
        failures += not same
        print(f"graph replay {step}: {'bit-identical' if same else 'DIFFERS'}")
    counters = plan.counters()
    # ---
    print(f"plan: {counters}")
    if counters["windows_prefetched"] == 0:
        failures += 1
        print("FAIL: nothing was prefetched")
    dist.destroy_process_group()
    print("all checks passed" if failures == 0 else f"{failures} checks FAILED")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
