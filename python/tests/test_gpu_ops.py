"""The kernel ops on the GPU: references, validation, opcheck, torch.compile, CUDA graphs."""
from __future__ import annotations

import pytest

import fetchahead
from gpu_reference import assert_same_bits, dequant_reference

DIM = 256


@pytest.fixture(scope="module")
def mx(torch, cuda):
    """An MXFP8 table whose rows hold every E4M3 byte, with the edge scales among the blocks."""
    rows = 64
    gen = torch.Generator().manual_seed(11)
    weights = torch.empty((rows, DIM), dtype=torch.uint8)
    for r in range(rows):
        weights[r] = torch.roll(torch.arange(256, dtype=torch.int32), r).to(torch.uint8)
    edges = torch.tensor([0, 1, 2, 120, 126, 127, 128, 134, 250, 253, 254, 255], dtype=torch.uint8)
    scales = torch.randint(110, 145, (rows, DIM // 32), generator=gen, dtype=torch.uint8)
    flat = scales.view(-1)
    flat[: edges.numel() * 3] = edges.repeat(3)
    return weights.to(cuda), scales.to(cuda)


def ids_for(torch, cuda, n, rows, seed=3):
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, rows, (n,), generator=gen, dtype=torch.int64).to(cuda)


@pytest.mark.parametrize("variant", [name for name, _ in fetchahead.variants()["gather_dequant"]])
def test_gather_dequant_equals_the_float8_reference_on_every_byte_and_edge_scale(
    torch, cuda, mx, variant
):
    weights, scales = mx
    ids = torch.arange(weights.shape[0], device=cuda).flip(0).contiguous()
    out = fetchahead.gather_dequant(weights, scales, ids, variant=variant)
    assert out.dtype == torch.bfloat16 and out.shape == (ids.numel(), DIM)
    assert_same_bits(torch, out, dequant_reference(torch, weights, scales, ids))
    typed = fetchahead.gather_dequant(
        weights.view(torch.float8_e4m3fn), scales.view(torch.float8_e8m0fnu), ids, variant=variant
    )
    assert torch.equal(typed.view(torch.int16), out.view(torch.int16))


@pytest.mark.parametrize("variant", [name for name, _ in fetchahead.variants()["gather"]])
def test_gather_equals_index_select(torch, cuda, variant):
    table = torch.randint(0, 256, (500, 256), dtype=torch.uint8, device=cuda)
    ids = ids_for(torch, cuda, 1000, 500)
    out = fetchahead.gather(table, ids, variant=variant)
    assert torch.equal(out, table[ids])


def test_a_pinned_host_table_is_read_zero_copy(torch, cuda, mx):
    weights, scales = mx
    hw, hs = weights.cpu().pin_memory(), scales.cpu().pin_memory()
    ids = ids_for(torch, cuda, 300, weights.shape[0])
    out = fetchahead.gather_dequant(hw, hs, ids)
    assert_same_bits(torch, out, dequant_reference(torch, weights, scales, ids))
    table = torch.randint(0, 256, (100, 64), dtype=torch.uint8).pin_memory()
    ids = ids_for(torch, cuda, 50, 100)
    assert torch.equal(fetchahead.gather(table, ids).cpu(), table[ids.cpu()])


def test_out_forms_write_the_callers_tensor(torch, cuda, mx):
    weights, scales = mx
    ids = ids_for(torch, cuda, 77, weights.shape[0])
    out = torch.full((77, DIM), float("nan"), dtype=torch.bfloat16, device=cuda)
    assert fetchahead.gather_dequant_out(weights, scales, ids, out) is out
    assert_same_bits(torch, out, dequant_reference(torch, weights, scales, ids))
    table = torch.randn(40, 32, device=cuda)
    rows = torch.full((77, 32), float("nan"), device=cuda)
    fetchahead.gather_out(table, ids % 40, rows)
    assert torch.equal(rows, table[ids % 40])


def test_no_ids_give_an_empty_output_in_every_form(torch, cuda, mx):
    weights, scales = mx
    none = torch.empty(0, dtype=torch.int64, device=cuda)
    assert fetchahead.gather_dequant(weights, scales, none).shape == (0, DIM)
    assert fetchahead.gather(weights, none).shape == (0, DIM)
    out = torch.empty((0, DIM), dtype=torch.bfloat16, device=cuda)
    assert fetchahead.gather_dequant_out(weights, scales, none, out) is out
    status = fetchahead.IdStatus()
    assert fetchahead.gather_dequant(weights, scales, none, status=status).shape == (0, DIM)
    torch.cuda.synchronize()


def test_bad_ids_write_zero_rows_and_are_counted_in_the_status(torch, cuda, mx):
    weights, scales = mx
    status = fetchahead.IdStatus(cuda)
    ids = torch.tensor([0, 1, 999, 2, -5], device=cuda)
    out = fetchahead.gather_dequant(weights, scales, ids, status=status)
    assert status.read() == (2, 2)
    assert (out[2] == 0).all() and (out[4] == 0).all()
    with pytest.raises(fetchahead.IdsOutOfRangeError):
        status.check(rows=weights.shape[0])
    assert status.read() == (0, None)
    fetchahead.gather(weights, ids, status=status.tensor)
    assert status.read()[0] == 2


def test_bad_input_is_a_value_error_naming_the_argument(torch, cuda, mx):
    weights, scales = mx
    ids = ids_for(torch, cuda, 8, weights.shape[0])
    cases = [
        ("ids", lambda: fetchahead.gather_dequant(weights, scales, ids.int())),
        ("ids", lambda: fetchahead.gather_dequant(weights, scales, ids.view(2, 4))),
        ("ids", lambda: fetchahead.gather_dequant(weights, scales, ids.cpu())),
        ("ids", lambda: fetchahead.gather_dequant(weights, scales, ids[::2])),
        ("weights", lambda: fetchahead.gather_dequant(weights.float(), scales, ids)),
        ("weights", lambda: fetchahead.gather_dequant(weights[:, :48].contiguous(), scales[:, :1].contiguous(), ids)),
        ("weights", lambda: fetchahead.gather_dequant(weights.t(), scales, ids)),
        ("weights", lambda: fetchahead.gather_dequant(weights.cpu(), scales, ids)),
        ("scales", lambda: fetchahead.gather_dequant(weights, scales[:, :4].contiguous(), ids)),
        ("scales", lambda: fetchahead.gather_dequant(weights, scales.float(), ids)),
        ("table", lambda: fetchahead.gather(weights[:, :8].contiguous(), ids)),
        ("table", lambda: fetchahead.gather(weights.view(-1)[1:].view(-1)[: 63 * 256].view(63, 256), ids)),
        ("out", lambda: fetchahead.gather_dequant_out(weights, scales, ids, torch.empty(8, DIM, device=cuda))),
        ("out", lambda: fetchahead.gather_dequant_out(weights, scales, ids, torch.empty(9, DIM, dtype=torch.bfloat16, device=cuda))),
        # What the hot path (`_dequant_fast`, `_gather_fast`) hands to the full checks.
        ("out", lambda: fetchahead.gather_dequant_out(weights, scales, ids, torch.empty(8 * DIM + 1, dtype=torch.bfloat16, device=cuda)[1:].view(8, DIM))),
        ("out", lambda: fetchahead.gather_dequant_out(weights, scales, ids, torch.empty(DIM, 8, dtype=torch.bfloat16, device=cuda).t())),
        ("out", lambda: fetchahead.gather_out(weights, ids, torch.empty(8, DIM, dtype=torch.int8, device=cuda))),
        ("out", lambda: fetchahead.gather_out(weights, ids, torch.empty(8, DIM + 16, dtype=torch.uint8, device=cuda))),
        ("table", lambda: fetchahead.gather(weights.t(), ids)),
        ("status", lambda: fetchahead.gather(weights, ids, status=torch.zeros(3, dtype=torch.int64, device=cuda))),
        ("variant", lambda: fetchahead.gather(weights, ids, variant="gather_nope")),
    ]
    for name, call in cases:
        with pytest.raises(ValueError, match=name):
            call()
    torch.cuda.synchronize()


def test_opcheck_passes_for_every_kernel_op(torch, cuda, mx):
    weights, scales = mx
    # opcheck compares eager and traced outputs with assert_close, for which NaN != NaN: the
    # dequant ops get a table without NaN codes (the bits of every code are checked above).
    weights = torch.where(weights & 0x7F == 0x7F, weights ^ 1, weights)
    scales = scales.clamp(max=254)
    ids = ids_for(torch, cuda, 64, weights.shape[0])
    status = fetchahead.IdStatus(cuda).tensor
    g, gd = "gather_chunk16", None  # a named variant and the arch's default
    ops = torch.ops.fetchahead
    out = torch.empty((64, DIM), dtype=torch.bfloat16, device=cuda)
    rows = torch.empty((64, DIM), dtype=torch.uint8, device=cuda)
    torch.library.opcheck(ops.gather.default, (weights, ids, status, g))
    torch.library.opcheck(ops.gather.default, (weights, ids, None, g))
    torch.library.opcheck(ops.gather_out.default, (weights, ids, rows, status, g))
    torch.library.opcheck(ops.gather_dequant.default, (weights, scales, ids, status, gd))
    torch.library.opcheck(ops.gather_dequant.default, (weights, scales, ids, None, gd))
    torch.library.opcheck(ops.gather_dequant_out.default, (weights, scales, ids, out, status, gd))
    torch.library.opcheck(ops.gather_unchecked.default, (weights, ids, g))
    torch.library.opcheck(ops.gather_out_unchecked.default, (weights, ids, rows, g))
    torch.library.opcheck(ops.gather_dequant_unchecked.default, (weights, scales, ids, gd))
    torch.library.opcheck(ops.gather_dequant_out_unchecked.default, (weights, scales, ids, out, gd))


def test_a_compiled_function_has_no_graph_break_and_the_same_bits(torch, cuda, mx):
    weights, scales = mx
    table = torch.randint(0, 256, (64, 128), dtype=torch.uint8, device=cuda)

    def f(ids):
        rows = fetchahead.gather_dequant(weights, scales, ids)
        raw = fetchahead.gather(table, ids)
        return rows * 2, raw

    ids = ids_for(torch, cuda, 100, weights.shape[0])
    eager = f(ids)
    torch._dynamo.reset()
    compiled = torch.compile(f, fullgraph=True)
    got = compiled(ids)
    assert torch.equal(got[0].view(torch.int16), eager[0].view(torch.int16))
    assert torch.equal(got[1], eager[1])
    explained = torch._dynamo.explain(f)(ids)
    assert explained.graph_break_count == 0
    other = ids_for(torch, cuda, 100, weights.shape[0], seed=9)
    assert torch.equal(compiled(other)[1], f(other)[1])

    # The same with a status record and the _out forms, whose ops mutate their arguments.
    status = fetchahead.IdStatus(cuda)
    out = torch.empty((100, DIM), dtype=torch.bfloat16, device=cuda)

    def g(ids):
        fetchahead.gather_dequant_out(weights, scales, ids, out, status=status)
        return fetchahead.gather(table, ids, status=status), out * 2

    want = g(ids)
    want = (want[0].clone(), want[1].clone())
    torch._dynamo.reset()
    got = torch.compile(g, fullgraph=True)(ids)
    assert torch.equal(got[0], want[0])
    assert torch.equal(got[1].view(torch.int16), want[1].view(torch.int16))


def test_the_ops_replay_in_a_cuda_graph(torch, cuda, mx):
    weights, scales = mx
    ids = ids_for(torch, cuda, 128, weights.shape[0])
    out = torch.empty((128, DIM), dtype=torch.bfloat16, device=cuda)
    fetchahead.gather_dequant_out(weights, scales, ids, out)  # warm-up outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fetchahead.gather_dequant_out(weights, scales, ids, out)
        allocated = fetchahead.gather_dequant(weights, scales, ids)
    for seed in range(5):
        ids.copy_(ids_for(torch, cuda, 128, weights.shape[0], seed=seed))
        graph.replay()
        want = dequant_reference(torch, weights, scales, ids)
        assert_same_bits(torch, out, want)
        assert_same_bits(torch, allocated, want)


NATIVE = {
    "gather_unchecked", "gather_out_unchecked", "gather_dequant_unchecked",
    "gather_dequant_out_unchecked", "prefetch", "prefetched_gather_dequant",
    "prefetched_gather_dequant_out",
}


def test_the_hot_ops_have_native_cuda_kernels_on_a_torch_with_the_stable_abi(torch, cuda):
    from fetchahead import _torch as t

    major, minor = (int(x) for x in torch.__version__.split(".")[:2])
    if (major, minor) < (2, 10):
        assert t.NATIVE_OPS == frozenset() and t.NATIVE_OFF
        return
    assert t.NATIVE_OPS == NATIVE, t.NATIVE_OFF
    assert fetchahead.show_config(print_it=False)["torch_ops"]["native"] == sorted(NATIVE)


def test_a_native_refusal_is_torchs_runtime_error_and_the_public_functions_own_class(torch, cuda, mx):
    weights, scales = mx
    ids = ids_for(torch, cuda, 8, weights.shape[0])
    out = torch.empty((8, DIM), dtype=torch.bfloat16, device=cuda)
    ops = torch.ops.fetchahead
    # Through the dispatcher alone: torch's translation of the kernel's refusal, its message.
    with pytest.raises(RuntimeError, match="invalid ids"):
        ops.gather_dequant_out_unchecked.default(weights, scales, ids.int(), out, None)
    with pytest.raises(RuntimeError, match="invalid out"):
        ops.gather_out_unchecked.default(weights, ids, out, None)
    with pytest.raises(RuntimeError, match="variant"):
        ops.gather_unchecked.default(weights, ids, "gather_nope")
    # The public functions: fetchahead's class with the argument named, every time (nothing
    # kept from a refusal leaks into the next call).
    for _ in range(2):
        with pytest.raises(fetchahead.InvalidArgumentError, match="ids") as e:
            fetchahead.gather_dequant_out(weights, scales, ids.int(), out)
        assert e.value.argument == "ids"
    with pytest.raises(fetchahead.InvalidArgumentError, match="variant"):
        fetchahead.gather(weights, ids, variant="gather_dequant_u8_packed")
    # A named variant reaches the native kernel and gives the default's bits.
    named = fetchahead.gather_dequant(weights, scales, ids, variant="gather_dequant_u8_packed")
    assert torch.equal(named.view(torch.int16), fetchahead.gather_dequant(weights, scales, ids).view(torch.int16))
    torch.cuda.synchronize()


def test_the_python_kernels_serve_with_the_native_ones_off(torch, cuda):
    import subprocess
    import sys

    code = (
        "import torch, fetchahead\n"
        "from fetchahead import _torch as t\n"
        "assert t.NATIVE_OPS == frozenset() and t.NATIVE_OFF == 'FETCHAHEAD_TORCH_NATIVE=0'\n"
        "table = torch.randint(0, 256, (50, 64), dtype=torch.uint8, device='cuda')\n"
        "ids = torch.randint(0, 50, (30,), device='cuda')\n"
        "assert torch.equal(fetchahead.gather(table, ids), table[ids])\n"
        "try:\n"
        "    torch.ops.fetchahead.gather_unchecked.default(table, ids.int(), None)\n"
        "except fetchahead.InvalidArgumentError:\n"
        "    print('python kernels')\n"
    )
    env = dict(__import__("os").environ, FETCHAHEAD_TORCH_NATIVE="0")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "python kernels"
