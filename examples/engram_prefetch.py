#!/usr/bin/env python3
"""Engram rows prefetched on a side stream right after the hasher, gathered at the layer.

A toy forward: the hasher turns token ids into Engram row ids, `Prefetcher.prefetch` starts
the lookup and the copy of those rows on a side stream, the layers before the Engram layer run
(a few matmuls), and `Prefetcher.gather_dequant` joins the side stream and writes the rows as
bf16. It runs eagerly, then captured in a CUDA graph and replayed with new tokens, each time
against a torch reference built from torch.float8_e4m3fn and torch.float8_e8m0fnu.

    python3 examples/engram_prefetch.py

Prints what it checked; exits 0 when every check passes.
"""
import sys

import torch

import fetchahead

ROWS, DIM, TOKENS, HEADS = 1 << 16, 256, 512, 4


def hasher(tokens):
    """Bigram hash of each token and its predecessor, one row id per head."""
    prev = torch.roll(tokens, 1)
    heads = torch.arange(1, HEADS + 1, device=tokens.device)
    mixed = (tokens[:, None] * 1000003 + prev[:, None] * 8191 + heads * 127) % ROWS
    return mixed.reshape(-1).contiguous()


def reference(weights, scales, ids):
    w = weights[ids.cpu()].view(torch.float8_e4m3fn).float()
    s = scales[ids.cpu()].view(torch.float8_e8m0fnu).float().repeat_interleave(32, dim=1)
    return (w * s).to(torch.bfloat16)


def same(rows, want):
    return torch.equal(rows.cpu().view(torch.int16), want.view(torch.int16))


def main():
    if not torch.cuda.is_available():
        print("SKIP: no CUDA device")
        return 0
    dev = torch.device("cuda")
    # --- fetchahead: a table (a RowStore in production) and one prefetcher per Engram layer
    table = fetchahead.MemoryTable(ROWS, DIM, seed=1)
    weights, scales = (torch.from_numpy(a.copy()) for a in table.arrays())
    # The defaults are the measured best: the device's shared flag lane, tagged gathers.
    engram = fetchahead.Prefetcher(table, capacity=TOKENS * HEADS)
    # ---
    w1 = torch.randn(DIM, DIM, device=dev, dtype=torch.bfloat16) / 16
    tokens = torch.randint(0, 50000, (TOKENS,), device=dev)
    hidden = torch.randn(TOKENS * HEADS, DIM, device=dev, dtype=torch.bfloat16)
    state = {}

    def forward():
        ids = hasher(tokens)
        engram.prefetch(ids)  # right after the hasher: the lookup overlaps the layers below
        h = hidden
        for _ in range(4):
            h = torch.relu(h @ w1)
        rows = engram.gather_dequant(ids)  # at the Engram layer
        state["ids"], state["rows"] = ids, rows
        out = h + rows
        engram.finish()  # after the step's last gather: its one join of the side stream
        return out

    failures = 0
    for step in range(3):
        tokens.random_(0, 50000)
        forward()
        ok = same(state["rows"], reference(weights, scales, state["ids"]))
        failures += not ok
        print(f"eager step {step}: {state['ids'].numel()} rows prefetched, gathered: {'ok' if ok else 'FAIL'}")
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        forward()
    for step in range(3):
        tokens.random_(0, 50000)
        graph.replay()
        ok = same(state["rows"], reference(weights, scales, hasher(tokens)))
        failures += not ok
        print(f"graph replay {step}: new tokens, that replay's rows: {'ok' if ok else 'FAIL'}")
    stats = engram.stats()
    print(f"prefetcher: {stats['lookups']} lookups, {stats['rows_looked_up']} rows, {stats['lookup_errors']} errors")
    failures += stats["lookup_errors"] != 0
    print("all checks passed" if failures == 0 else f"{failures} checks FAILED")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
