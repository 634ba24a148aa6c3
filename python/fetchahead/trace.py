"""Real lookup traces replayed against a :class:`~fetchahead.RowStore`, as ``fetchahead bench-io
--trace`` replays them: per scheduler step the step's ids are one lookup (the store reads each
distinct row once and counts a hit per id asked); the first half of the steps warms the cache,
the second half is counted.

Trace files: row ids as little-endian u64 (``.u64``, or xz-compressed ``.u64.xz``); steps files
(``.steps.u32``): per step a little-endian u32 pair, decode tokens then prefill tokens, a step's
ids being the next ``ids_per_token`` x (decode + prefill) of the trace.
"""
from __future__ import annotations

import heapq
import lzma
import os
import time
from typing import Any, Optional, Union

import numpy as np

from .errors import InvalidArgumentError

PathLike = Union[str, "os.PathLike[str]"]


def _invalid(message: str) -> InvalidArgumentError:
    """An :class:`InvalidArgumentError` from ``"invalid ARGUMENT: WHY"``."""
    argument, _, why = message.removeprefix("invalid ").partition(": ")
    e = InvalidArgumentError(message)
    e.argument = argument
    e.why = why
    return e


def _read_bytes(path: PathLike) -> bytes:
    path = os.fspath(path)
    if path.endswith(".xz"):
        try:
            with lzma.open(path) as f:
                return f.read()
        except lzma.LZMAError as e:
            raise _invalid(f"invalid trace file: {path}: {e}") from None
    with open(path, "rb") as f:
        return f.read()


def read_trace(path: PathLike) -> np.ndarray:
    """The row ids of a ``.u64`` or ``.u64.xz`` trace, as an int64 array."""
    data = _read_bytes(path)
    if len(data) % 8:
        raise _invalid(
            f"invalid trace file: {os.fspath(path)}: {len(data)} bytes is not a whole number "
            "of u64 row ids"
        )
    ids = np.frombuffer(data, dtype="<u8")
    if ids.size and int(ids.max()) >= 1 << 63:
        raise _invalid(f"invalid trace file: {os.fspath(path)}: an id is >= 2^63")
    return ids.astype(np.int64)


def read_steps(path: PathLike) -> np.ndarray:
    """The steps of a ``.steps.u32`` file: an ``[n, 2]`` array of (decode, prefill) tokens."""
    data = _read_bytes(path)
    if len(data) % 8:
        raise _invalid(
            f"invalid steps file: {os.fspath(path)}: {len(data)} bytes is not a whole number "
            "of (decode, prefill) u32 pairs"
        )
    return np.frombuffer(data, dtype="<u4").reshape(-1, 2).astype(np.int64)


def step_batches(
    n_ids: int,
    steps: Optional[np.ndarray] = None,
    *,
    ids_per_token: int = 16,
    batch_tokens: int = 2048,
) -> list[tuple[int, int, bool]]:
    """The trace's batches as ``(start, end, prefill)``: one per step (which must account for
    every id), or without steps one per ``batch_tokens`` tokens, each counted as prefill."""
    if ids_per_token < 1 or batch_tokens < 1:
        raise _invalid("invalid trace batching: want ids_per_token, batch_tokens >= 1")
    if steps is None:
        per = ids_per_token * batch_tokens
        return [(a, min(a + per, n_ids), True) for a in range(0, n_ids, per)]
    out, at = [], 0
    for i, (d, p) in enumerate(np.asarray(steps).tolist()):
        n = (d + p) * ids_per_token
        if at + n > n_ids:
            raise _invalid(
                f"invalid steps file: step {i} runs past the trace's {n_ids} ids"
            )
        out.append((at, at + n, p > 0))
        at += n
    if at != n_ids:
        raise _invalid(
            f"invalid steps file: its {len(out)} steps account for {at} ids, the trace has {n_ids}"
        )
    return out


def belady_hit_rate(batches: list[np.ndarray], capacity: int, counted_from: int) -> float:
    """Belady's MIN with bypass on ``batches`` with room for ``capacity`` rows, counted as the
    store counts (an id hits when its row was held when the batch began; rows read for a batch
    enter after it), over batches ``counted_from..``."""
    distinct = [np.unique(b, return_counts=True) for b in batches]
    nxt: list[np.ndarray] = [None] * len(batches)  # type: ignore[list-item]
    seen: dict[int, int] = {}
    never = len(batches)
    for b in range(len(batches) - 1, -1, -1):
        rows = distinct[b][0].tolist()
        nxt[b] = np.array([seen.get(r, never) for r in rows])
        for r in rows:
            seen[r] = b
    held: dict[int, int] = {}
    heap: list[tuple[int, int]] = []  # (-next use, row), stale entries skipped
    hits = requests = 0
    for b, (rows, counts) in enumerate(distinct):
        for r, n, nu in zip(rows.tolist(), counts.tolist(), nxt[b].tolist()):
            if b >= counted_from:
                requests += n
                if r in held:
                    hits += n
            held[r] = nu
            heapq.heappush(heap, (-nu, r))
        while len(held) > capacity and heap:
            nu, r = heapq.heappop(heap)
            if held.get(r) == -nu:
                del held[r]
    return hits / requests if requests else 0.0


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
) -> dict[str, Any]:
    """Replays ``trace`` (a file or an id array) against ``store`` (a :class:`RowStore`,
    usually opened with a ``cache_bytes`` budget) step by step, and returns the report:
    ``hit_rate`` (the store's counters over the counted half), ``disk_reads_per_step``,
    ``rows_per_s``, ``decode`` and ``prefill`` lookup times (``p50_us``, ``p99_us``,
    ``steps``), and with ``belady_rows`` (the rows the cache holds) ``belady_hit_rate`` and
    ``vs_belady`` on the same batches."""
    ids = trace if isinstance(trace, np.ndarray) else read_trace(trace)
    ids = np.ascontiguousarray(ids, dtype=np.int64)
    if steps is not None and not isinstance(steps, np.ndarray):
        steps = read_steps(steps)
    cut = step_batches(len(ids), steps, ids_per_token=ids_per_token, batch_tokens=batch_tokens)
    if len(cut) < 2:
        raise _invalid("invalid trace: want at least 2 batches (warm-up, counted)")
    batches = [ids[a:e] for a, e, _ in cut]
    counted_from = len(cut) // 2
    for b in batches[:counted_from]:
        store.lookup(layer, b)
    before = store.stats()
    decode, prefill = [], []
    for (_, _, is_prefill), b in zip(cut[counted_from:], batches[counted_from:]):
        t = time.perf_counter()
        store.lookup(layer, b)
        (prefill if is_prefill else decode).append(time.perf_counter() - t)
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
    if belady_rows is not None:
        opt = belady_hit_rate(batches, belady_rows, counted_from)
        report["belady_hit_rate"] = opt
        report["vs_belady"] = report["hit_rate"] / opt if opt else 0.0
    return report
