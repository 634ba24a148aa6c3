"""L2Plan around a small forward's collectives: bit-identical with and without the plan,
eager and replayed from a CUDA graph."""
from __future__ import annotations

import pytest

import fetchahead

LAYERS, K, N = 4, 4096, 2048


@pytest.fixture(scope="module")
def model(torch, cuda):
    gen = torch.Generator(device=cuda).manual_seed(1)
    weights = [
        torch.randn(N, K, generator=gen, device=cuda, dtype=torch.bfloat16) / 64
        for _ in range(LAYERS)
    ]
    up = [torch.randn(K, N, generator=gen, device=cuda, dtype=torch.bfloat16) / 64 for _ in range(LAYERS)]
    return weights, up


def all_reduce(x):
    """A single-GPU stand-in for the engine's collective: reads and writes x in place."""
    x.mul_(1.0)


def forward(x, model, plan=None):
    weights, up = model
    for w, u in zip(weights, up):
        if plan is not None:
            plan.collective()
        all_reduce(x)
        if plan is not None:
            plan.consume(w)
            plan.consume(u)
        x = (x @ w.t()) @ u.t()
    return x


def test_the_forward_is_bit_identical_with_and_without_the_plan_eager_and_replayed(
    torch, cuda, model
):
    x0 = torch.randn(8, K, device=cuda, dtype=torch.bfloat16)
    want = forward(x0.clone(), model)
    plan = fetchahead.L2Plan()
    for step in range(5):
        with plan.forward(signature=8) as f:
            got = forward(x0.clone(), model, plan)
        assert torch.equal(got, want), step
        assert f.summary["collectives"] == LAYERS
    counters = plan.counters()
    assert counters["signatures"] == 1 and counters["windows_prefetched"] > 0, counters

    x = x0.clone()
    out = torch.empty_like(want)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        plan.begin_forward(8)
        out.copy_(forward(x, model, plan))
        summary = plan.end_forward()
    assert summary["captured"]
    for _ in range(10):
        x.copy_(x0)
        graph.replay()
        assert torch.equal(out, want)
    assert plan.counters()["mismatches_at_capture"] == 0


def test_begin_twice_and_collective_outside_a_forward_are_errors(torch, cuda):
    plan = fetchahead.L2Plan()
    with pytest.raises(fetchahead.Error):
        plan.collective()
    plan.begin_forward(1)
    with pytest.raises(fetchahead.Error):
        plan.begin_forward(2)
    plan.end_forward()
