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
from typing import Any, Optional, Sequence, Union

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
    chunks: list[list[tuple[int, int, int]]] = [[] for _ in prompts]
    request, left = 0, (int(prompts[0]) if len(prompts) else 0)
    for t, ((decode, prefill), (start, _, _)) in enumerate(zip(np.asarray(steps).tolist(), cut)):
        at = start + decode * ids_per_token
        while prefill > 0:
            while left == 0:
                request += 1
                if request >= len(prompts):
                    raise _invalid(
                        f"invalid documents: their {len(prompts)} prompts end before step {t}'s "
                        "prefill tokens"
                    )
                left = int(prompts[request])
            n = min(prefill, left)
            chunks[request].append((t, at, at + n * ids_per_token))
            at += n * ids_per_token
            prefill, left = prefill - n, left - n
    out: list[list[tuple[int, int, int]]] = [[] for _ in cut]
    for c in chunks:
        if not c:
            continue
        first = c[0][0]
        for u, a, e in c[1:]:
            t = max(u - horizon, first)
            out[t].append((u - t + 1, a, e))
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
