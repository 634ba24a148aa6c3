"""What a row's frequency alone can give a cache on a lookup trace, beside the row cache's replay.

For each of issue 25's goal budgets (1% and 5% of the trace's distinct rows, 1% and 5% of the
table's rows), with the first half of the steps as warm-up and the second half counted, as
`fetchahead bench-io DIR --trace T.u64 --steps T.steps.u32 --replay-only` counts (a step's
distinct rows, each weighted by how often the step asks for it):

  seen before    every row asked in an earlier step hits: an unbounded cache, the ceiling of any
                 cache that reads on demand
  past top-k     the warm-up half's k most asked rows (counted once a step) pinned, nothing
                 admitted after: what a row's past frequency alone gives, with no adaptation
  future top-k   the counted half's own k most asked rows pinned from its start: bench-io's
                 "top-k bound", which knows the future and pays no first reads

Usage (numpy needed):
  python3 benches/traces/frequency_bounds.py TRACE.u64 TRACE.steps.u32 [--rows 10344164]
"""

import argparse

import numpy as np


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("trace", help="little-endian u64 row ids, one per lookup, in step order")
    ap.add_argument("steps", help="per step, a little-endian u32 pair (decode, prefill tokens)")
    ap.add_argument("--rows", type=int, default=10_344_164, help="the table's rows (R)")
    ap.add_argument("--ids-per-token", type=int, default=16)
    args = ap.parse_args()

    ids = np.fromfile(args.trace, dtype="<u8")
    steps = np.fromfile(args.steps, dtype="<u4").reshape(-1, 2).astype(np.int64)
    ends = np.cumsum(args.ids_per_token * steps.sum(axis=1))
    if ends[-1] != len(ids):
        raise SystemExit(f"the steps cover {ends[-1]} ids, the trace holds {len(ids)}")
    starts = np.concatenate([[0], ends[:-1]])
    half = len(steps) // 2
    cut = int(starts[half])

    # Each step's distinct rows, once.
    step_rows = [np.unique(ids[s:e]) for s, e in zip(starts, ends)]
    # A row counted once per warm-up step that asks for it.
    past_rows, past_steps = np.unique(np.concatenate(step_rows[:half]), return_counts=True)
    future_rows, future_asks = np.unique(ids[cut:], return_counts=True)
    total = future_asks.sum()

    # Seen before: an ask hits when its row was asked in an earlier step.
    first_step = {}
    for s, rows in enumerate(step_rows):
        for row in rows.tolist():
            first_step.setdefault(row, s)
    counted = ids[cut:]
    step_of = np.repeat(np.arange(half, len(steps)), (ends - starts)[half:])
    seen = np.fromiter((first_step[r] for r in counted.tolist()), dtype=np.int64, count=len(counted))
    seen_before = float((seen < step_of).sum() / total)

    distinct = len(first_step)
    print(f"{args.trace}: {len(ids)} ids, {len(steps)} steps (counted from {half}), {distinct} distinct rows")
    print(f"seen before (unbounded cache): {seen_before:.4f}")
    budgets = [
        ("1% of distinct rows", distinct // 100),
        ("5% of distinct rows", distinct * 5 // 100),
        ("1% of R", args.rows // 100),
        ("5% of R", args.rows * 5 // 100),
    ]
    for label, k in budgets:
        past = past_rows[np.argsort(-past_steps, kind="stable")[:k]]
        future = future_rows[np.argsort(-future_asks, kind="stable")[:k]]
        past_hit = future_asks[np.isin(future_rows, past)].sum() / total
        future_hit = future_asks[np.isin(future_rows, future)].sum() / total
        print(f"{label:20s} {k:8d} rows: past top-k {past_hit:.4f}, future top-k {future_hit:.4f}")


if __name__ == "__main__":
    main()
