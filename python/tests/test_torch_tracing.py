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
    assert "fetchahead.gather_dequant_unchecked" in code and "fetchahead.gather_unchecked" in code


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


def test_meta_tensors_go_through_the_public_functions(torch):
    # Engines build and profile models on the meta device: the public functions dispatch, so a
    # meta input reaches the fake kernel and gives the output's shape, dtype and device.
    w = torch.empty(64, 256, dtype=torch.uint8, device="meta")
    s = torch.empty(64, 8, dtype=torch.uint8, device="meta")
    ids = torch.empty(100, dtype=torch.int64, device="meta")
    status = torch.empty(2, dtype=torch.int64, device="meta")
    out = fetchahead.gather_dequant(w, s, ids)
    assert (out.shape, out.dtype, out.device.type) == ((100, 256), torch.bfloat16, "meta")
    out = fetchahead.gather_dequant(w, s, ids, status=status)
    assert out.device.type == "meta"
    raw = fetchahead.gather(w, ids)
    assert (raw.shape, raw.dtype, raw.device.type) == ((100, 256), torch.uint8, "meta")
    into = torch.empty(100, 256, dtype=torch.bfloat16, device="meta")
    assert fetchahead.gather_dequant_out(w, s, ids, into) is into
    assert fetchahead.gather_out(w, ids, torch.empty(100, 256, dtype=torch.uint8, device="meta")).device.type == "meta"
    with pytest.raises(ValueError, match="ids"):
        fetchahead.gather_dequant(w, s, ids.int())


def test_the_ops_are_library_kernels_for_cuda_with_fakes_and_no_eager_shortcut(torch):
    from torch.utils._python_dispatch import TorchDispatchMode

    for name in ("gather", "gather_dequant_unchecked", "prefetch", "finish_prefetch"):
        qualname = f"fetchahead::{name}"
        for key in ("CUDA", "Meta"):
            assert torch._C._dispatch_has_kernel_for_dispatch_key(qualname, key), (qualname, key)

    seen = []

    class Record(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            seen.append(str(func))
            return func(*args, **(kwargs or {}))

    w = torch.empty(64, 256, dtype=torch.uint8, device="meta")
    s = torch.empty(64, 8, dtype=torch.uint8, device="meta")
    ids = torch.empty(10, dtype=torch.int64, device="meta")
    with Record():
        fetchahead.gather_dequant(w, s, ids)
    assert "fetchahead.gather_dequant_unchecked.default" in seen, seen


def test_the_private_raw_stream_has_a_public_fallback(torch):
    from fetchahead import _torch as t

    class Without:  # a torch._C without the private function
        pass

    assert t.pick_raw_stream(Without()) is t._public_raw_stream
    assert t.pick_raw_stream(torch._C) is getattr(torch._C, "_cuda_getCurrentRawStream", t._public_raw_stream)
    if torch.cuda.is_available():
        index = torch.cuda.current_device()
        assert t._public_raw_stream(index) == t.pick_raw_stream(torch._C)(index)
