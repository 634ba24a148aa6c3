"""A short gather + MXFP8 dequant in Triton, as a user would write it: the peer of the crate's
fused kernel (issue: "a short kernel a user could write"). Times it on a 4 GiB table of random
bytes with 4 Mi random ids against torch's device-to-device copy of the same table bytes, and
writes its PTX to $OUT (or /tmp) so that its loads and stores can be read.

    python3 benches/triton/dequant_peer.py
"""
import os

import torch
import triton
import triton.language as tl


@triton.jit
def gather_dequant(w, s, ids, out, n, BLOCK: tl.constexpr, DIM: tl.constexpr):
    rows = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    keep = rows < n
    row = tl.load(ids + rows, mask=keep, other=0)
    cols = tl.arange(0, DIM)
    x = tl.load(w + row[:, None] * DIM + cols[None, :], mask=keep[:, None])
    e = tl.load(s + row[:, None] * (DIM // 32) + cols[None, :] // 32, mask=keep[:, None])
    x = x.to(tl.float8e4nv, bitcast=True).to(tl.float32)
    scale = tl.exp2(e.to(tl.float32) - 127.0)
    tl.store(out + rows[:, None] * DIM + cols[None, :], (x * scale).to(tl.bfloat16), mask=keep[:, None])


def main():
    dim, rows, n = 256, (4 << 30) // 256, 4 << 20
    g = torch.Generator(device="cuda").manual_seed(7)
    w = torch.randint(0, 256, (rows, dim), dtype=torch.uint8, device="cuda", generator=g)
    s = torch.randint(0, 256, (rows, dim // 32), dtype=torch.uint8, device="cuda", generator=g)
    ids = torch.randint(0, rows, (n,), dtype=torch.int64, device="cuda", generator=g)
    out = torch.empty((n, dim), dtype=torch.bfloat16, device="cuda")
    src = torch.empty(n * dim, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    copy_ms = triton.testing.do_bench(lambda: dst.copy_(src), warmup=50, rep=300, return_mode="median")
    copy_bw = 2 * n * dim / copy_ms / 1e6
    counted = n * (dim + dim // 32 + 2 * dim + 8)
    best = None
    for block in (8, 16, 32, 64):
        for warps in (4, 8):
            launch = lambda: gather_dequant[(triton.cdiv(n, block),)](w, s, ids, out, n, BLOCK=block, DIM=dim, num_warps=warps)
            ms = triton.testing.do_bench(launch, warmup=50, rep=300, return_mode="median")
            ratio = counted / ms / 1e6 / copy_bw
            print(f"triton BLOCK={block:3} warps={warps}: {ms * 1e3:8.1f} us  {ratio:.3f} x copy")
            if best is None or ms < best[0]:
                best = (ms, block, warps)
    print(f"copy {copy_bw:.1f} GB/s; best triton {best[0] * 1e3:.1f} us (BLOCK={best[1]}, warps={best[2]})")
    kernel = gather_dequant[(1,)](w, s, ids, out, n, BLOCK=best[1], DIM=dim, num_warps=best[2])
    path = os.path.join(os.environ.get("OUT", "/tmp"), "triton_dequant.ptx")
    with open(path, "w") as f:
        f.write(kernel.asm["ptx"])
    print("ptx:", path)


if __name__ == "__main__":
    main()
