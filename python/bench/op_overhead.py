#!/usr/bin/env python3
"""Per-call overhead of fetchahead's torch op path against the Rust call of the same work.

For each entry point, the same launch three ways, eagerly (microseconds of host time per call,
the median of several timed loops of host submission alone):

- ``op``: the public function (``fetchahead.gather_dequant_out`` etc.), what an engine calls;
  it calls the registered op through the dispatcher (no shortcut);
- ``torch.ops``: the registered op called directly (``torch.ops.fetchahead.X.default``: a
  native kernel for the CUDA key, through libtorch's stable C ABI; with
  ``FETCHAHEAD_TORCH_NATIVE=0`` the Python kernel instead), the path a compiled graph that is
  not captured takes;
- ``rust``: the native launch alone (the Rust function through its thin pyo3 binding, with
  addresses computed once), the floor the op path is compared with.

The three are timed in turn within each repeat (the order rotating), so that a busy host
slows all three alike; a goal is judged on the median over repeats of each repeat's own
difference (op minus Rust), beside the medians of each path.

Then the cost inside a replayed CUDA graph: a graph of 100 op-path calls against a graph of 100
Rust-path calls, replayed; the difference per call is expected to be 0 (the host code does not
run in a replay).

    python3 python/bench/op_overhead.py [--calls 200] [--json out.json]

Beside them, a native peer: ``torch.index_select`` of the same ids allocating its output and
into ``out=``, timed in the same rounds as ``gather_dequant`` and ``gather_dequant_out``: what
returning a new tensor costs an aten op on this host, against what it costs fetchahead's.

Goals (issue 26, eager, same run), each printed MET or NOT MET: the public function at most
5 us above the Rust call, ``torch.ops.fetchahead.X`` at most 8 us above it, for every entry
point, the allocating form included; per call, so the prefetch + gather pair (two public calls,
two ops, two Rust calls) is held to twice each limit.
"""
from __future__ import annotations

import argparse
import importlib
import json
import statistics
import sys
import time

import torch

import fetchahead

ROWS, DIM, N = 4096, 256, 64


def paired_us(fns: list, calls: int, repeats: int = 9) -> list[list[float]]:
    """Host microseconds per call of each of `fns`, timed in turn within each of `repeats`
    rounds (the order rotating each round): one list of samples per function, sample `r` of
    each taken in the same round, so that differences can be paired."""
    for fn in fns:
        for _ in range(50):
            fn()
    samples: list[list[float]] = [[] for _ in fns]
    for r in range(repeats):
        for k in range(len(fns)):
            j = (k + r) % len(fns)
            torch.cuda.synchronize()
            start = time.perf_counter()
            for _ in range(calls):
                fns[j]()
            samples[j].append((time.perf_counter() - start) / calls * 1e6)
    torch.cuda.synchronize()
    return samples


def aten_peer(weights, scales, table, ids, out, rows, calls: int) -> dict:
    """What returning a new tensor costs a native aten op, in the same rounds as fetchahead's
    allocating form: ``torch.index_select`` of the same ids (a CUDA kernel of libtorch's own,
    dispatched as every aten op is) allocating its output and into ``out=``, beside
    ``gather_dequant`` and ``gather_dequant_out``. Their differences are each one's cost of
    allocating, wrapping and releasing the result; fetchahead's at most the peer's means the
    allocating form costs what a native op's does."""
    ours_new, ours_out, aten_new, aten_out = paired_us(
        [
            lambda: fetchahead.gather_dequant(weights, scales, ids),
            lambda: fetchahead.gather_dequant_out(weights, scales, ids, out),
            lambda: torch.index_select(table, 0, ids),
            lambda: torch.index_select(table, 0, ids, out=rows),
        ],
        calls,
    )
    med = statistics.median
    peer = {
        "gather_dequant_us": med(ours_new),
        "gather_dequant_out_us": med(ours_out),
        "index_select_us": med(aten_new),
        "index_select_out_us": med(aten_out),
        "ours_allocating_minus_out_us": med(a - b for a, b in zip(ours_new, ours_out)),
        "aten_allocating_minus_out_us": med(a - b for a, b in zip(aten_new, aten_out)),
        "ours_minus_aten_allocating_us": med(a - b for a, b in zip(ours_new, aten_new)),
    }
    print(
        "peer: torch.index_select of the same ids, allocating / into out=: "
        f"{peer['index_select_us']:.2f} / {peer['index_select_out_us']:.2f} us a call; "
        f"fetchahead.gather_dequant / _out, same rounds: {peer['gather_dequant_us']:.2f} / "
        f"{peer['gather_dequant_out_us']:.2f} us"
    )
    print(
        "peer: allocating minus out=, paired: fetchahead "
        f"{peer['ours_allocating_minus_out_us']:.2f} us, aten {peer['aten_allocating_minus_out_us']:.2f} us; "
        f"fetchahead's allocating form minus aten's: {peer['ours_minus_aten_allocating_us']:.2f} us"
    )
    return peer


def per_call_us(fn, calls: int, repeats: int = 7) -> float:
    """Host microseconds per call of `fn` alone: the median of `repeats` timed loops."""
    return statistics.median(paired_us([fn], calls, repeats)[0])


def graph_replay_us(fn, current: list, calls_in_graph: int = 100, replays: int = 200) -> float:
    """Device microseconds per call inside a replayed graph. `current[0]` is the raw stream the
    Rust-path closures launch on: the capture stream while capturing."""
    fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    capture = torch.cuda.Stream()
    eager_stream = current[0]
    current[0] = capture.cuda_stream
    with torch.cuda.graph(graph, stream=capture):
        for _ in range(calls_in_graph):
            fn()
    current[0] = eager_stream
    for _ in range(10):
        graph.replay()
    torch.cuda.synchronize()
    start = torch.cuda.Event(enable_timing=True)
    end = torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(replays):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1e3 / (replays * calls_in_graph)


# What the dispatcher alone costs, measured beside the cases: the same schema as
# `gather_dequant_out_unchecked` registered with a Python kernel that does nothing, called
# through `torch.ops` (the floor of any op whose kernel is Python), and a plain Python function
# of the same arguments (the floor of any Python entry point).
_FLOOR_LIB = None


def dispatch_floors(weights, scales, ids, out, calls: int, native_floor: bool) -> dict:
    global _FLOOR_LIB
    if _FLOOR_LIB is None:
        _FLOOR_LIB = torch.library.Library("fetchahead_floor", "DEF")
        _FLOOR_LIB.define(
            "noop_out(Tensor weights, Tensor scales, Tensor ids, Tensor(a!) out, str? variant) -> ()"
        )
        _FLOOR_LIB.impl("noop_out", lambda w, s, i, o, v: None, "CUDA")
    op = torch.ops.fetchahead_floor.noop_out.default

    def plain(w, s, i, o, v):
        return None

    found = {}
    if native_floor:
        found.update(native_dispatch_floor(weights, scales, ids, out, calls))
    kernel = importlib.import_module("fetchahead._torch")._gather_dequant_out_unchecked
    return found | {
        "the gather_dequant_out op's Python kernel called directly (its checks + the launch)": per_call_us(
            lambda: kernel(weights, scales, ids, out, None), calls
        ),
        "a Python function of the same arguments": per_call_us(
            lambda: plain(weights, scales, ids, out, None), calls
        ),
        "torch.ops of a Library op whose Python kernel does nothing (CUDA key)": per_call_us(
            lambda: op(weights, scales, ids, out, None), calls
        ),
    }


_NATIVE_FLOOR = r"""
#include <torch/library.h>
void noop_out(const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&,
              std::optional<c10::string_view>) {}
TORCH_LIBRARY(fetchahead_native_floor, m) {
  m.def("noop_out(Tensor weights, Tensor scales, Tensor ids, Tensor(a!) out, str? variant) -> ()");
}
TORCH_LIBRARY_IMPL(fetchahead_native_floor, CUDA, m) { m.impl("noop_out", &noop_out); }
"""


def native_dispatch_floor(weights, scales, ids, out, calls: int) -> dict:
    """The same no-op op with a C++ kernel (`TORCH_LIBRARY`, built here with the installed
    torch's headers): what dispatch costs when the kernel is native. Needs a C++ compiler."""
    what = "torch.ops of the same op with a C++ kernel that does nothing (CUDA key)"
    try:
        from torch.utils import cpp_extension

        cpp_extension.load_inline(
            "fetchahead_native_floor", _NATIVE_FLOOR, functions=None, is_python_module=False
        )
    except Exception as e:  # no compiler or headers: say so rather than fail the bench
        print(f"floor not measured: {what}: {type(e).__name__}: {str(e).splitlines()[0][:200]}")
        return {}
    op = torch.ops.fetchahead_native_floor.noop_out.default
    return {what: per_call_us(lambda: op(weights, scales, ids, out, None), calls)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=200, help="calls per timed loop")
    parser.add_argument("--json", help="also write the figures to this file")
    parser.add_argument(
        "--native-floor",
        action="store_true",
        help="also build a no-op C++ op with torch's headers (a minute) and time its dispatch",
    )
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("SKIP: no CUDA device", file=sys.stderr)
        return 0
    dev = torch.device("cuda", torch.cuda.current_device())
    weights = torch.randint(0, 126, (ROWS, DIM), dtype=torch.uint8, device=dev)
    scales = torch.randint(120, 135, (ROWS, DIM // 32), dtype=torch.uint8, device=dev)
    table = torch.randint(0, 256, (ROWS, DIM), dtype=torch.uint8, device=dev)
    ids = torch.randint(0, ROWS, (N,), device=dev)
    out = torch.empty((N, DIM), dtype=torch.bfloat16, device=dev)
    rows = torch.empty((N, DIM), dtype=torch.uint8, device=dev)

    t = importlib.import_module("fetchahead._torch")
    native = t.native_device(dev)
    gd, g = t.variant_of(dev, "gather_dequant", None), t.variant_of(dev, "gather", None)
    # The raw stream the Rust-path closures launch on (the capture stream while capturing).
    current = [torch.cuda.current_stream().cuda_stream]
    w_p, s_p, i_p, o_p = weights.data_ptr(), scales.data_ptr(), ids.data_ptr(), out.data_ptr()
    t_p, r_p = table.data_ptr(), rows.data_ptr()

    memory = fetchahead.MemoryTable(ROWS, DIM, seed=1)
    # Joined at each gather: the pair needs no finish call between timed pairs.
    pre = fetchahead.Prefetcher(memory, capacity=N, join="at_gather")
    native_pre = pre._prefetcher

    def pair_op():
        pre.prefetch(ids)
        pre.gather_dequant(ids, out=out)

    def pair_ops():
        torch.ops.fetchahead.prefetch.default(pre.handle, ids, pre._ticket)
        torch.ops.fetchahead.prefetched_gather_dequant_out.default(pre.handle, ids, pre._ticket, out)

    def pair_rust():
        native_pre.prefetch(i_p, N, current[0])
        native_pre.gather_dequant(o_p, current[0])

    cases = {
        "gather_dequant_out": (
            lambda: fetchahead.gather_dequant_out(weights, scales, ids, out),
            lambda: torch.ops.fetchahead.gather_dequant_out_unchecked.default(weights, scales, ids, out, None),
            lambda: native.launch(gd, w_p, s_p, ROWS, DIM, i_p, N, o_p, 0, current[0]),
        ),
        "gather_dequant (allocates)": (
            lambda: fetchahead.gather_dequant(weights, scales, ids),
            lambda: torch.ops.fetchahead.gather_dequant_unchecked.default(weights, scales, ids, None),
            lambda: native.launch(gd, w_p, s_p, ROWS, DIM, i_p, N, o_p, 0, current[0]),
        ),
        "gather_out": (
            lambda: fetchahead.gather_out(table, ids, rows),
            lambda: torch.ops.fetchahead.gather_out_unchecked.default(table, ids, rows, None),
            lambda: native.launch(g, t_p, 0, ROWS, DIM, i_p, N, r_p, 0, current[0]),
        ),
        "prefetch + gather_dequant": (pair_op, pair_ops, pair_rust),
    }
    # Public calls (and ops, and Rust calls) in each entry point's timed unit.
    calls_in = {"prefetch + gather_dequant": 2}
    results = {}
    print(f"{'entry point':<28} {'op us':>8} {'torch.ops us':>13} {'rust us':>8} {'op - rust':>10} {'in graph (op - rust)':>21}")
    for name, (op, ops, rust) in cases.items():
        op_s, ops_s, rust_s = paired_us([op, ops, rust], args.calls)
        med = statistics.median
        op_us, ops_us, rust_us = med(op_s), med(ops_s), med(rust_s)
        graph_delta = graph_replay_us(op, current) - graph_replay_us(rust, current)
        results[name] = {
            "op_us": op_us,
            "torch_ops_us": ops_us,
            "rust_us": rust_us,
            "op_minus_rust_us": med(a - b for a, b in zip(op_s, rust_s)),
            "ops_minus_rust_us": med(a - b for a, b in zip(ops_s, rust_s)),
            "graph_op_minus_rust_us": graph_delta,
        }
        delta = results[name]["op_minus_rust_us"]
        print(f"{name:<28} {op_us:8.2f} {ops_us:13.2f} {rust_us:8.2f} {delta:10.2f} {graph_delta:21.3f}")
    alloc_us = per_call_us(lambda: torch.empty((N, DIM), dtype=torch.bfloat16, device=dev), args.calls)
    print(f"(torch.empty of the output alone: {alloc_us:.2f} us a call, inside the allocating form's op - rust)")
    results["aten_peer"] = aten_peer(weights, scales, table, ids, out, rows, args.calls)
    floors = dispatch_floors(weights, scales, ids, out, args.calls, args.native_floor)
    for what, us in floors.items():
        print(f"floor: {what}: {us:.2f} us a call")
    results["floors_us"] = floors
    goals = [("public function", "op_minus_rust_us", 5.0), ("torch.ops.fetchahead.X", "ops_minus_rust_us", 8.0)]
    cases_only = {name: r for name, r in results.items() if name not in ("floors_us", "aten_peer")}
    failed = 0
    for what, key, limit in goals:
        for name, r in cases_only.items():
            calls = calls_in.get(name, 1)
            delta = r[key] / calls
            if delta != delta:  # NaN: no direct op for this entry point
                continue
            met = delta <= limit
            failed += not met
            per = f" a call ({r[key]:.2f} us for its {calls} calls)" if calls > 1 else ""
            print(f"goal: {what} <= {limit:g} us above the Rust call, {name}: {delta:.2f} us{per}: {'MET' if met else 'NOT MET'}")
    print(f"goals: {'all MET' if failed == 0 else f'{failed} NOT MET'}")
    native = sorted(importlib.import_module("fetchahead._torch").NATIVE_OPS)
    print(f"native CUDA kernels: {', '.join(native) if native else 'none (Python kernels)'}")
    print(f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}, fetchahead {fetchahead.__version__}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
