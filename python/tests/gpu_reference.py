"""Torch references for the kernels, built from torch's own float8 dtypes."""
from __future__ import annotations


def dequant_reference(torch, weights, scales, ids):
    """``bf16(e4m3 * 2^(e8m0 - 127))`` of the rows ``ids``, on the CPU (no flush to zero):
    the E4M3 value and the power of two multiply exactly in float32, then round once to bf16."""
    w = weights.cpu()[ids.cpu()].contiguous().view(torch.float8_e4m3fn).float()
    s = scales.cpu()[ids.cpu()].contiguous().view(torch.float8_e8m0fnu).float()
    return (w * s.repeat_interleave(32, dim=1)).to(torch.bfloat16)


def assert_same_bits(torch, got, want):
    """Bit-equal bf16 tensors, any NaN matching any NaN."""
    got, want = got.cpu(), want.cpu()
    assert got.shape == want.shape and got.dtype == want.dtype
    nan_got, nan_want = torch.isnan(got), torch.isnan(want)
    assert torch.equal(nan_got, nan_want), "NaN positions differ"
    g = got.view(torch.int16)[~nan_got]
    w = want.view(torch.int16)[~nan_want]
    bad = (g != w).nonzero()
    assert bad.numel() == 0, f"{bad.numel()} elements differ, first at {bad[:4].tolist()}"
