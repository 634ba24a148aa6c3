#!/usr/bin/env python3
"""A row store with hash-ahead: while prefill chunk k is looked up, the ids of chunk k + 1 are
already hashed and `advise`d, so that its rows are in the DRAM cache when it is looked up.

Needs only numpy (torch is not imported). Writes a small table to a temporary folder.

    python3 examples/row_store_advise.py

Prints what it checked; exits 0 when every check passes.
"""
import sys
import tempfile
import time

import numpy as np

import fetchahead

ROWS, DIM, LAYER, CHUNK, CHUNKS = 200_000, 256, 0, 2048, 6


def hash_chunk(tokens):
    """Bigram hashes of a chunk of token ids: its Engram row ids."""
    prev = np.roll(tokens, 1)
    return ((tokens * 1000003 + prev * 8191) % ROWS).astype(np.int64)


def main():
    rng = np.random.default_rng(0)
    prompt = rng.integers(0, 50_000, CHUNK * CHUNKS)
    chunks = [hash_chunk(prompt[i * CHUNK : (i + 1) * CHUNK]) for i in range(CHUNKS)]
    failures = 0
    with tempfile.TemporaryDirectory() as dir:
        # --- fetchahead: a table, a store with a DRAM row cache, hash-ahead advise
        fetchahead.make_table(dir, rows=ROWS, layers=[LAYER], dim=DIM, seed=3)
        store = fetchahead.RowStore(dir, cache_bytes=64 << 20)
        plain = fetchahead.RowStore(dir)  # the same table without a cache: the reference
        for k, ids in enumerate(chunks):
            if k + 1 < CHUNKS:
                store.advise(LAYER, chunks[k + 1])  # hash-ahead: the next chunk warms now
            time.sleep(0.05)  # the model's work on the previous chunk
            before = store.stats()
            weights, scales = store.lookup(LAYER, ids)
            after = store.stats()
            want_w, want_s = plain.lookup(LAYER, ids)
            # ---
            hits = after["hits"] - before["hits"]
            equal = np.array_equal(weights, want_w) and np.array_equal(scales, want_s)
            failures += not equal
            note = " (the first chunk: nothing advised ahead)" if k == 0 else ""
            print(f"chunk {k}{note}: {len(ids)} rows, {hits} from the cache ({100 * hits / len(ids):.0f}%), bytes {'equal' if equal else 'DIFFER'}")
        stats = store.stats()
        print(f"store: {stats['advised']} rows advised, {stats['hits']} hits, {stats['misses']} misses, read path {stats['read_path']}")
        if stats["advised"] == 0 or stats["hits"] < (CHUNKS - 1) * CHUNK // 2:
            failures += 1
            print("FAIL: advise warmed nothing")
    print("all checks passed" if failures == 0 else f"{failures} checks FAILED")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
