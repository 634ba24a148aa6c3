"""Two more online caches replayed on a lookup trace: LIRS and S3-FIFO, beside LRU.

Neither is in the row cache's report (`fetchahead bench-io DIR --trace ... --replay-only`, whose
peers are LRU, ARC, W-TinyLFU and exact LFU); this replays them the way that report counts, to
see whether either policy family is a better base for the store than its own: the first half of
the steps as warm-up, the second half counted, a step's distinct rows each weighted by how often
the step asks for it, a row hitting when it is cached as the step starts. LRU is printed to
check the counting against the report's LRU.

  LIRS     Jiang and Zhang, SIGMETRICS 2002: rows ranked by their inter-reference recency, a
           share of the cache (`--lirs-hir`) kept for rows with none yet
  S3-FIFO  Yang et al., SOSP 2023: a small FIFO (`--s3-small` of the cache) filtering rows asked
           once, a main FIFO with reinsertion, a ghost FIFO the size of the main one

Pure Python, no packages; about 5 s a budget and policy for the reference trace.
Usage:
  python3 benches/traces/more_policies.py TRACE.u64 TRACE.steps.u32 --budgets 17344,103456
"""

import argparse
import array
import collections
from collections import OrderedDict, deque


def load_steps(trace, steps_file, ids_per_token):
    """Each step's distinct rows with how often the step asks for each."""
    ids = array.array("Q")
    with open(trace, "rb") as f:
        ids.frombytes(f.read())
    pairs = array.array("I")
    with open(steps_file, "rb") as f:
        pairs.frombytes(f.read())
    steps, at = [], 0
    for k in range(0, len(pairs), 2):
        n = ids_per_token * (pairs[k] + pairs[k + 1])
        steps.append(list(collections.Counter(ids[at : at + n]).items()))
        at += n
    if at != len(ids):
        raise SystemExit(f"the steps cover {at} ids, the trace holds {len(ids)}")
    return steps


class Lru:
    def __init__(self, rows):
        self.rows, self.order = rows, OrderedDict()

    def holds(self, row):
        return row in self.order

    def ask(self, row, hit):
        if hit:
            self.order.move_to_end(row)
            return
        self.order[row] = True
        if len(self.order) > self.rows:
            self.order.popitem(last=False)


class S3Fifo:
    def __init__(self, rows, small_share):
        self.small_rows = max(1, int(rows * small_share))
        self.main_rows = rows - self.small_rows
        self.small, self.main, self.ghost = deque(), deque(), OrderedDict()
        self.freq = {}

    def holds(self, row):
        return row in self.freq

    def ask(self, row, hit):
        if hit:
            self.freq[row] = min(3, self.freq[row] + 1)
        elif row in self.ghost:
            del self.ghost[row]
            self._to_main(row)
        else:
            while len(self.small) >= self.small_rows:
                self._evict_small()
            self.small.append(row)
            self.freq[row] = 0

    def _to_main(self, row):
        while len(self.main) >= self.main_rows:
            self._evict_main()
        self.main.append(row)
        self.freq[row] = 0

    def _evict_small(self):
        row = self.small.popleft()
        if self.freq[row] > 0:
            self._to_main(row)
            return
        del self.freq[row]
        self.ghost[row] = True
        if len(self.ghost) > self.main_rows:
            self.ghost.popitem(last=False)

    def _evict_main(self):
        while True:
            row = self.main.popleft()
            if self.freq[row] == 0:
                del self.freq[row]
                return
            self.freq[row] -= 1
            self.main.append(row)


LIR, HIR, GONE = 0, 1, 2  # a low-recency row, a cached high-recency row, a remembered one


class Lirs:
    def __init__(self, rows, hir_share):
        self.hir_rows = max(1, int(rows * hir_share))
        self.lir_rows = rows - self.hir_rows
        self.stack, self.queue, self.state, self.lirs = OrderedDict(), OrderedDict(), {}, 0

    def holds(self, row):
        return self.state.get(row, GONE) != GONE

    def _prune(self):
        """Drops HIR rows off the stack's bottom until a LIR row is there."""
        while self.stack:
            row = next(iter(self.stack))
            if self.state.get(row) == LIR:
                return
            self.stack.popitem(last=False)
            if self.state.get(row) == GONE:
                del self.state[row]

    def _demote_bottom(self):
        row, _ = self.stack.popitem(last=False)
        self.state[row] = HIR
        self.queue[row] = True
        self._prune()

    def ask(self, row, hit):
        state = self.state.get(row)
        if state == LIR:
            self.stack.move_to_end(row)
            self._prune()
            return
        if state == HIR:
            if row in self.stack:
                self.stack.move_to_end(row)
                self.state[row] = LIR
                del self.queue[row]
                self._demote_bottom()
            else:
                self.stack[row] = True
                self.queue.move_to_end(row)
            return
        if self.lirs < self.lir_rows:
            self.stack[row] = True
            self.state[row] = LIR
            self.lirs += 1
            return
        if len(self.queue) >= self.hir_rows:
            out, _ = self.queue.popitem(last=False)
            if out in self.stack:
                self.state[out] = GONE
            else:
                del self.state[out]
        if state == GONE and row in self.stack:
            self.stack.move_to_end(row)
            self.state[row] = LIR
            self._demote_bottom()
        else:
            self.stack[row] = True
            self.state[row] = HIR
            self.queue[row] = True


def hit_rate(steps, cache):
    start, hits, asks = len(steps) // 2, 0, 0
    for i, step in enumerate(steps):
        for row, times in step:
            hit = cache.holds(row)
            if i >= start:
                asks += times
                hits += times if hit else 0
            cache.ask(row, hit)
    return hits / asks


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("trace", help="little-endian u64 row ids, one per lookup, in step order")
    ap.add_argument("steps", help="per step, a little-endian u32 pair (decode, prefill tokens)")
    ap.add_argument("--budgets", required=True, help="cache sizes in rows, comma-separated")
    ap.add_argument("--ids-per-token", type=int, default=16)
    ap.add_argument("--lirs-hir", type=float, default=0.2, help="LIRS's share for HIR rows")
    ap.add_argument("--s3-small", type=float, default=0.1, help="S3-FIFO's small FIFO share")
    args = ap.parse_args()
    steps = load_steps(args.trace, args.steps, args.ids_per_token)
    for rows in (int(b) for b in args.budgets.split(",")):
        caches = {
            "lru": Lru(rows),
            f"lirs (hir {args.lirs_hir:g})": Lirs(rows, args.lirs_hir),
            f"s3-fifo (small {args.s3_small:g})": S3Fifo(rows, args.s3_small),
        }
        rates = ", ".join(f"{name} {hit_rate(steps, c):.4f}" for name, c in caches.items())
        print(f"{rows} rows: {rates}", flush=True)


if __name__ == "__main__":
    main()
