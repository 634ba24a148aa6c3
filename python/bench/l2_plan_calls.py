#!/usr/bin/env python3
"""Host cost of the L2 plan's per-window calls from Python, and what they add to a host-bound
eager forward.

1. Per call: a learned plan replayed eagerly over WINDOWS windows a forward; each
   ``plan.collective()`` and ``plan.consume(weight)`` timed alone (perf_counter_ns around the
   call; the median over every call of several forwards). A Python method that does nothing is
   timed the same way, as the floor of any call. Three cases: the GPU idle (the loop is
   host-bound: the plan's host pace leaves the windows cold), the GPU behind (a long
   ``torch.cuda._sleep`` ahead of each forward: every window is warmed, its launch included),
   and the GPU idle with the pace off (``set_host_pace(False)``: every window launched).
2. A host-bound forward: per window a collective stand-in (``torch.cuda._sleep`` of a few
   cycles) and TINY small launches (``torch.add`` on a 1-element tensor), so that the host's
   launch rate sets the forward's time; timed without the plan, with it, with it and the pace
   off, and with an object whose four methods do nothing in its place (the floor of any
   per-window Python calls), interleaved, medians.

    python3 python/bench/l2_plan_calls.py [--json out.json]

Goal (issue 22): ``collective`` and ``consume`` at most 2 us each where the host is the
bottleneck; the host-bound forward not measurably slower with the plan (its difference within
the run-to-run spread).
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import torch

import fetchahead

WINDOWS, WEIGHT_MIB, TINY, FORWARDS = 64, 2, 6, 40
GOAL_US = 2.0


class Nothing:
    def call(self, *args) -> None:
        pass


class EmptyPlan:
    """The plan's four calls doing nothing: the floor of any per-window Python calls."""

    def begin_forward(self, signature) -> None:
        pass

    def collective(self, kind="all_reduce") -> None:
        pass

    def consume(self, tensor, nbytes=None) -> None:
        pass

    def end_forward(self) -> None:
        pass


GPU_AHEAD_CYCLES = 40_000_000  # about 20 ms of GPU time ahead of a forward


def per_call_us(plan: fetchahead.L2Plan, weights: list, gpu_behind: bool) -> dict:
    col, con, nop = [], [], []
    nothing = Nothing()
    clock = time.perf_counter_ns
    before = plan.counters()
    for _ in range(FORWARDS):
        if gpu_behind:
            torch.cuda._sleep(GPU_AHEAD_CYCLES)
        plan.begin_forward(WINDOWS)
        for w in weights:
            t0 = clock()
            plan.collective()
            t1 = clock()
            plan.consume(w)
            t2 = clock()
            nothing.call(w)
            t3 = clock()
            col.append(t1 - t0)
            con.append(t2 - t1)
            nop.append(t3 - t2)
        plan.end_forward()
        torch.cuda.synchronize()
    med = lambda v: statistics.median(v) / 1e3  # noqa: E731
    after = plan.counters()
    return {
        "collective_us": med(col),
        "consume_us": med(con),
        "empty_method_us": med(nop),
        "windows_warmed": after["windows_prefetched"] - before["windows_prefetched"],
        "windows_cold": after["windows_host_bound"] - before["windows_host_bound"],
    }


def host_bound_forward_ms(plan, weights, use_plan: bool, one) -> float:
    start = time.perf_counter()
    if use_plan:
        plan.begin_forward(WINDOWS)
    for w in weights:
        if use_plan:
            plan.collective()
        torch.cuda._sleep(100)
        if use_plan:
            plan.consume(w)
        for _ in range(TINY):
            one.add_(1)
    if use_plan:
        plan.end_forward()
    elapsed = time.perf_counter() - start
    torch.cuda.synchronize()
    return elapsed * 1e3


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", help="write the figures here too")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("SKIP: no CUDA device")
        return 0
    dev = torch.device("cuda", 0)
    torch.cuda.set_device(dev)
    weights = [
        torch.empty(WEIGHT_MIB << 20, dtype=torch.uint8, device=dev) for _ in range(WINDOWS)
    ]
    plan = fetchahead.L2Plan()
    for _ in range(5):  # learn, then fit the windows
        plan.begin_forward(WINDOWS)
        for w in weights:
            plan.collective()
            torch.cuda._sleep(1000)
            plan.consume(w)
        plan.end_forward()
    torch.cuda.synchronize()
    cases = {}
    for case, behind, pace in [
        ("gpu_idle", False, True),
        ("gpu_behind", True, True),
        ("gpu_idle_pace_off", False, False),
    ]:
        plan.set_host_pace(pace)
        cases[case] = per_call_us(plan, weights, behind)
    plan.set_host_pace(True)
    calls = cases["gpu_idle"]
    one = torch.zeros(1, device=dev)
    with_plan, without, pace_off, empty = [], [], [], []
    for _ in range(FORWARDS):
        without.append(host_bound_forward_ms(plan, weights, False, one))
        empty.append(host_bound_forward_ms(EmptyPlan(), weights, True, one))
        with_plan.append(host_bound_forward_ms(plan, weights, True, one))
        plan.set_host_pace(False)
        pace_off.append(host_bound_forward_ms(plan, weights, True, one))
        plan.set_host_pace(True)
    w, wo, off, floor = (statistics.median(v) for v in (with_plan, without, pace_off, empty))
    # Run-to-run spread: the interquartile range of the forwards without the plan (a robust
    # one: a host-bound Python loop has rare slow outliers that a standard deviation follows).
    q1, _, q3 = statistics.quantiles(without, n=4)
    spread = q3 - q1
    out = {
        "cases": cases,
        "forward_without_plan_ms": wo,
        "forward_with_plan_ms": w,
        "forward_with_plan_pace_off_ms": off,
        "forward_with_empty_calls_ms": floor,
        "forward_spread_ms": spread,
        "forwards_without_plan_ms": without,
        "forwards_with_plan_ms": with_plan,
        "forwards_with_plan_pace_off_ms": pace_off,
        "windows": WINDOWS,
        "tiny_launches_a_window": TINY,
        "device": torch.cuda.get_device_name(dev),
    }
    verdict = lambda x: "met" if x <= GOAL_US else "NOT MET"  # noqa: E731
    for case, c in cases.items():
        print(
            f"per call (median), {case}: collective {c['collective_us']:.2f} us, consume "
            f"{c['consume_us']:.2f} us, an empty Python method {c['empty_method_us']:.2f} us "
            f"({c['windows_warmed']} windows warmed, {c['windows_cold']} left cold)"
        )
    print(
        f"goal {GOAL_US} us each where the host is the bottleneck (gpu_idle): collective "
        f"{verdict(calls['collective_us'])}, consume {verdict(calls['consume_us'])}"
    )
    for name, t in [
        ("with it", w),
        ("with it, pace off", off),
        ("with four empty Python methods in its place", floor),
    ]:
        print(
            f"host-bound forward of {WINDOWS} windows ({TINY} tiny launches each): without the "
            f"plan {wo:.3f} ms, {name} {t:.3f} ms ({(t - wo) / WINDOWS * 1e3:+.2f} us a window, "
            f"{100 * (t - wo) / wo:+.1f}%; interquartile range without {spread:.3f} ms)"
        )
    within = abs(w - wo) <= spread
    print(
        "not measurably slower with the plan (median difference within the interquartile "
        f"range without it): {'met' if within else 'NOT MET'}"
    )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
