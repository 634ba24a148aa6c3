"""The ops under torch's tracers, without a GPU: fake implementations check their arguments
like the real ones, and torch.compile(fullgraph=True) traces the public functions and the
prefetcher's methods into one graph each, the prefetch kept alive by its ticket."""
from __future__ import annotations

import pytest

import fetchahead


def _graphs(torch):
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        outputs = [n for n in gm.graph.nodes if n.op == "output"][0].args[0]
        return lambda *args: [torch.zeros(1)] * len(outputs)

    return graphs, backend


def test_fake_implementations_give_shapes_and_refuse_bad_input(torch):
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        w = torch.empty(64, 256, dtype=torch.uint8, device="cuda")
        s = torch.empty(64, 8, dtype=torch.uint8, device="cuda")
        ids = torch.empty(100, dtype=torch.int64, device="cuda")
        out = fetchahead.gather_dequant(w, s, ids, status=torch.empty(2, dtype=torch.int64, device="cuda"))
        assert out.shape == (100, 256) and out.dtype == torch.bfloat16
        assert fetchahead.gather(w, ids).shape == (100, 256)
        for name, call in [
            ("weights", lambda: fetchahead.gather_dequant(w.float(), s, ids)),
            ("scales", lambda: fetchahead.gather_dequant(w, s[:, :4].contiguous(), ids)),
            ("ids", lambda: fetchahead.gather_dequant(w, s, ids.int())),
            ("table", lambda: fetchahead.gather(w[:, :8].contiguous(), ids)),
            ("out", lambda: fetchahead.gather_out(w, ids, torch.empty(99, 256, dtype=torch.uint8, device="cuda"))),
        ]:
            with pytest.raises(ValueError, match=name):
                call()


def test_compiled_kernel_calls_are_one_graph_with_the_ops_in_it(torch):
    graphs, backend = _graphs(torch)
    w = torch.zeros(64, 256, dtype=torch.uint8)
    s = torch.zeros(64, 8, dtype=torch.uint8)
    ids = torch.zeros(10, dtype=torch.int64)

    def f(w, s, ids):
        return fetchahead.gather_dequant(w, s, ids) * 2, fetchahead.gather(w, ids, variant="gather_chunk16")

    torch._dynamo.reset()
    torch.compile(f, fullgraph=True, backend=backend)(w, s, ids)
    code = graphs[-1].code
    # Without a status record the calls go to the status-free ops.
    assert "fetchahead.gather_dequant_unchecked(" in code and "fetchahead.gather_unchecked(" in code


def test_a_compiled_forward_keeps_the_prefetch_before_the_gather(torch):
    from functorch.compile import make_boxed_func
    from torch._dynamo.backends.common import aot_autograd

    import fetchahead._torch as t

    class Native:
        dim = 256

    handle, ticket = t.register_prefetcher(Native(), torch.device("cpu"))
    p = fetchahead.Prefetcher.__new__(fetchahead.Prefetcher)
    p.handle, p._ticket, p._t = handle, ticket, t
    aot = []

    def fw(gm, inputs):
        aot.append(gm.code)
        outputs = [n for n in gm.graph.nodes if n.op == "output"][0].args[0]
        return make_boxed_func(lambda *args: [torch.zeros(1)] * len(outputs))

    def forward(ids, x):
        p.prefetch(ids)
        h = x * 2
        return p.gather_dequant(ids), h

    torch._dynamo.reset()
    try:
        torch.compile(forward, fullgraph=True, backend=aot_autograd(fw_compiler=fw))(
            torch.zeros(8, dtype=torch.int64), torch.ones(3)
        )
    finally:
        t.unregister_prefetcher(handle)
    code = aot[-1]
    assert code.index("fetchahead.prefetch") < code.index("fetchahead.prefetched_gather_dequant")
