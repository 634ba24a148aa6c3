#!/usr/bin/env python3
"""The L2 plan inside a captured CUDA graph, as engines run decode.

A forward of LAYERS windows: a stand-in collective (``torch.cuda._sleep`` of about 30 us), then
a bf16 GEMM at M = 8 (``torch.matmul``) reading its own weight of WEIGHT_MIB. The plan learns
the weights in eager warm-up forwards, then the forward is captured with ``torch.cuda.graph``
with the plan inside it (its prefetch of each window becomes a graph branch beside the sleep).
Replays are timed with CUDA events against the same forward captured without the plan, and
against the ideal measured inside graphs too: per window, (sleep + read) - (sleep + read + read
again) is what a perfectly warmed read saves.

    python3 examples/l2_plan_graph.py

Exits 0 when every check passes: outputs bit-identical with and without the plan, eagerly and
replayed, and the plan prefetched every window. The timings are printed, not checked.
"""
import sys

import torch

import fetchahead

LAYERS, K, N, TOKENS, WEIGHT_MIB = 16, 4096, 1536, 8, 12
SLEEP_CYCLES = 60_000  # about 30 us at the H200's clock
REPLAYS = 20


def timed_replays(graph) -> float:
    """Median milliseconds of a replay of `graph`."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(REPLAYS):
        torch.cuda._sleep(1_000_000)  # the host gets ahead, so the replay runs back to back
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    times.sort()
    return times[len(times) // 2]


def capture(fn):
    graph = torch.cuda.CUDAGraph()
    torch.cuda.synchronize()
    with torch.cuda.graph(graph):
        fn()
    return graph


def main():
    if not torch.cuda.is_available():
        print("SKIP: no CUDA device")
        return 0
    dev = torch.device("cuda", 0)
    torch.cuda.set_device(dev)
    gen = torch.Generator(device=dev).manual_seed(0)
    # Each weight its own WEIGHT_MIB (rows x K bf16), all of them more than L2.
    rows = (WEIGHT_MIB << 20) // (K * 2)
    weights = [torch.randn(rows, K, generator=gen, device=dev, dtype=torch.bfloat16) for _ in range(LAYERS)]
    x = torch.randn(TOKENS, K, generator=gen, device=dev, dtype=torch.bfloat16)
    outs = [torch.empty(TOKENS, rows, device=dev, dtype=torch.bfloat16) for _ in range(LAYERS)]
    # --- fetchahead: one plan per device; budget and replay from FETCHAHEAD_L2_* or arguments
    plan = fetchahead.L2Plan()

    def forward(use_plan, reads=1):
        for w, out in zip(weights, outs):
            if use_plan:
                plan.collective()  # right before the engine's collective
            torch.cuda._sleep(SLEEP_CYCLES)
            if use_plan:
                plan.consume(w)  # each weight a kernel reads after it
            for _ in range(reads):
                torch.matmul(x, w.t(), out=out)

    def planned():
        with plan.forward(signature=TOKENS):
            forward(True)

    for _ in range(4):  # learn, then fit each window, eagerly
        planned()
    # ---
    torch.cuda.synchronize()
    forward(False)
    want = [o.clone() for o in outs]
    failures = 0
    planned()
    same = all(torch.equal(o, w) for o, w in zip(outs, want))
    failures += not same
    print(f"eager forward with the plan: {'bit-identical' if same else 'DIFFERS'}")

    sleeps = capture(lambda: [torch.cuda._sleep(SLEEP_CYCLES) for _ in range(LAYERS)])
    cold = capture(lambda: forward(False))
    twice = capture(lambda: forward(False, reads=2))
    with_plan = capture(planned)
    for o in outs:
        o.zero_()
    with_plan.replay()
    torch.cuda.synchronize()
    same = all(torch.equal(o, w) for o, w in zip(outs, want))
    failures += not same
    print(f"graph replay with the plan: {'bit-identical' if same else 'DIFFERS'}")

    t_sleeps, t_cold, t_twice, t_plan = (timed_replays(g) for g in (sleeps, cold, twice, with_plan))
    read_cold = t_cold - t_sleeps
    read_warm = t_twice - t_cold  # the second read of each weight, right after the first
    ideal = read_cold - read_warm
    saved = t_cold - t_plan
    print(
        f"replayed, {LAYERS} windows of {WEIGHT_MIB} MiB: forward {t_cold:.3f} ms without the plan, "
        f"{t_plan:.3f} ms with it (saves {saved * 1e3:.1f} us, {100 * saved / t_cold:.1f}%); "
        f"reads cold {read_cold * 1e3:.1f} us, warm {read_warm * 1e3:.1f} us: the plan realizes "
        f"{saved / ideal if ideal > 0 else float('nan'):.2f} of the ideal {ideal * 1e3:.1f} us"
    )
    counters = plan.counters()
    print(f"plan: {counters}")
    if counters["windows_prefetched"] < LAYERS:
        failures += 1
        print("FAIL: not every window was prefetched")
    print("all checks passed" if failures == 0 else f"{failures} checks FAILED")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
