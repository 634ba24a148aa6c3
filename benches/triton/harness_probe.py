#!/usr/bin/env python3
"""A probe, not part of the bench: the same kernels timed in `peers.py`'s harness (a
torch.cuda.graph of 100 calls, 5 replays a sample, CUDA events) that
`benches/cuda/launch_probe.cu` times in a C++ one, so that the two harnesses' per-call figures
can be set side by side, and the Triton peers among them (issue 24 item 4).

Cases at n = 72 and 4096 (a 16M-row x 256-byte table, random int64 ids):
- the Triton gather peer at its best configs of the peers run (ROWS=4 / 8, 8 warps) and the
  Triton empty kernel;
- fetchahead's `gather_out` (the op path) and the same kernel launched raw through the driver;
- the hand-written CUDA gather of the launch probe (`probe_gather_ld`, from PTX) launched raw;
- fetchahead's `gather_empty` launched raw with the gather's grid;
- the Triton peer's own cubin launched raw through the driver, as the others are.

Timed in phases, so that what changes the figures shows: before anything of fetchahead's runs
(its PTX only loaded through the driver), after its first eager op call, after a graph of its op,
and after 3 s idle. `nvidia-smi` clocks can be logged beside it by the caller.

    nvcc -ptx -O3 -arch=sm_90 -std=c++17 benches/cuda/launch_probe.cu -o /tmp/lp.ptx
    python3 benches/triton/harness_probe.py FETCHAHEAD_PTX /tmp/lp.ptx [--dump DIR]

`--dump DIR` writes the Triton peer's PTX for each config.
"""
from __future__ import annotations

import argparse
import ctypes
import os
import statistics
import struct
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import peers  # noqa: E402
import torch  # noqa: E402
import triton  # noqa: E402

cuda = ctypes.CDLL("libcuda.so.1")


def check(rc: int, what: str) -> None:
    if rc != 0:
        raise RuntimeError(f"{what}: CUresult {rc}")


def function(image: bytes, name: bytes) -> ctypes.c_void_p:
    """Kernel `name` of a module image: a cubin, or PTX text ending in a NUL."""
    module, fn = ctypes.c_void_p(), ctypes.c_void_p()
    check(cuda.cuModuleLoadData(ctypes.byref(module), ctypes.c_char_p(image)), "load")
    check(cuda.cuModuleGetFunction(ctypes.byref(fn), module, name), name.decode())
    return fn


def raw_launch(fn, grid: int, threads: int, values: list, shared: int = 0):
    """A closure launching `fn` raw on torch's current stream, each of `values` (ctypes objects:
    scalars, or a buffer holding a parameter struct) passed as one argument."""
    args = (ctypes.c_void_p * len(values))(*[ctypes.addressof(v) for v in values])

    def launch():
        stream = ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)
        check(cuda.cuLaunchKernel(fn, grid, 1, 1, threads, 1, 1, shared, stream, args, None), "launch")

    launch.keep = (values, args)  # alive as long as the closure
    return launch


def struct_arg(params: bytes) -> ctypes.Array:
    """A parameter struct's bytes as one kernel argument."""
    return ctypes.create_string_buffer(params, len(params))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("fetchahead_ptx")
    ap.add_argument("probe_ptx")
    ap.add_argument("--dump", help="write the Triton peer's PTX here")
    ap.add_argument("--reps", type=int, default=11)
    a = ap.parse_args()
    torch.cuda.init()
    dev = torch.device("cuda")
    torch.empty(1, device=dev)  # torch's context current on this thread
    rows = 16 << 20
    table = torch.randint(0, 256, (rows, 256), dtype=torch.uint8, device=dev)
    fa_ptx = open(a.fetchahead_ptx, "rb").read() + b"\0"
    probe_ptx = open(a.probe_ptx, "rb").read() + b"\0"
    fa_gather = function(fa_ptx, b"gather_chunk16_nohint")
    fa_empty = function(fa_ptx, b"gather_empty")
    cuda_ld = function(probe_ptx, b"probe_gather_ld")
    status = torch.tensor([0, -1], dtype=torch.int64, device=dev)
    x = torch.zeros(1, device=dev)
    sizes = {}
    for n, peer_rows in ((72, 4), (4096, 8)):
        gen = torch.Generator(device=dev).manual_seed(7)
        ids = torch.randint(0, rows, (n,), device=dev, generator=gen)
        out = torch.empty((n, 256), dtype=torch.uint8, device=dev)
        blocks = (n * 16 + 255) // 256
        # fetchahead's GatherParams (gpu/src/params.rs), timeline off; the probe's Params.
        fa_params = struct.pack(
            "<QQQQQIIQQII", table.data_ptr(), ids.data_ptr(), out.data_ptr(), n, rows,
            256, 0, status.data_ptr(), 0, 0, 0xFFFFFFFF,
        )
        probe_params = struct.pack("<QQQQQ", table.data_ptr(), ids.data_ptr(), out.data_ptr(), n, rows)
        grid = (triton.cdiv(n, peer_rows),)

        def peer(grid=grid, ids=ids, out=out, n=n, peer_rows=peer_rows):
            return peers.gather_peer[grid](table, ids, out, n, ROW_BYTES=256, ROWS=peer_rows, num_warps=8)

        compiled = peer()
        cubin_fn = function(compiled.asm["cubin"], compiled.metadata.name.encode())
        values = [ctypes.c_uint64(table.data_ptr()), ctypes.c_uint64(ids.data_ptr()),
                  ctypes.c_uint64(out.data_ptr()), ctypes.c_uint32(n), ctypes.c_uint64(0),
                  ctypes.c_uint64(0)]
        cases = {
            f"Triton gather peer (ROWS={peer_rows}, 8 warps)": peer,
            "the same Triton cubin, raw launch": raw_launch(
                cubin_fn, grid[0], 256, values, compiled.metadata.shared),
            "Triton empty kernel": lambda: peers.empty_kernel[(1,)](x),
            "fetchahead gather_chunk16_nohint, raw launch": raw_launch(fa_gather, blocks, 256, [struct_arg(fa_params)]),
            "CUDA probe_gather_ld (from PTX), raw launch": raw_launch(cuda_ld, blocks, 256, [struct_arg(probe_params)]),
            "fetchahead gather_empty, raw launch": raw_launch(fa_empty, blocks, 256, [struct_arg(fa_params)]),
        }
        want = table[ids]
        for what, fn in cases.items():
            if "empty" in what:
                continue
            out.zero_()
            fn()
            torch.cuda.synchronize()
            if not torch.equal(out, want):
                raise SystemExit(f"n={n}: {what} gathered wrong rows")
        sizes[n] = (cases, table, ids, out)
        if a.dump:
            os.makedirs(a.dump, exist_ok=True)
            with open(os.path.join(a.dump, f"gather_peer_rows{peer_rows}_w8.ptx"), "w") as f:
                f.write(compiled.asm["ptx"])

    def phase(what: str) -> None:
        for n, (cases, *_rest) in sizes.items():
            for case, fn in cases.items():
                us = [peers.median_us(fn, n, a.reps)["us"] for _ in range(2)]
                print(f"[{what}] n={n:<5} {case:<48} {min(us):.3f} us a call ({', '.join(f'{u:.3f}' for u in us)})", flush=True)

    phase("0: before fetchahead")
    phase("0b: the same again")
    import fetchahead

    for n, (cases, table_, ids_, out_) in sizes.items():
        fetchahead.gather_out(table_, ids_, out_)
        torch.cuda.synchronize()
    phase("1: after fetchahead's first eager call")
    for n, (cases, table_, ids_, out_) in sizes.items():
        cases["fetchahead gather_out (op path)"] = (
            lambda t=table_, i=ids_, o=out_: fetchahead.gather_out(t, i, o))
    phase("2: with fetchahead's op in graphs")
    time.sleep(3)
    phase("3: after 3 s idle")
    return 0


if __name__ == "__main__":
    sys.exit(main())
