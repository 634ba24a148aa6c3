"""RowStore lookups against the shards' bytes, through every read path this machine has."""
from __future__ import annotations

import numpy as np
import pytest

import fetchahead
from conftest import LAYERS, ROWS


def paths(store):
    found = ["auto", "preadv", "mmap", "buffered"]
    if store.uring_off is None:
        found.append("uring")
    return found


def test_lookups_equal_the_files_bytes_on_every_read_path(table, reference):
    store = fetchahead.RowStore(table)
    rng = np.random.default_rng(1)
    ids = rng.integers(0, ROWS, size=300)
    ids[:3] = [0, ROWS - 1, 0]  # the edges and a duplicate
    for layer in LAYERS:
        want_w, want_s = reference.rows(layer, ids)
        for path in paths(store):
            w, s = store.lookup(layer, ids, path=path)
            assert w.dtype == np.uint8 and w.shape == (len(ids), 256), path
            assert s.shape == (len(ids), 8), path
            np.testing.assert_array_equal(w, want_w, err_msg=path)
            np.testing.assert_array_equal(s, want_s, err_msg=path)


def test_lookup_into_caller_buffers_and_empty_batches(table, reference):
    store = fetchahead.RowStore(table)
    ids = np.array([5, 6, 999], dtype=np.int64)
    w = np.zeros((3, 256), dtype=np.uint8)
    s = np.zeros((3, 8), dtype=np.uint8)
    got_w, got_s = store.lookup(3, ids, weights=w, scales=s)
    assert got_w is w and got_s is s
    want_w, want_s = reference.rows(3, ids)
    np.testing.assert_array_equal(w, want_w)
    np.testing.assert_array_equal(s, want_s)
    w0, s0 = store.lookup(0, [])
    assert w0.shape == (0, 256) and s0.shape == (0, 8)


def test_a_buffer_of_the_wrong_size_is_a_value_error_naming_it(table):
    store = fetchahead.RowStore(table)
    with pytest.raises(ValueError, match="weights"):
        store.lookup(0, [1, 2], weights=np.zeros((1, 256), dtype=np.uint8))
    with pytest.raises(ValueError, match="ids"):
        store.lookup(0, [[1, 2]])


def test_the_cache_counts_hits_and_advise_warms_it(table, reference):
    store = fetchahead.RowStore(table, cache_bytes=1 << 20)
    ids = np.arange(100, 164)
    store.lookup(0, ids)
    first = store.stats()
    assert first["misses"] == 64 and first["hits"] == 0 and first["reads"] > 0
    store.lookup(0, ids)
    assert store.stats()["hits"] == 64
    store.advise(0, np.arange(200, 232))
    import time

    for _ in range(200):
        if store.stats()["advised"] >= 32:
            break
        time.sleep(0.01)
    stats = store.stats()
    assert stats["advised"] == 32, stats
    w, _ = store.lookup(0, np.arange(200, 232))
    np.testing.assert_array_equal(w, reference.rows(0, np.arange(200, 232))[0])
    assert store.stats()["hits"] == 64 + 32
    assert set(stats) >= {"hits", "misses", "reads", "bytes", "advised", "read_path"}


def test_a_rank_owns_a_row_range(table, reference):
    store = fetchahead.RowStore(table, row_start=100, num_rows=50)
    assert store.row_range == range(100, 150)
    w, _ = store.lookup(0, [100, 149])
    np.testing.assert_array_equal(w, reference.rows(0, [100, 149])[0])
    with pytest.raises(fetchahead.RowIdError) as e:
        store.lookup(0, [100, 150])
    assert e.value.row_ids == [150] and e.value.row_range == (100, 150)
    assert isinstance(e.value, IndexError)


def test_torch_cpu_buffers_are_filled_in_place(table, reference, torch):
    store = fetchahead.RowStore(table)
    ids = torch.tensor([1, 2, 3])
    w = torch.empty((3, 256), dtype=torch.uint8)
    s = torch.empty((3, 8), dtype=torch.uint8)
    store.lookup(0, ids, weights=w, scales=s)
    np.testing.assert_array_equal(w.numpy(), reference.rows(0, [1, 2, 3])[0])
