"""Compiles the Triton peers of `peers.py` at every tile config, and the same kernels with
fetchahead's contract added (each id checked against the table, a bad id's row written as zeros
and, with RECORD, counted and its first index kept), for `benches/cuda/ladder_probe.cu` (issue 24
item 4): what of the gap to the peer at decode sizes is the contract, and what the shape. Needs
Triton, not a GPU (nor torch: `peers.py`'s kernels are read without its tables).

    python3 benches/triton/ladder_peers.py OUT_DIR [--arch 90]

Writes `NAME.cubin` for each build and `OUT_DIR/ladder.txt`, a line a build: the file's stem,
its family (gather or dequant), its argument list (`plain`: the peer's; `checked`: rows and a
status pointer after n), ROWS, the warps, the kernel's name and the shared memory its launch
must give it (Triton stages some dequant tiles' layout changes there: 1-4 KiB at 2 or 4
warps)."""

import argparse
import os
import sys
import types

from triton.backends.compiler import GPUTarget
import triton
import triton.language as tl

sys.modules.setdefault("torch", types.SimpleNamespace(Generator=object))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import peers  # noqa: E402  (its kernels; nothing runs on import)
from dump_peers import compile_peer  # noqa: E402


@triton.jit(do_not_specialize=["n", "rows"])
def gather_checked(table, ids, out, n, rows, status, ROW_BYTES: tl.constexpr,
                   ROWS: tl.constexpr, RECORD: tl.constexpr):
    """`gather_peer` with each id checked: a row outside the table is written as zeros."""
    i = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    keep = i < n
    row = tl.load(ids + i, mask=keep, other=0)
    found = keep & (row >= 0) & (row < rows)
    cols = tl.arange(0, ROW_BYTES)
    x = tl.load(table + row[:, None] * ROW_BYTES + cols[None, :], mask=found[:, None], other=0)
    tl.store(out + i[:, None] * ROW_BYTES + cols[None, :], x, mask=keep[:, None])
    if RECORD:
        bad = keep & ~found
        tl.atomic_add(status + i * 0, 1, mask=bad, sem="relaxed")
        tl.atomic_min(status + 1 + i * 0, i.to(tl.int64), mask=bad, sem="relaxed")


@triton.jit(do_not_specialize=["n", "rows"])
def dequant_checked(w, s, ids, out, n, rows, status, DIM: tl.constexpr, ROWS: tl.constexpr,
                    RECORD: tl.constexpr):
    """`dequant_peer` with each id checked: a row outside the table is written as zeros."""
    i = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    keep = i < n
    row = tl.load(ids + i, mask=keep, other=0)
    found = keep & (row >= 0) & (row < rows)
    cols = tl.arange(0, DIM)
    blocks = tl.arange(0, DIM // 32)
    x = tl.load(w + row[:, None] * DIM + cols[None, :], mask=found[:, None], other=0)
    e = tl.load(s + row[:, None] * (DIM // 32) + blocks[None, :], mask=found[:, None], other=0)
    f = x.to(tl.float8e4nv, bitcast=True).to(tl.float32)
    scale = (e.to(tl.uint32) << 23).to(tl.float32, bitcast=True)
    y = tl.reshape(f, (ROWS, DIM // 32, 32)) * scale[:, :, None]
    y = tl.reshape(y, (ROWS, DIM))
    tl.store(out + i[:, None] * DIM + cols[None, :], y.to(tl.bfloat16), mask=keep[:, None])
    if RECORD:
        bad = keep & ~found
        tl.atomic_add(status + i * 0, 1, mask=bad, sem="relaxed")
        tl.atomic_min(status + 1 + i * 0, i.to(tl.int64), mask=bad, sem="relaxed")


GATHER = {"table": "*u8", "ids": "*i64", "out": "*u8", "n": "i32"}
DEQUANT = {"w": "*u8", "s": "*u8", "ids": "*i64", "out": "*bf16", "n": "i32"}
CHECKED = {"rows": "i64", "status": "*i64"}
# (family, args, kernel, signature, row-width constexpr, extra constexprs)
KERNELS = [
    ("gather", "plain", peers.gather_peer, GATHER, "ROW_BYTES", {}),
    ("gather", "checked", gather_checked, {**GATHER, **CHECKED}, "ROW_BYTES", {"RECORD": 0}),
    ("gather", "recorded", gather_checked, {**GATHER, **CHECKED}, "ROW_BYTES", {"RECORD": 1}),
    ("dequant", "plain", peers.dequant_peer, DEQUANT, "DIM", {}),
    ("dequant", "checked", dequant_checked, {**DEQUANT, **CHECKED}, "DIM", {"RECORD": 0}),
    ("dequant", "recorded", dequant_checked, {**DEQUANT, **CHECKED}, "DIM", {"RECORD": 1}),
]
# The peers' configs that a decode size can pick (peers.py's CONFIGS without ROWS 32).
CONFIGS = [(rows, warps) for rows in (4, 8, 16) for warps in (2, 4, 8)]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out")
    ap.add_argument("--arch", type=int, default=90)
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    target = GPUTarget("cuda", a.arch, 32)
    lines = []
    for family, args, fn, sig, width, extra in KERNELS:
        for rows, warps in CONFIGS:
            built = compile_peer(fn, sig, {width: 256, "ROWS": rows, **extra}, warps, target)
            stem = f"{family}_{args}_r{rows}w{warps}"
            with open(os.path.join(a.out, stem + ".cubin"), "wb") as f:
                f.write(built.asm["cubin"])
            meta = built.metadata
            lines.append(f"{stem} {family} {args} {rows} {warps} {meta.name} {meta.shared}")
    with open(os.path.join(a.out, "ladder.txt"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print(f"{len(lines)} builds in {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
