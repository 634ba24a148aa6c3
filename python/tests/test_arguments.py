"""Issue 21: every argument bounded and named, whichever way it arrives (CPU only)."""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

import fetchahead
from conftest import ROWS


# ---- item 4: one validation for every option ----------------------------------------------------


@pytest.mark.parametrize(
    "option,value",
    [
        ("preadv_threads", 10_000),
        ("preadv_threads", 0),
        ("uring_depth", 0),
        ("uring_depth", 2**32 - 1),
        ("uring_depth", 2**32),
    ],
)
def test_an_option_out_of_bounds_is_refused_naming_it(table, option, value):
    with pytest.raises(fetchahead.InvalidArgumentError, match=option) as e:
        fetchahead.RowStore(table, **{option: value})
    assert e.value.argument == option


def test_the_bounds_are_those_of_the_environment(table, monkeypatch):
    monkeypatch.setenv("FETCHAHEAD_PREADV_THREADS", "1024")
    fetchahead.RowStore(table)
    fetchahead.RowStore(table, preadv_threads=1024)
    with pytest.raises(fetchahead.InvalidArgumentError, match="1 to 1024"):
        fetchahead.RowStore(table, preadv_threads=1025)


# ---- item 7: only integers are ids --------------------------------------------------------------


@pytest.mark.parametrize(
    "ids",
    [
        np.array([0.9, 1.7, 2.2]),
        np.array([np.nan]),
        [0.9, 1.7],
        [True, False],
        np.array([True, False]),
        ["1", "2"],
    ],
    ids=["float-array", "nan", "float-list", "bool-list", "bool-array", "strings"],
)
def test_non_integer_ids_are_refused_never_truncated(table, ids):
    store = fetchahead.RowStore(table)
    with pytest.raises(fetchahead.InvalidArgumentError, match="ids") as e:
        store.lookup(0, ids)
    assert e.value.argument == "ids"
    with pytest.raises(fetchahead.InvalidArgumentError, match="ids"):
        store.advise(0, ids)


def test_integer_ids_of_any_dtype_and_empty_lists_are_ids(table, reference):
    store = fetchahead.RowStore(table)
    for dtype in (np.int32, np.uint16, np.uint64, np.int64):
        ids = np.array([1, 2, ROWS - 1], dtype=dtype)
        w, _ = store.lookup(0, ids)
        np.testing.assert_array_equal(w, reference.rows(0, ids.astype(np.int64))[0])
    w, s = store.lookup(0, [])
    assert w.shape == (0, store.dim)


def test_a_uint64_id_past_int64_is_reported_as_passed(table):
    store = fetchahead.RowStore(table)
    big = 2**63
    with pytest.raises(fetchahead.RowIdError) as e:
        store.lookup(0, np.array([1, big], dtype=np.uint64))
    assert str(big) in str(e.value) and f"-{big}" not in str(e.value)
    assert e.value.row_ids == [big] and e.value.first_index == 1


# ---- item 8: paths are resolved when the store opens ---------------------------------------------


def test_tune_after_chdir_writes_beside_the_table(tmp_path, monkeypatch):
    table = tmp_path / "small"
    fetchahead.make_table(table, rows=64, layers=[1], dim=256)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(tmp_path)
    store = fetchahead.RowStore("small")
    assert os.path.isabs(store.path) and Path(store.path) == table
    monkeypatch.chdir(elsewhere)
    store.tune()
    assert (table / "fetchahead-tune.json").is_file()
    assert list(elsewhere.iterdir()) == []


# ---- item 12: integers out of range are argument errors naming the argument --------------------


@pytest.mark.parametrize(
    "kwargs,argument",
    [
        ({"cache_bytes": -1}, "cache_bytes"),
        ({"cache_bytes": 2**64}, "cache_bytes"),
        ({"row_start": -5}, "row_start"),
        ({"num_rows": -1}, "num_rows"),
        ({"preadv_threads": -1}, "preadv_threads"),
    ],
)
def test_a_negative_or_huge_option_is_an_argument_error(table, kwargs, argument):
    with pytest.raises(fetchahead.InvalidArgumentError) as e:
        fetchahead.RowStore(table, **kwargs)
    assert e.value.argument == argument


@pytest.mark.parametrize("layer", [-1, 2**40, 1.0, "0"])
def test_a_bad_layer_is_an_argument_error(table, layer):
    store = fetchahead.RowStore(table)
    with pytest.raises(fetchahead.InvalidArgumentError) as e:
        store.lookup(layer, [1])
    assert e.value.argument == "layer"
    with pytest.raises(fetchahead.InvalidArgumentError):
        store.advise(layer, [1])


@pytest.mark.parametrize(
    "kwargs,argument",
    [({"layer": -1}, "layer"), ({"layer": 2**40}, "layer"), ({"capacity": 0}, "capacity"),
     ({"rank": -1}, "rank")],
)
def test_a_prefetchers_integers_are_checked_before_any_device(kwargs, argument):
    with pytest.raises(fetchahead.InvalidArgumentError) as e:
        fetchahead.Prefetcher(fetchahead.MemoryTable(16), **kwargs)
    assert e.value.argument == argument


def test_bad_memory_table_and_make_table_integers_name_their_argument(tmp_path):
    with pytest.raises(fetchahead.InvalidArgumentError) as e:
        fetchahead.MemoryTable(-1)
    assert e.value.argument == "rows"
    with pytest.raises(fetchahead.InvalidArgumentError) as e:
        fetchahead.make_table(tmp_path / "t", rows=16, layers=[-1])
    assert e.value.argument == "layers"


# ---- item 13: an explicit argument wins, its variable is not even parsed ----------------------


def test_an_explicit_argument_wins_over_a_malformed_variable(table, monkeypatch):
    monkeypatch.setenv("FETCHAHEAD_READ_PATH", "fast")
    monkeypatch.setenv("FETCHAHEAD_PREADV_THREADS", "lots")
    monkeypatch.setenv("FETCHAHEAD_CACHE_BYTES", "1024T")
    store = fetchahead.RowStore(table, read_path="buffered", preadv_threads=4, cache_bytes=0)
    assert store.read_path == "buffered"
    with pytest.raises(fetchahead.InvalidArgumentError, match="FETCHAHEAD_READ_PATH"):
        fetchahead.RowStore(table, preadv_threads=4, cache_bytes=0)


def test_a_refused_cache_budget_names_the_variable_it_came_from(table, monkeypatch):
    monkeypatch.setenv("FETCHAHEAD_CACHE_BYTES", "1024T")
    with pytest.raises(fetchahead.OutOfMemoryError, match="FETCHAHEAD_CACHE_BYTES"):
        fetchahead.RowStore(table)


# ---- item 14: one set of limits and one meaning of 0 --------------------------------------------


def test_num_rows_zero_means_every_row_as_in_c(table):
    assert fetchahead.RowStore(table, row_start=10, num_rows=0).row_range == range(10, ROWS)


@pytest.mark.parametrize(
    "rows,dim,argument", [(0, 256, "rows"), (4, 8224, "dim"), (4, 2**31, "dim"), (4, 33, "dim")]
)
def test_memory_tables_have_the_stores_limits(rows, dim, argument):
    with pytest.raises(fetchahead.InvalidArgumentError) as e:
        fetchahead.MemoryTable(rows, dim)
    assert e.value.argument == argument


# ---- item 15: an unknown arch is an error -------------------------------------------------------


def test_default_variant_of_an_unknown_arch_is_an_error():
    assert fetchahead.default_variant("gather", "sm_90")
    with pytest.raises(fetchahead.Error, match="sm_00"):
        fetchahead.default_variant("gather", "sm_00")


# ---- item 17: bytes and os.PathLike paths ------------------------------------------------------


def test_bytes_and_pathlike_paths_are_paths(table, tmp_path):
    for p in (os.fsencode(table), Path(table), str(table)):
        store = fetchahead.RowStore(p)
        assert store.path == os.fspath(table)
    out = fetchahead.make_table(os.fsencode(tmp_path / "b"), rows=16, layers=[1])
    assert out and all(isinstance(p, str) for p in out)
    with pytest.raises(fetchahead.InvalidArgumentError, match="path"):
        fetchahead.RowStore(12)
