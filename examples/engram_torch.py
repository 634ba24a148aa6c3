#!/usr/bin/env python3
"""fetchahead's C ABI from PyTorch: ctypes and torch, nothing else.

Opens an in-memory table, creates a prefetcher, and for a few steps prefetches and gathers
random ids eagerly and replayed from a torch.cuda.graph (new ids written into the captured ids
tensor before each replay), each time against a torch reference built with float8_e4m3fn and
float8_e8m0fnu. Then it checks the check-mode counter, an injected lookup failure (reported
with its ids, rows zeroed, then the synchronous fallback), and fetchahead_lookup enqueued by the
caller with cuLaunchHostFunc.

    python3 examples/engram_torch.py [path/to/libfetchahead.so]

The library defaults to $FETCHAHEAD_LIB, else target/release/libfetchahead.so next to this
folder. Exits 0 when every check passes.
"""
import ctypes
import os
import sys

import torch

ROWS, DIM, CAPACITY, SEED = 1 << 16, 256, 2048, 20240611

OK = 0
ERR_LOOKUP = 4
FAULT_NONE, FAULT_FAIL_ON_ID, FAULT_FAIL_NEXT = 0, 1, 2
MESSAGE_BYTES = 256


class Work(ctypes.Structure):
    _fields_ = [
        ("table", ctypes.c_void_p),
        ("ids", ctypes.c_void_p),
        ("weights", ctypes.c_void_p),
        ("scales", ctypes.c_void_p),
        ("count", ctypes.c_uint64),
        ("status", ctypes.c_int32),
    ]


class Config(ctypes.Structure):
    _fields_ = [
        ("capacity", ctypes.c_uint64),
        ("variant", ctypes.c_char_p),
        ("check", ctypes.c_uint32),
        ("fallback_on_error", ctypes.c_uint32),
        ("completion", ctypes.c_uint32),
        ("check_log_ms", ctypes.c_uint32),
        ("_reserved", ctypes.c_uint32),
    ]


class Counters(ctypes.Structure):
    _fields_ = [
        ("prefetches", ctypes.c_uint64),
        ("gathers", ctypes.c_uint64),
        ("sync_gathers", ctypes.c_uint64),
        ("lookups", ctypes.c_uint64),
        ("rows_looked_up", ctypes.c_uint64),
        ("lookup_errors", ctypes.c_uint64),
        ("fell_back", ctypes.c_uint32),
        ("check_differed", ctypes.c_int32),
    ]


class LookupError_(ctypes.Structure):
    _fields_ = [
        ("id_count", ctypes.c_uint64),
        ("ids_offset", ctypes.c_uint64),
        ("ids_copied", ctypes.c_uint64),
        ("message", ctypes.c_char * MESSAGE_BYTES),
    ]


def load_library():
    here = os.path.dirname(os.path.abspath(__file__))
    default = os.path.join(here, "..", "target", "release", "libfetchahead.so")
    path = sys.argv[1] if len(sys.argv) > 1 else os.environ.get("FETCHAHEAD_LIB", default)
    lib = ctypes.CDLL(path)
    p, u32, u64, i32, i64 = ctypes.c_void_p, ctypes.c_uint32, ctypes.c_uint64, ctypes.c_int32, ctypes.c_int64
    sigs = {
        "fetchahead_last_error": (ctypes.c_size_t, [ctypes.c_char_p, ctypes.c_size_t]),
        "fetchahead_open_memory_table": (ctypes.c_int, [u64, u32, u64, ctypes.POINTER(p)]),
        "fetchahead_table_inject": (ctypes.c_int, [p, u32, i64]),
        "fetchahead_table_close": (None, [p]),
        "fetchahead_lookup": (None, [p]),
        "fetchahead_prefetcher_create": (ctypes.c_int, [p, i32, ctypes.POINTER(Config), ctypes.POINTER(p)]),
        "fetchahead_prefetcher_warm": (ctypes.c_int, [p]),
        "fetchahead_prefetch": (ctypes.c_int, [p, p, u64, p]),
        "fetchahead_gather_dequant": (ctypes.c_int, [p, p, p]),
        "fetchahead_read_counters": (ctypes.c_int, [p, ctypes.POINTER(Counters)]),
        "fetchahead_take_errors": (
            ctypes.c_int,
            [p, ctypes.POINTER(LookupError_), u32, p, u64, ctypes.POINTER(u32)],
        ),
        "fetchahead_prefetcher_resume": (ctypes.c_int, [p]),
        "fetchahead_prefetcher_close": (None, [p]),
    }
    for name, (res, args) in sigs.items():
        fn = getattr(lib, name)
        fn.restype, fn.argtypes = res, args
    return lib


LIB = load_library()


def check(rc, what):
    if rc != OK:
        buf = ctypes.create_string_buffer(1024)
        LIB.fetchahead_last_error(buf, len(buf))
        raise RuntimeError(f"{what} failed ({rc}): {buf.value.decode()}")


def stream():
    return torch.cuda.current_stream().cuda_stream


def host_rows(table, ids):
    """The table's bytes for `ids`, read on the CPU through fetchahead_lookup."""
    ids = ids.to("cpu", torch.int64).contiguous()
    w = torch.empty(len(ids), DIM, dtype=torch.uint8)
    s = torch.empty(len(ids), DIM // 32, dtype=torch.uint8)
    work = Work(table.value, ids.data_ptr(), w.data_ptr(), s.data_ptr(), len(ids), -1)
    LIB.fetchahead_lookup(ctypes.byref(work))
    assert work.status == OK, f"lookup status {work.status}"
    return w, s


def reference(w, s):
    """bf16(e4m3(w) * 2^(s - 127)), computed by torch."""
    values = w.view(torch.float8_e4m3fn).float()
    scales = s.view(torch.float8_e8m0fnu).float()
    assert torch.equal(scales, torch.exp2(s.float() - 127)), "E8M0 decoding"
    scales = scales.repeat_interleave(32, dim=1)
    return (values * scales).to(torch.bfloat16)


def expect_equal(got, table, ids, what):
    want = reference(*host_rows(table, ids))
    got = got.cpu()
    if not torch.equal(got.view(torch.int16), want.view(torch.int16)):
        bad = (got.view(torch.int16) != want.view(torch.int16)).nonzero()[0].tolist()
        raise AssertionError(f"{what}: first difference at {bad}: {got[bad[0], bad[1]]} vs {want[bad[0], bad[1]]}")
    print(f"  {what}: {len(ids)} rows match the torch reference")


def counters(p):
    c = Counters()
    check(LIB.fetchahead_read_counters(p, ctypes.byref(c)), "fetchahead_read_counters")
    return c


def main():
    torch.manual_seed(0)
    device = torch.device("cuda", 0)
    print(f"{torch.cuda.get_device_name(device)}, torch {torch.__version__}")
    table = ctypes.c_void_p()
    check(LIB.fetchahead_open_memory_table(ROWS, DIM, SEED, ctypes.byref(table)), "open table")
    p = ctypes.c_void_p()
    config = Config(CAPACITY, None, 1, 1, 0)  # default variant, check mode on, fallback on
    check(LIB.fetchahead_prefetcher_create(table, 0, ctypes.byref(config), ctypes.byref(p)), "create")
    check(LIB.fetchahead_prefetcher_warm(p), "warm")

    print("eager:")
    for step in range(5):
        n = int(torch.randint(1, CAPACITY + 1, ()).item())
        ids = torch.randint(0, ROWS, (n,), device=device, dtype=torch.int64)
        out = torch.full((n, DIM), float("nan"), device=device, dtype=torch.bfloat16)
        check(LIB.fetchahead_prefetch(p, ids.data_ptr(), n, stream()), "prefetch")
        torch.cuda._sleep(1_000_000)  # the layers before the gather
        check(LIB.fetchahead_gather_dequant(p, out.data_ptr(), stream()), "gather")
        torch.cuda.synchronize()
        expect_equal(out, table, ids, f"step {step}")

    print("graph:")
    n = 1500
    static_ids = torch.randint(0, ROWS, (n,), device=device, dtype=torch.int64)
    static_out = torch.zeros((n, DIM), device=device, dtype=torch.bfloat16)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        check(LIB.fetchahead_prefetch(p, static_ids.data_ptr(), n, stream()), "prefetch (capture)")
        torch.cuda._sleep(1_000_000)
        check(LIB.fetchahead_gather_dequant(p, static_out.data_ptr(), stream()), "gather (capture)")
    before = counters(p).lookups
    replays = 5
    for replay in range(replays):
        static_ids.copy_(torch.randint(0, ROWS, (n,), device=device, dtype=torch.int64))
        static_out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        expect_equal(static_out, table, static_ids, f"replay {replay}")
    c = counters(p)
    # Each replay looked up its own ids: once ahead, once for check mode.
    assert c.lookups - before == 2 * replays, f"{c.lookups - before} lookups in {replays} replays"
    assert c.check_differed == 0, f"check mode: {c.check_differed} gathers differed"
    assert c.lookup_errors == 0
    print(f"  check mode: no prefetched gather differed from the synchronous path ({c.lookups} lookups)")

    print("failure:")
    ids = torch.randint(0, ROWS, (300,), device=device, dtype=torch.int64)
    out = torch.full((300, DIM), float("nan"), device=device, dtype=torch.bfloat16)
    check(LIB.fetchahead_table_inject(table, FAULT_FAIL_ON_ID, int(ids[7].item())), "inject")
    check(LIB.fetchahead_prefetch(p, ids.data_ptr(), 300, stream()), "prefetch")
    check(LIB.fetchahead_gather_dequant(p, out.data_ptr(), stream()), "gather")
    torch.cuda.synchronize()
    assert torch.count_nonzero(out).item() == 0, "the failed lookup's rows are not zeros"
    records = (LookupError_ * 4)()
    failed_ids = torch.zeros(4 * CAPACITY, dtype=torch.int64)
    taken = ctypes.c_uint32()
    check(
        LIB.fetchahead_take_errors(p, records, 4, failed_ids.data_ptr(), len(failed_ids), ctypes.byref(taken)),
        "take_errors",
    )
    assert taken.value >= 1, "the failure was not reported"
    first = records[0]
    assert torch.equal(failed_ids[: first.ids_copied], ids.cpu()), "the failure's ids"
    print(f"  reported: {first.message.decode()} ({first.id_count} ids), rows zeroed")
    check(LIB.fetchahead_table_inject(table, FAULT_NONE, 0), "disarm")
    check(LIB.fetchahead_prefetch(p, ids.data_ptr(), 300, stream()), "prefetch")
    check(LIB.fetchahead_gather_dequant(p, out.data_ptr(), stream()), "gather")
    torch.cuda.synchronize()
    assert counters(p).fell_back == 1, "no fallback after the failure"
    expect_equal(out, table, ids, "fallback (synchronous path)")
    check(LIB.fetchahead_prefetcher_resume(p), "resume")

    print("engine-enqueued host function:")
    n = 512
    ids = torch.randint(0, ROWS, (n,), device=device, dtype=torch.int64)
    ids_host = torch.empty(n, dtype=torch.int64, pin_memory=True)
    w_host = torch.empty(n, DIM, dtype=torch.uint8, pin_memory=True)
    s_host = torch.empty(n, DIM // 32, dtype=torch.uint8, pin_memory=True)
    work = Work(table.value, ids_host.data_ptr(), w_host.data_ptr(), s_host.data_ptr(), n, -1)
    cuda = ctypes.CDLL("libcuda.so.1")
    cuda.cuLaunchHostFunc.restype = ctypes.c_int
    cuda.cuLaunchHostFunc.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
    ids_host.copy_(ids, non_blocking=True)
    entry = ctypes.cast(LIB.fetchahead_lookup, ctypes.c_void_p)
    rc = cuda.cuLaunchHostFunc(stream(), entry, ctypes.addressof(work))
    assert rc == 0, f"cuLaunchHostFunc: {rc}"
    w_dev = w_host.to(device, non_blocking=True)
    s_dev = s_host.to(device, non_blocking=True)
    torch.cuda.synchronize()
    assert work.status == OK, f"lookup status {work.status}"
    expect_equal(reference(w_dev.cpu(), s_dev.cpu()), table, ids, "cuLaunchHostFunc(fetchahead_lookup)")

    del graph
    LIB.fetchahead_prefetcher_close(p)
    LIB.fetchahead_table_close(table)
    print("all checks passed")


if __name__ == "__main__":
    main()
