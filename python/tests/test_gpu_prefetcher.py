"""Prefetcher and FlagLane on the GPU: both completion modes, check mode, fallback, ops,
torch.compile and a CUDA graph replayed 1000 times."""
from __future__ import annotations

import logging

import pytest

import fetchahead
from gpu_reference import assert_same_bits, dequant_reference

ROWS, DIM = 1 << 14, 256


@pytest.fixture(scope="module")
def table(torch, cuda):
    memory = fetchahead.MemoryTable(ROWS, DIM, seed=5)
    w, s = memory.arrays()
    return memory, torch.from_numpy(w.copy()), torch.from_numpy(s.copy())


def random_ids(torch, cuda, n, seed):
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, ROWS, (n,), generator=gen, dtype=torch.int64).to(cuda)


@pytest.mark.parametrize("completion", ["flag", "host_function"])
def test_prefetched_rows_equal_the_reference(torch, cuda, table, completion):
    memory, w, s = table
    p = fetchahead.Prefetcher(memory, capacity=1024, completion=completion, check=True)
    for step in range(20):
        ids = random_ids(torch, cuda, 1000, step)
        p.prefetch(ids)
        rows = p.gather_dequant(ids)
        assert_same_bits(torch, rows, dequant_reference(torch, w, s, ids))
    sync = p.gather_dequant_sync(ids)
    assert_same_bits(torch, sync, rows)
    assert p.check_differed() == 0
    stats = p.stats()
    assert stats["prefetches"] == 20 and stats["gathers"] == 20 and stats["lookup_errors"] == 0


def test_prefetchers_share_a_flag_lane(torch, cuda, table):
    memory, w, s = table
    lane = fetchahead.FlagLane()
    layers = [fetchahead.Prefetcher(memory, lane=lane, rank=r, capacity=512) for r in range(3)]
    ids = [random_ids(torch, cuda, 500, 100 + r) for r in range(3)]
    for p, i in zip(layers, ids):
        p.prefetch(i)
    for p, i in zip(layers, ids):
        assert_same_bits(torch, p.gather_dequant(i), dequant_reference(torch, w, s, i))


def test_a_lookup_error_is_taken_with_its_ids_and_gathers_fall_back(torch, cuda, table, caplog):
    memory, w, s = table
    p = fetchahead.Prefetcher(memory, capacity=256)
    ids = random_ids(torch, cuda, 100, 7)
    torch.cuda.synchronize()  # the warm-up's empty lookups are done before the fault is armed
    memory.inject("fail_next", 1)
    p.prefetch(ids)
    zero = p.gather_dequant(ids)
    torch.cuda.synchronize()
    assert (zero == 0).all()
    with caplog.at_level(logging.WARNING, logger="fetchahead"):
        p.prefetch(ids)  # falls back: the warning is logged here
        rows = p.gather_dequant(ids)
    assert_same_bits(torch, rows, dequant_reference(torch, w, s, ids))
    errors = p.take_errors()
    assert len(errors) == 1 and errors[0][1] == ids.tolist()
    assert p.stats()["fell_back"]
    assert any("synchronous path" in r.getMessage() for r in caplog.records)
    p.resume()
    assert not p.stats()["fell_back"]


def test_order_and_capacity_errors(torch, cuda, table):
    memory, _, _ = table
    p = fetchahead.Prefetcher(memory, capacity=64)
    ids = random_ids(torch, cuda, 64, 1)
    with pytest.raises(fetchahead.PrefetchOrderError):
        p.gather_dequant(ids)
    with pytest.raises(fetchahead.StagingFullError):
        p.prefetch(random_ids(torch, cuda, 65, 1))
    with pytest.raises(ValueError, match="ids"):
        p.prefetch(ids.int())
    p.prefetch(ids)
    with pytest.raises(fetchahead.PrefetchOrderError):
        p.prefetch(ids)
    p.gather_dequant(ids)


def test_opcheck_passes_for_the_prefetcher_ops(torch, cuda, table):
    memory, _, _ = table
    p = fetchahead.Prefetcher(memory, capacity=128)
    ids = random_ids(torch, cuda, 128, 2)
    ops = torch.ops.fetchahead
    out = torch.empty((128, DIM), dtype=torch.bfloat16, device=cuda)
    # prefetch and the gathers come in pairs, so each test utility runs on its own and the pair
    # is completed after it. test_aot_dispatch_dynamic runs an op twice without its partner; the
    # torch.compile test below covers that path instead.
    def settle():
        s = p.stats()
        if s["prefetches"] > s["gathers"]:
            p.gather_dequant(ids)

    for util in ("test_schema", "test_autograd_registration", "test_faketensor"):
        torch.library.opcheck(ops.prefetch.default, (p.handle, ids, p._ticket), test_utils=util)
        settle()
        p.prefetch(ids)
        torch.library.opcheck(
            ops.prefetched_gather_dequant.default, (p.handle, ids, p._ticket), test_utils=util
        )
        settle()
        p.prefetch(ids)
        torch.library.opcheck(
            ops.prefetched_gather_dequant_out.default,
            (p.handle, ids, p._ticket, out),
            test_utils=util,
        )
        settle()
    torch.library.opcheck(ops.sync_gather_dequant.default, (p.handle, ids, p._ticket))


def test_a_compiled_forward_keeps_prefetch_and_gather(torch, cuda, table):
    memory, w, s = table
    p = fetchahead.Prefetcher(memory, capacity=512)
    weight = torch.randn(DIM, 64, device=cuda, dtype=torch.bfloat16)

    def forward(ids, x):
        p.prefetch(ids)
        h = x @ weight  # the model's work while the rows arrive
        rows = p.gather_dequant(ids)
        p.finish()  # the default tagged gathers: the step's one join
        return rows, h

    ids = random_ids(torch, cuda, 512, 3)
    x = torch.randn(512, DIM, device=cuda, dtype=torch.bfloat16)
    eager = forward(ids, x)
    torch._dynamo.reset()
    compiled = torch.compile(forward, fullgraph=True)
    got = compiled(ids, x)
    assert_same_bits(torch, got[0], eager[0])
    assert_same_bits(torch, got[0], dequant_reference(torch, w, s, ids))
    explained = torch._dynamo.explain(forward)(ids, x)
    assert explained.graph_break_count == 0
    before = p.stats()["prefetches"]
    compiled(ids, x)
    assert p.stats()["prefetches"] == before + 1  # not eliminated as dead code


@pytest.mark.parametrize(
    "completion, join", [("flag", "tags"), ("flag", "at_gather"), ("host_function", "tags")]
)
def test_a_captured_prefetching_forward_replays_1000_times_with_check_mode_at_zero(
    torch, cuda, table, completion, join
):
    memory, w, s = table
    p = fetchahead.Prefetcher(
        memory, capacity=1024, check=True, completion=completion, join=join
    )
    ids = random_ids(torch, cuda, 1024, 0)
    out = torch.empty((1024, DIM), dtype=torch.bfloat16, device=cuda)
    weight = torch.randn(DIM, DIM, device=cuda, dtype=torch.bfloat16)
    x = torch.randn(1024, DIM, device=cuda, dtype=torch.bfloat16)
    h = torch.empty(1024, DIM, device=cuda, dtype=torch.bfloat16)

    def forward():
        p.prefetch(ids)
        torch.matmul(x, weight, out=h)
        p.gather_dequant(ids, out=out)
        p.finish()  # tags: the capture's join of the side branch (a no-op with at_gather)

    forward()  # eager first: warm
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        forward()
    for step in range(1000):
        ids.copy_(random_ids(torch, cuda, 1024, step + 1))
        graph.replay()
        if step % 250 == 0:
            assert_same_bits(torch, out, dequant_reference(torch, w, s, ids))
        p.poll_check()
    assert p.check_differed() == 0
    assert p.stats()["lookups"] >= 1000
    assert_same_bits(torch, out, dequant_reference(torch, w, s, ids))
    assert p.late_rows() == 0
