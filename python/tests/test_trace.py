"""Trace replay against a RowStore (CPU): the reader for both formats, step batching, Belady,
and the report on a small synthetic trace."""
from __future__ import annotations

import lzma

import numpy as np
import pytest

import fetchahead
import fetchahead.trace
from fetchahead.trace import belady_hit_rate, read_steps, read_trace, step_batches
from conftest import ROWS


def synthetic(seed: int = 3):
    """Zipf-like ids (a hot head, duplicates in a step) and steps of decode and prefill."""
    rng = np.random.default_rng(seed)
    steps = np.array([(0, 40), (8, 0), (8, 0), (6, 20)] * 30, dtype=np.uint32)
    n = int(steps.sum()) * 16
    ranks = np.minimum(rng.zipf(1.3, size=n), ROWS) - 1
    perm = rng.permutation(ROWS)
    return perm[ranks].astype(np.int64), steps


def test_trace_files_read_the_same_raw_and_xz(tmp_path):
    ids, steps = synthetic()
    raw = tmp_path / "t.u64"
    raw.write_bytes(ids.astype("<u8").tobytes())
    xz = tmp_path / "t.u64.xz"
    xz.write_bytes(lzma.compress(ids.astype("<u8").tobytes()))
    np.testing.assert_array_equal(read_trace(raw), ids)
    np.testing.assert_array_equal(read_trace(xz), ids)
    sf = tmp_path / "t.steps.u32"
    sf.write_bytes(steps.astype("<u4").tobytes())
    np.testing.assert_array_equal(read_steps(sf), steps)
    torn = tmp_path / "torn.u64"
    torn.write_bytes(ids.astype("<u8").tobytes()[:-3])
    with pytest.raises(fetchahead.InvalidArgumentError, match="torn.u64"):
        read_trace(torn)
    cut = step_batches(len(ids), steps)
    assert [e - a for a, e, _ in cut[:4]] == [640, 128, 128, 416]
    assert [p for _, _, p in cut[:4]] == [True, False, False, True]
    with pytest.raises(fetchahead.InvalidArgumentError, match="steps"):
        step_batches(len(ids) + 16, steps)


def test_trace_files_are_read_and_refused_as_bench_io_reads_them(tmp_path):
    # The crate's own reader: a missing file is a FileNotFoundError naming it, an id of 2^63
    # or more is refused with its place, and an empty trace is no ids.
    missing = tmp_path / "missing.u64"
    with pytest.raises(FileNotFoundError) as e:
        read_trace(missing)
    assert isinstance(e.value, fetchahead.FileError) and e.value.filename == str(missing)
    big = tmp_path / "big.u64"
    big.write_bytes(np.array([1, 1 << 63], dtype="<u8").tobytes())
    with pytest.raises(fetchahead.InvalidArgumentError, match="id 1 is 9223372036854775808"):
        read_trace(big)
    empty = tmp_path / "empty.u64"
    empty.write_bytes(b"")
    assert read_trace(empty).dtype == np.int64 and len(read_trace(empty)) == 0
    with pytest.raises(fetchahead.InvalidArgumentError, match="steps"):
        step_batches(16, np.array([(1, 0), (1, 0)]))
    with pytest.raises(fetchahead.InvalidArgumentError, match="token counts"):
        step_batches(16, np.array([(-1, 2)]))


def test_belady_by_hand():
    # Capacity 1: [1] [2] [1] [1]: keeps 1 (sooner) over 2: two hits of four.
    assert belady_hit_rate([np.array([1]), np.array([2]), np.array([1]), np.array([1])], 1, 0) == 0.5
    # Duplicates count each time and hit only if held when the batch began.
    assert belady_hit_rate([np.array([5, 5, 5]), np.array([5, 5])], 1, 0) == 2 / 5
    # No ids at all (an empty array's buffer is never read), and empty batches among others.
    assert belady_hit_rate([], 4, 0) == 0.0
    assert belady_hit_rate([np.array([], dtype=np.int64)] * 2, 4, 0) == 0.0
    assert belady_hit_rate([np.array([3]), np.array([], dtype=np.int64), np.array([3])], 1, 0) == 0.5


def test_replay_reports_hit_rate_reads_and_belady(table, tmp_path):
    ids, steps = synthetic()
    store = fetchahead.RowStore(table, cache_bytes=64 << 10)
    report = store.replay_trace(3, ids, steps=steps, belady_rows=100)
    assert report["steps"] == len(steps) and report["counted_from"] == len(steps) // 2
    assert 0.0 < report["hit_rate"] < 1.0
    assert report["hit_rate"] <= report["belady_hit_rate"] * 1.5
    assert report["disk_reads_per_step"] > 0
    assert report["decode"]["steps"] + report["prefill"]["steps"] == len(steps) - len(steps) // 2
    assert report["prefill"]["p99_us"] >= report["prefill"]["p50_us"] > 0
    # No cache: nothing hits, every counted id reads.
    plain = fetchahead.trace.replay_trace(fetchahead.RowStore(table), 3, ids, steps=steps)
    assert plain["hit_rate"] == 0.0 and "belady_hit_rate" not in plain


def test_advise_future_admits_a_coming_row_over_more_frequent_ones(table):
    for lookahead in (False, True):
        store = fetchahead.RowStore(table, cache_bytes=24 << 10, lookahead=lookahead)
        hot = np.arange(200, dtype=np.int64)
        for _ in range(5):
            store.lookup(3, hot)
        assert store.advise_future(3, [900], steps_ahead=2) == int(lookahead)
        store.lookup(3, [900])
        # Rows asked once, more than the cache holds, push 900 out of the cache's window (a
        # row that just missed waits there, so an immediate second ask would hit either way):
        # only a row known to be coming enters the main part over rows asked five times.
        store.lookup(3, np.arange(600, 800, dtype=np.int64))
        before = store.stats()["hits"]
        store.lookup(3, [900])
        assert (store.stats()["hits"] > before) == lookahead
    with pytest.raises(fetchahead.RowIdError):
        store.advise_future(3, [ROWS], steps_ahead=1)


def test_known_future_hands_each_later_chunk_over_once_from_its_first():
    # As the Rust test: prompts of 3 and 2 tokens, 1 id a token; step 0 prefills 2 tokens of
    # request 0, step 1 decodes 1 and prefills request 0's last token and request 1's first,
    # step 2 decodes 1 and prefills request 1's last token.
    steps = np.array([(0, 2), (1, 2), (1, 1)])
    cut = step_batches(7, steps, ids_per_token=1)
    f = fetchahead.trace.known_future(steps, cut, [3, 2], ids_per_token=1)
    assert f == [[(2, 3, 4)], [(2, 6, 7)], []]
    assert fetchahead.trace.known_future(steps, cut, [3, 2], ids_per_token=1, horizon=0)[2] == [
        (1, 6, 7)
    ]
    with pytest.raises(fetchahead.InvalidArgumentError, match="prompts"):
        fetchahead.trace.known_future(steps, cut, [3], ids_per_token=1)


def test_replay_with_prompts_reads_later_chunks_ahead(table):
    # 40 requests of 8 tokens, each prefilled over two steps of 4 tokens, every id new: an
    # online cache hits nothing; told the prompts, the store reads each second chunk ahead.
    requests, tokens = 40, 8
    ids = np.arange(requests * tokens, dtype=np.int64)
    steps = np.array([(0, 4)] * (requests * 2))
    prompts = [tokens] * requests
    for lookahead in (False, True):
        store = fetchahead.RowStore(table, cache_bytes=64 << 10, lookahead=lookahead)
        report = store.replay_trace(3, ids, steps=steps, ids_per_token=1, prompts=prompts)
        if lookahead:
            assert report["hit_rate"] == 0.5
            assert report["read_ahead_rows_per_step"] == 2.0
            assert report["read_ahead_wait"]["p99_us"] >= report["read_ahead_wait"]["p50_us"]
        else:
            assert report["hit_rate"] == 0.0
            assert report["read_ahead_rows_per_step"] == 0.0
    plain = fetchahead.RowStore(table, cache_bytes=64 << 10, lookahead=True)
    with pytest.raises(fetchahead.InvalidArgumentError, match="needs steps"):
        plain.replay_trace(3, ids, ids_per_token=1, batch_tokens=4, prompts=prompts)
