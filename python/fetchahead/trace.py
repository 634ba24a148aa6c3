"""Real lookup traces replayed against a :class:`~fetchahead.RowStore`, as ``fetchahead bench-io
--trace`` replays them: per scheduler step the step's ids are one lookup (the store reads each
distinct row once and counts a hit per id asked); the first half of the steps warms the cache,
the second half is counted.

Trace files: row ids as little-endian u64 (``.u64``, or xz-compressed ``.u64.xz``); steps files
(``.steps.u32``): per step a little-endian u32 pair, decode tokens then prefill tokens, a step's
ids being the next ``ids_per_token`` x (decode + prefill) of the trace.
"""
from __future__ import annotations

import os
import time
from typing import Any, Optional, Sequence, Union

import numpy as np

from . import _native
from .errors import InvalidArgumentError

PathLike = Union[str, "os.PathLike[str]"]


def _invalid(message: str) -> InvalidArgumentError:
    """An :class:`InvalidArgumentError` from ``"invalid ARGUMENT: WHY"``."""
    argument, _, why = message.removeprefix("invalid ").partition(": ")
    e = InvalidArgumentError(message)
    e.argument = argument
    e.why = why
    return e


def read_trace(path: PathLike) -> np.ndarray:
    """The row ids of a ``.u64`` or ``.u64.xz`` trace, as an int64 array (read by the crate's
    own reader, as ``bench-io --trace`` reads it)."""
    return np.frombuffer(_native.trace_read_ids(os.fspath(path)), dtype="<i8").astype(np.int64)


def read_steps(path: PathLike) -> np.ndarray:
    """The steps of a ``.steps.u32`` file: an ``[n, 2]`` array of (decode, prefill) tokens."""
    steps = _native.trace_read_steps(os.fspath(path))
    return np.array(steps, dtype=np.int64).reshape(-1, 2)


def _step_pairs(steps: np.ndarray) -> list[tuple[int, int]]:
    pairs = np.asarray(steps).reshape(-1, 2)
    if pairs.size and (pairs.min() < 0 or pairs.max() >= 1 << 32):
        raise _invalid("invalid steps: want token counts in 0..2^32")
    return [(int(d), int(p)) for d, p in pairs.tolist()]


def step_batches(
    n_ids: int,
    steps: Optional[np.ndarray] = None,
    *,
    ids_per_token: int = 16,
    batch_tokens: int = 2048,
) -> list[tuple[int, int, bool]]:
    """The trace's batches as ``(start, end, prefill)``: one per step (which must account for
    every id), or without steps one per ``batch_tokens`` tokens, each counted as prefill
    (the Rust ``store::trace::step_batches``)."""
    if ids_per_token < 1 or batch_tokens < 1:
        raise _invalid("invalid trace batching: want ids_per_token, batch_tokens >= 1")
    pairs = None if steps is None else _step_pairs(steps)
    return _native.trace_step_batches(n_ids, pairs, ids_per_token, batch_tokens)


def known_future(
    steps: np.ndarray,
    cut: list[tuple[int, int, bool]],
    prompts: Sequence[int],
    *,
    ids_per_token: int = 16,
    horizon: int = 8,
) -> list[list[tuple[int, int, int]]]:
    """What a scheduler knows ahead, step by step (the Rust ``store::trace::known_future``):
    a request's prompt (``prompts``: tokens each, in arrival order) is known when its first
    chunk runs, so its later prefill chunks are too. Entry ``t`` lists, as ``(steps_ahead,
    start, end)`` ranges of the trace, the chunks to hand to :meth:`RowStore.advise_future`
    before step ``t``'s lookup, each once and at most ``horizon`` steps before it runs
    (``steps_ahead`` 1 is the step about to be looked up)."""
    if horizon < 0 or ids_per_token < 1:
        raise _invalid("invalid look-ahead: want horizon >= 0 and ids_per_token >= 1")
    return _native.trace_known_future(
        _step_pairs(steps), list(cut), [int(p) for p in prompts], ids_per_token, horizon
    )


def belady_hit_rate(batches: list[np.ndarray], capacity: int, counted_from: int) -> float:
    """Belady's MIN with bypass on ``batches`` with room for ``capacity`` rows, counted as the
    store counts (an id hits when its row was held when the batch began; rows read for a batch
    enter after it), over batches ``counted_from..`` (the Rust ``store::belady::belady``)."""
    if capacity < 0 or counted_from < 0:
        raise _invalid("invalid Belady replay: want capacity, counted_from >= 0")
    parts = [np.ascontiguousarray(b, dtype=np.int64).ravel() for b in batches]
    ids = np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)
    ends = np.cumsum([len(b) for b in parts], dtype=np.int64).tolist()
    cut = list(zip([0] + ends[:-1], ends))
    return _native.trace_belady(ids.ctypes.data, len(ids), cut, capacity, counted_from)


def _percentiles_us(samples: list[float]) -> dict[str, Any]:
    if not samples:
        return {"steps": 0, "p50_us": 0.0, "p99_us": 0.0}
    s = sorted(samples)

    def at(p: float) -> float:
        return s[min(len(s), max(1, int(np.ceil(p * len(s))))) - 1] * 1e6

    return {"steps": len(s), "p50_us": at(0.5), "p99_us": at(0.99)}


def replay_trace(
    store: Any,
    layer: int,
    trace: Union[PathLike, np.ndarray],
    *,
    steps: Union[PathLike, np.ndarray, None] = None,
    ids_per_token: int = 16,
    batch_tokens: int = 2048,
    belady_rows: Optional[int] = None,
    prompts: Optional[Sequence[int]] = None,
    lookahead_steps: int = 8,
) -> dict[str, Any]:
    """Replays ``trace`` (a file or an id array) against ``store`` (a :class:`RowStore`,
    usually opened with a ``cache_bytes`` budget) step by step, and returns the report:
    ``hit_rate`` (the store's counters over the counted half), ``disk_reads_per_step``,
    ``rows_per_s``, ``decode`` and ``prefill`` lookup times (``p50_us``, ``p99_us``,
    ``steps``), and with ``belady_rows`` (the rows the cache holds) ``belady_hit_rate`` and
    ``vs_belady`` on the same batches.

    With ``prompts`` (each request's prompt tokens, in arrival order, as the documents file
    lists them; needs ``steps``) the replay looks ahead as an engine can: before each step it
    hands the store the later prefill chunks it knows (:func:`known_future`, at most
    ``lookahead_steps`` ahead) with :meth:`RowStore.advise_future`, and waits for the
    read-ahead before timing the lookup (the compute of the step before would overlap it);
    the report adds ``read_ahead_rows_per_step`` and ``read_ahead_wait`` (``p50_us``,
    ``p99_us``). Open the store with ``lookahead=True`` for it to act."""
    ids = trace if isinstance(trace, np.ndarray) else read_trace(trace)
    ids = np.ascontiguousarray(ids, dtype=np.int64)
    if steps is not None and not isinstance(steps, np.ndarray):
        steps = read_steps(steps)
    cut = step_batches(len(ids), steps, ids_per_token=ids_per_token, batch_tokens=batch_tokens)
    if len(cut) < 2:
        raise _invalid("invalid trace: want at least 2 batches (warm-up, counted)")
    batches = [ids[a:e] for a, e, _ in cut]
    counted_from = len(cut) // 2
    future = None
    if prompts is not None:
        if steps is None:
            raise _invalid("invalid trace replay: look-ahead (prompts) needs steps")
        future = known_future(steps, cut, prompts, ids_per_token=ids_per_token,
                              horizon=lookahead_steps)
    waits: list[float] = []

    def hand_over(t: int) -> None:
        if future is None:
            return
        for steps_ahead, a, e in future[t]:
            store.advise_future(layer, ids[a:e], steps_ahead)
        w = time.perf_counter()
        store.wait_advised()
        if t >= counted_from:
            waits.append(time.perf_counter() - w)

    for t, b in enumerate(batches[:counted_from]):
        hand_over(t)
        store.lookup(layer, b)
    before = store.stats()
    decode, prefill = [], []
    for t, ((_, _, is_prefill), b) in enumerate(
        zip(cut[counted_from:], batches[counted_from:]), start=counted_from
    ):
        hand_over(t)
        start = time.perf_counter()
        store.lookup(layer, b)
        (prefill if is_prefill else decode).append(time.perf_counter() - start)
    after = store.stats()
    hits = after["hits"] - before["hits"]
    asked = hits + after["misses"] - before["misses"]
    counted = len(cut) - counted_from
    total = sum(decode) + sum(prefill)
    report: dict[str, Any] = {
        "steps": len(cut),
        "counted_from": counted_from,
        "requests": asked,
        "hit_rate": hits / asked if asked else 0.0,
        "disk_reads_per_step": (after["reads"] - before["reads"]) / counted,
        "rows_per_s": sum(len(b) for b in batches[counted_from:]) / total if total else 0.0,
        "decode": _percentiles_us(decode),
        "prefill": _percentiles_us(prefill),
    }
    if future is not None:
        report["read_ahead_rows_per_step"] = (after["advised"] - before["advised"]) / counted
        report["read_ahead_wait"] = _percentiles_us(waits)
    if belady_rows is not None:
        opt = belady_hit_rate(batches, belady_rows, counted_from)
        report["belady_hit_rate"] = opt
        report["vs_belady"] = report["hit_rate"] / opt if opt else 0.0
    return report
