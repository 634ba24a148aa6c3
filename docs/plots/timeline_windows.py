#!/usr/bin/env python3
"""Per-window summary of a decode-step trace (`fetchahead-lab trace --out T.json`): for each step
(a process of the trace) and each collective window, where the window's L2 prefetch ran against
its collective, and how long the window's readers took; then, per execution mode, the readers'
time with the plan (`floor_plan`) and with them warmed by hand (`floor_hand`) against without
(`floor`), and where a window's time goes in each: the spin, the collective's start after it, the
collective, the readers' start after it, the readers.

    python3 docs/plots/timeline_windows.py T.json [--windows]

Times are microseconds of the device's %globaltimer. A window's collective, prefetch and readers
are the blocks labelled with its window number (`args.window`); readers are the GEMV blocks.
"""
import argparse
import json
import statistics
from collections import defaultdict


def kind_of(kernel):
    """The part of a window a kernel's block is, or None."""
    return ("reader" if kernel.startswith("gemv") else "prefetch" if kernel.startswith("l2_prefetch")
            else "collective" if kernel.startswith("collective")
            else "spin" if kernel.startswith("spin") else None)


def process_names(events):
    return {e["pid"]: e["args"]["name"] for e in events if e.get("name") == "process_name"}


def spans(events):
    """{(process name, window): {kind: (first start, last end)}} of the trace's blocks."""
    names = process_names(events)
    out = defaultdict(dict)
    for e in events:
        # Blocks outside a window (unlabelled: the hand-warming shadows, the Engram head) are
        # not a window's.
        if e.get("ph") != "X" or e.get("args", {}).get("window") is None:
            continue
        kind = kind_of(e["args"]["kernel"])
        if kind is None:
            continue
        key = (names.get(e["pid"], str(e["pid"])), e["args"]["window"])
        start, end = e["ts"], e["ts"] + e["dur"]
        lo, hi = out[key].get(kind, (start, end))
        out[key][kind] = (min(lo, start), max(hi, end))
    return out


# Where a window's time goes: from the spin's start to the last reader's end, split into the
# spin, the collective's start lag, the collective, the readers' start lag and the readers.
PARTS = ("spin", "to collective", "collective", "to reader", "readers", "window")


def split(v):
    """A window's spans (`spans`' values) as PARTS, microseconds."""
    return (v["spin"][1] - v["spin"][0], v["collective"][0] - v["spin"][1],
            v["collective"][1] - v["collective"][0], v["reader"][0] - v["collective"][1],
            v["reader"][1] - v["reader"][0], v["reader"][1] - v["spin"][0])


def prefetch_blocks(events):
    """{(process name, window): blocks of the window's prefetch}."""
    names = process_names(events)
    out = defaultdict(int)
    for e in events:
        if (e.get("ph") == "X" and e.get("args", {}).get("window") is not None
                and kind_of(e["args"]["kernel"]) == "prefetch"):
            out[(names.get(e["pid"], str(e["pid"])), e["args"]["window"])] += 1
    return out


def by_grid(by_key, blocks, floor, plan):
    """{prefetch blocks: [(collective start lag, collective length) with the plan less without]}
    over the windows of steps `floor` and `plan` that have a spin and a collective in both."""
    out = defaultdict(list)
    for (s, w), v in by_key.items():
        f = by_key.get((floor, w))
        if s != plan or not f or not all(k in x for x in (v, f) for k in ("spin", "collective")):
            continue
        lag = (v["collective"][0] - v["spin"][1]) - (f["collective"][0] - f["spin"][1])
        length = (v["collective"][1] - v["collective"][0]) - (f["collective"][1] - f["collective"][0])
        out[blocks.get((s, w), 0)].append((lag, length))
    return out


def mean_split(by_key, step):
    """The mean of `split` over a step's windows that have a spin, a collective and readers."""
    rows = [split(v) for (s, w), v in by_key.items()
            if s == step and all(k in v for k in ("spin", "collective", "reader"))]
    return [statistics.mean(x) for x in zip(*rows)] if rows else None


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("trace")
    ap.add_argument("--windows", action="store_true", help="print every window")
    args = ap.parse_args()
    data = json.load(open(args.trace))
    events = data["traceEvents"] if isinstance(data, dict) else data
    by_key = spans(events)
    steps = sorted({k[0] for k in by_key})
    readers = {}
    for step in steps:
        rows = [(w, by_key[(s, w)]) for (s, w) in sorted(by_key) if s == step]
        rd = [v["reader"][1] - v["reader"][0] for _, v in rows if "reader" in v]
        readers[step] = {w: v["reader"][1] - v["reader"][0] for w, v in rows if "reader" in v}
        line = f"{step}: {len(rows)} windows, readers {sum(rd):.1f} us in all"
        pre = [v for _, v in rows if "prefetch" in v and "collective" in v]
        if pre:
            lead = [v["prefetch"][0] - v["collective"][0] for v in pre]
            over = [v["prefetch"][1] - v["collective"][1] for v in pre]
            into = [v["prefetch"][1] - v["reader"][0] for v in pre if "reader" in v]
            line += (f"; prefetch starts {statistics.median(lead):+.2f} us after its collective"
                     f" (median), ends {statistics.median(over):+.2f} us after it; "
                     f"{sum(1 for x in into if x > 0)} of {len(into)} prefetches still ran when "
                     f"their reader started (by {max(into + [0]):.2f} us at most)")
        gap = [v["reader"][0] - v["collective"][1] for _, v in rows if "reader" in v and "collective" in v]
        if gap:
            line += (f"; readers start {statistics.median(gap):.2f} us after their collective "
                     f"(mean {statistics.mean(gap):.2f})")
        lag = [v["collective"][0] - v["spin"][1] for _, v in rows if "spin" in v and "collective" in v]
        if lag:
            line += (f"; collectives start {statistics.median(lag):.2f} us after their spin "
                     f"(mean {statistics.mean(lag):.2f})")
        print(line)
        if args.windows:
            for w, v in rows:
                parts = [f"{k} {a:.1f}-{b:.1f}" for k, (a, b) in sorted(v.items())]
                print(f"  window {w}: " + ", ".join(parts))
    for mode, with_ in [(m, w) for m in ("eager", "replayed") for w in ("floor_plan", "floor_hand")]:
        floor = [s for s in steps if s.startswith(f"{mode} floor step")]
        plan = [s for s in steps if s.startswith(f"{mode} {with_} step")]
        if not floor or not plan:
            continue
        mode = f"{mode} {with_}"
        common = set(readers[floor[0]]) & set(readers[plan[0]])
        saved = [readers[floor[0]][w] - readers[plan[0]][w] for w in sorted(common)]
        print(f"{mode}: the readers {sum(saved):.1f} us faster over {len(saved)} windows "
              f"({statistics.mean(saved) if saved else 0:.2f} us a window)")
        a = [mean_split(by_key, s) for s in floor]
        b = [mean_split(by_key, s) for s in plan]
        if all(a) and all(b):
            a = [statistics.mean(x) for x in zip(*a)]
            b = [statistics.mean(x) for x in zip(*b)]
            print(f"{mode}, a window's mean us, floor -> {with_}: " + "; ".join(
                f"{n} {x:.2f} -> {y:.2f} ({y - x:+.2f})" for n, x, y in zip(PARTS, a, b)))
        if with_ == "floor_plan":
            grids = by_grid(by_key, prefetch_blocks(events), floor[0], plan[0])
            for n, g in sorted(grids.items()):
                print(f"{mode}, windows whose prefetch ran {n} blocks ({len(g)}): the collective "
                      f"starts {statistics.mean(x[0] for x in g):+.3f} us later and runs "
                      f"{statistics.mean(x[1] for x in g):+.3f} us longer")


if __name__ == "__main__":
    main()
