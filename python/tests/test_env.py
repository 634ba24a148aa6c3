"""FETCHAHEAD_* variables override the row store's defaults where the caller set nothing."""
from __future__ import annotations

import pytest

import fetchahead


@pytest.fixture
def env(monkeypatch):
    return monkeypatch


def test_the_settings_table_lists_every_variable():
    names = [name for name, _ in fetchahead.env_settings()]
    assert names == [
        "FETCHAHEAD_READ_PATH",
        "FETCHAHEAD_CACHE_BYTES",
        "FETCHAHEAD_URING_DEPTH",
        "FETCHAHEAD_PREADV_THREADS",
        "FETCHAHEAD_DIRECT_IO",
    ]


def test_a_variable_sets_what_the_caller_left_unset(table, env):
    env.setenv("FETCHAHEAD_READ_PATH", "mmap")
    env.setenv("FETCHAHEAD_CACHE_BYTES", "1M")
    store = fetchahead.RowStore(table)
    assert store.read_path == "mmap"
    store.lookup(0, list(range(10)))
    store.lookup(0, list(range(10)))
    assert store.stats()["hits"] == 10  # the cache the variable turned on


def test_a_keyword_argument_wins_over_the_variable(table, env):
    env.setenv("FETCHAHEAD_READ_PATH", "mmap")
    assert fetchahead.RowStore(table, read_path="buffered").read_path == "buffered"


def test_direct_io_off_from_the_environment(table, env):
    env.setenv("FETCHAHEAD_DIRECT_IO", "0")
    store = fetchahead.RowStore(table)
    assert store.direct_io_off is not None


@pytest.mark.parametrize(
    "name,value",
    [("FETCHAHEAD_READ_PATH", "fast"), ("FETCHAHEAD_URING_DEPTH", "0"), ("FETCHAHEAD_CACHE_BYTES", "lots")],
)
def test_a_malformed_variable_is_an_error_naming_it(table, env, name, value):
    env.setenv(name, value)
    with pytest.raises(fetchahead.InvalidArgumentError, match=name):
        fetchahead.RowStore(table)
