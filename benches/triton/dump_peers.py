"""Compiles the Triton peers of `peers.py` for one arch and writes each one's cubin and PTX, for
the CUDA C++ harness in `benches/cuda/module_probe.cu` (issue 24 item 4). Needs Triton, not a GPU.

    python3 benches/triton/dump_peers.py OUT_DIR [--arch 90]

Writes `gather_r{ROWS}w{WARPS}` and `dequant_r{ROWS}w{WARPS}` `.cubin` and `.ptx` for the
configs `peers.py` picked at 72 and 4096 rows on the H200 (2026-12-07): the gather at ROWS = 4
with 4 warps and ROWS = 16 with 8, the dequant at ROWS = 4 and 8 with 8 warps. Every pointer is
declared 16-byte aligned, as Triton specializes the peers' tensors at run time."""

import argparse
import os
import sys

from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource, compile as triton_compile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import peers  # noqa: E402  (its kernels; nothing runs on import)

GATHER = {"table": "*u8", "ids": "*i64", "out": "*u8", "n": "i32"}
DEQUANT = {"w": "*u8", "s": "*u8", "ids": "*i64", "out": "*bf16", "n": "i32"}
BUILDS = [
    ("gather", peers.gather_peer, GATHER, "ROW_BYTES", 4, 4),
    ("gather", peers.gather_peer, GATHER, "ROW_BYTES", 16, 8),
    ("dequant", peers.dequant_peer, DEQUANT, "DIM", 4, 8),
    ("dequant", peers.dequant_peer, DEQUANT, "DIM", 8, 8),
]


def compile_peer(fn, sig: dict, constexprs: dict, warps: int, target: GPUTarget):
    """`fn` compiled for `target` with `sig`'s pointers declared 16-byte aligned, as Triton
    specializes the peers' tensors at run time."""
    aligned = {(i,): [["tt.divisibility", 16]] for i, t in enumerate(sig.values())
               if t.startswith("*")}
    src = ASTSource(fn, signature=sig, constexprs=constexprs, attrs=aligned)
    return triton_compile(src, target=target, options={"num_warps": warps})


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out")
    ap.add_argument("--arch", type=int, default=90)
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    target = GPUTarget("cuda", a.arch, 32)
    for family, fn, sig, width, rows, warps in BUILDS:
        built = compile_peer(fn, sig, {width: 256, "ROWS": rows}, warps, target)
        if built.metadata.shared:
            # module_probe.cu launches the peers without dynamic shared memory.
            raise SystemExit(f"{family} ROWS={rows} warps={warps} needs "
                             f"{built.metadata.shared} B of shared memory")
        stem = os.path.join(a.out, f"{family}_r{rows}w{warps}")
        with open(stem + ".cubin", "wb") as f:
            f.write(built.asm["cubin"])
        with open(stem + ".ptx", "w") as f:
            f.write(built.asm["ptx"])
        print(f"{stem}: {built.metadata.num_warps} warps, {built.metadata.shared} B shared")
    return 0


if __name__ == "__main__":
    sys.exit(main())
