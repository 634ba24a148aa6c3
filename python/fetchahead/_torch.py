"""The torch ops under ``torch.ops.fetchahead``: defined with ``torch.library.Library`` (a
schema each), each with a fake implementation (``torch.library.register_fake``: FakeTensor,
and the Meta key, so meta tensors work), launched on the current stream.

The CUDA kernels of the hot ops (the four ``_unchecked`` gathers and the three prefetcher ops
a forward calls, ``NATIVE_OPS``) are native: Rust functions the dispatcher calls through
libtorch's stable C ABI (torch 2.10 and later; ``python/src/torch_abi``), which check the
tensors and launch with no Python between, so a call costs torch's dispatch and the launch.
The other ops, and every op on an older torch or with ``FETCHAHEAD_TORCH_NATIVE=0``, have the
Python kernels below for CUDA; all have them for CPU, where their checks refuse host-only
inputs with an :class:`InvalidArgumentError`. A native kernel refuses a bad call as the stable
ABI does, with a C++ exception that torch raises as ``RuntimeError`` (the message names the
argument); the public functions turn it into fetchahead's own class by running the Python
checks (``_refused``).

Every public function calls its op's overload through the dispatcher, eagerly too: a meta
tensor, a FakeTensor, a dispatch mode or a tensor subclass reaches the kernel the dispatcher
picks, never a shortcut. ``torch.library.custom_op`` is not used: its Python wrapper costs
20-30 us a call on the H200's host (issue 26).

Imported on first use of a torch-facing part of :mod:`fetchahead`.
"""
from __future__ import annotations

import os
import threading
from typing import Any, Optional

import torch

from . import _native
from .errors import InvalidArgumentError

ops = torch.ops.fetchahead

_devices: dict[int, Any] = {}
_devices_lock = threading.Lock()

_E4M3 = (torch.uint8, getattr(torch, "float8_e4m3fn", torch.uint8))
_E8M0 = (torch.uint8, getattr(torch, "float8_e8m0fnu", torch.uint8))


def cuda_device(device: Any) -> torch.device:
    """The CUDA device for ``device`` (None: the current one)."""
    if device is None:
        return torch.device("cuda", torch.cuda.current_device())
    dev = torch.device(device)
    if dev.type != "cuda":
        raise _bad("device", f"{dev}; want a CUDA device")
    return torch.device("cuda", torch.cuda.current_device() if dev.index is None else dev.index)


def native_device(device: torch.device) -> Any:
    """The loaded kernels of ``device`` (loaded once per process)."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    found = _devices.get(index)
    if found is None:
        with _devices_lock:
            found = _devices.get(index)
            if found is None:
                torch.cuda.init()  # the primary context torch uses, before fetchahead retains it
                found = _native.Device(index)
                _devices[index] = found
    return found


def _public_raw_stream(index: int) -> int:
    """The current stream's raw handle through the public API (builds a torch.cuda.Stream)."""
    return torch.cuda.current_stream(index).cuda_stream


def pick_raw_stream(c_module: Any) -> Any:
    """``torch._C._cuda_getCurrentRawStream`` (the raw handle without building a
    torch.cuda.Stream, what Inductor's generated code calls) when this torch has it, else the
    public ``torch.cuda.current_stream(index).cuda_stream``: the one private API used here,
    behind a fallback that ``tests/test_torch_tracing.py`` exercises."""
    private = getattr(c_module, "_cuda_getCurrentRawStream", None)
    return private if callable(private) else _public_raw_stream


_raw_stream = pick_raw_stream(torch._C)


def stream_of(device: torch.device) -> int:
    """The raw handle of ``device``'s current stream."""
    return _raw_stream(device.index)


# The variant names of each family: checked when tracing too (the fake implementations), and
# resolved once per device to the native variant handle (its arch's default for None) in the
# real ones, which launch with the handle.
_VARIANT_NAMES: dict[str, frozenset] = {
    family: frozenset(name for name, _ in listed) for family, listed in _native.variants().items()
}
_resolved: dict[tuple[int, str, Optional[str]], Any] = {}


def check_variant(family: str, name: Optional[str]) -> None:
    if name is not None and name not in _VARIANT_NAMES[family]:
        listed = ", ".join(sorted(_VARIANT_NAMES[family]))
        raise _bad("variant", f"{name!r} is not a {family} variant; want one of {listed}")


def variant_of(device: torch.device, family: str, name: Optional[str]) -> Any:
    """The native handle of variant ``name`` of ``family`` on ``device`` (None: its arch's
    default), resolved once per device and name."""
    key = (device.index, family, name)
    found = _resolved.get(key)
    if found is None:
        check_variant(family, name)
        found = native_device(device).variant(family, name)
        _resolved[key] = found
    return found


def _bad(argument: str, why: str) -> InvalidArgumentError:
    return InvalidArgumentError(f"invalid {argument}: {why}", argument=argument, why=why)


# ---- checks (shared by the real and the fake implementations) ------------------------------------


def _check_2d(t: torch.Tensor, name: str) -> None:
    if not isinstance(t, torch.Tensor):
        raise _bad(name, f"{type(t).__name__}; want a tensor")
    if t.dim() != 2:
        raise _bad(name, f"shape {tuple(t.shape)}; want two dimensions")
    if not t.is_contiguous():
        raise _bad(name, "not contiguous")


def _check_ids(ids: torch.Tensor) -> None:
    if not isinstance(ids, torch.Tensor):
        raise _bad("ids", f"{type(ids).__name__}; want a tensor")
    if ids.dtype != torch.int64:
        raise _bad("ids", f"dtype {ids.dtype}; want torch.int64")
    if ids.dim() != 1:
        raise _bad("ids", f"shape {tuple(ids.shape)}; want one dimension")
    if not ids.is_contiguous():
        raise _bad("ids", "not contiguous")


def _check_status(status: Optional[torch.Tensor]) -> None:
    if status is None:
        return
    if status.dtype != torch.int64 or status.shape != (2,) or not status.is_contiguous():
        raise _bad("status", "want a contiguous int64 tensor of shape [2] (fetchahead.IdStatus)")


def _check_gather_shapes(table: torch.Tensor, ids: torch.Tensor) -> int:
    _check_2d(table, "table")
    _check_ids(ids)
    row_bytes = table.shape[1] * table.element_size()
    if row_bytes == 0 or row_bytes % 16:
        raise _bad("table", f"rows of {row_bytes} bytes; want a positive multiple of 16")
    return row_bytes


def _check_dequant_shapes(weights: torch.Tensor, scales: torch.Tensor, ids: torch.Tensor) -> int:
    _check_2d(weights, "weights")
    _check_2d(scales, "scales")
    _check_ids(ids)
    if weights.dtype not in _E4M3:
        raise _bad("weights", f"dtype {weights.dtype}; want torch.float8_e4m3fn or torch.uint8")
    if scales.dtype not in _E8M0:
        raise _bad("scales", f"dtype {scales.dtype}; want torch.float8_e8m0fnu or torch.uint8")
    rows, dim = weights.shape
    if dim == 0 or dim % 32:
        raise _bad("weights", f"dim {dim} is not a positive multiple of 32")
    if tuple(scales.shape) != (rows, dim // 32):
        raise _bad("scales", f"shape {tuple(scales.shape)}; want [{rows}, {dim // 32}]")
    return dim


def _native_at(index: int) -> Any:
    """The loaded kernels of CUDA device ``index`` (the hot path's lookup by index)."""
    found = _devices.get(index)
    if found is None:
        found = native_device(torch.device("cuda", index))
    return found


def _variant_at(index: int, family: str, name: Optional[str]) -> Any:
    """:func:`variant_of` for CUDA device ``index``, from the cache when resolved before."""
    found = _resolved.get((index, family, name))
    if found is None:
        found = variant_of(torch.device("cuda", index), family, name)
    return found


def _device_address(t: torch.Tensor, name: str, index: int, align: int) -> int:
    """A tensor's address for the kernels: CUDA on device ``index``, or pinned host memory
    mapped for it (tables only). `is_cuda` and `get_device()` rather than `t.device`, which
    builds a `torch.device` on every read: this runs four times a launch."""
    if t.is_cuda:
        if t.get_device() != index:
            raise _bad(name, f"on {t.device}; want cuda:{index}")
        address = t.data_ptr()
    elif name in ("table", "weights", "scales") and t.device.type == "cpu":
        if not t.is_pinned():
            raise _bad(name, "a CPU tensor that is not pinned (use tensor.pin_memory())")
        address = _native_at(index).host_device_address(t.data_ptr()) if t.numel() else 0
    else:
        raise _bad(name, f"on {t.device}; want cuda:{index}")
    if address % align and t.numel():
        raise _bad(name, f"address {address:#x} is not {align}-byte aligned")
    return address


def _check_out(out: torch.Tensor, shape: tuple[int, int], dtype: torch.dtype) -> None:
    if not isinstance(out, torch.Tensor):
        raise _bad("out", f"{type(out).__name__}; want a tensor")
    if tuple(out.shape) != shape:
        raise _bad("out", f"shape {tuple(out.shape)}; want {list(shape)}")
    if out.dtype != dtype:
        raise _bad("out", f"dtype {out.dtype}; want {dtype}")
    if not out.is_contiguous():
        raise _bad("out", "not contiguous")


# ---- the kernel ops ----------------------------------------------------------------------------
#
# One path for both families: a `_Family` says which tensors its table is, how they are
# checked and what its output is; `_launch` and the four op bodies below serve either. The
# registered ops are thin functions with the schema's arguments (torch calls them by position).


class _Family:
    """One kernel family's table tensors, their checks and its output."""

    def __init__(
        self, name: str, tensors: tuple[tuple[str, int], ...], check: Any, width: Any, out_dtype: Any
    ) -> None:
        self.name = name
        #: (argument name, alignment) of each table tensor, in the op's order.
        self.tensors = tensors
        #: Checks the table tensors and the ids.
        self.check = check
        #: The row width the kernel takes, from the first table tensor (bytes of a gather's
        #: row, elements of a gather + dequant's): the hot path's, unchecked.
        self.width = width
        #: The output's dtype, from the first table tensor.
        self.out_dtype = out_dtype

    def out_shape(self, table: tuple, ids: torch.Tensor) -> tuple[int, int]:
        return (ids.shape[0], table[0].shape[1])


def _check_gather_table(table: tuple, ids: torch.Tensor) -> int:
    return _check_gather_shapes(table[0], ids)


def _check_dequant_table(table: tuple, ids: torch.Tensor) -> int:
    return _check_dequant_shapes(table[0], table[1], ids)


_GATHER = _Family(
    "gather",
    (("table", 16),),
    _check_gather_table,
    lambda t: t.shape[1] * t.element_size(),
    lambda t: t.dtype,
)
_DEQUANT = _Family(
    "gather_dequant",
    (("weights", 16), ("scales", 1)),
    _check_dequant_table,
    lambda t: t.shape[1],
    lambda t: torch.bfloat16,
)


def _launch(
    family: _Family,
    table: tuple,
    ids: torch.Tensor,
    out: torch.Tensor,
    status: Optional[torch.Tensor],
    variant: Optional[str],
) -> None:
    # The callers checked the shapes (`family.check`); this is the hot path.
    width = family.width(table[0])
    _check_status(status)
    if not ids.is_cuda:
        raise _bad("ids", f"on {ids.device}; want a CUDA device")
    n = ids.shape[0]
    if n == 0:
        return
    index = ids.get_device()
    addresses = [
        _device_address(t, name, index, align) for t, (name, align) in zip(table, family.tensors)
    ]
    _native_at(index).launch(
        _variant_at(index, family.name, variant),
        addresses[0],
        addresses[1] if len(addresses) > 1 else 0,
        table[0].shape[0],
        width,
        _device_address(ids, "ids", index, 8),
        n,
        _device_address(out, "out", index, 16),
        0 if status is None else _device_address(status, "status", index, 8),
        _raw_stream(index),
    )


def _new(family: _Family, table: tuple, ids: torch.Tensor, status, variant) -> torch.Tensor:
    family.check(table, ids)
    out = torch.empty(family.out_shape(table, ids), dtype=family.out_dtype(table[0]), device=ids.device)
    _launch(family, table, ids, out, status, variant)
    return out


def _new_fake(family: _Family, table: tuple, ids: torch.Tensor, status, variant) -> torch.Tensor:
    check_variant(family.name, variant)
    family.check(table, ids)
    _check_status(status)
    return ids.new_empty(family.out_shape(table, ids), dtype=family.out_dtype(table[0]))


def _into(family: _Family, table: tuple, ids: torch.Tensor, out, status, variant) -> None:
    family.check(table, ids)
    _check_out(out, family.out_shape(table, ids), family.out_dtype(table[0]))
    _launch(family, table, ids, out, status, variant)


def _into_fake(family: _Family, table: tuple, ids: torch.Tensor, out, status, variant) -> None:
    check_variant(family.name, variant)
    family.check(table, ids)
    _check_out(out, family.out_shape(table, ids), family.out_dtype(table[0]))
    _check_status(status)


# ---- the hot path ---------------------------------------------------------------------------
#
# A kernel's checks cost more host time than its launch when each is a Python call (issue 26:
# 7-8 us of checks beside a 5 us launch on the H200's host). For the common case, CUDA tensors
# on the ids' device and no status record, `_dequant_fast` and `_gather_fast` make the same
# checks in one pass over each tensor's facts and launch; when any check would fail, or an input
# is something else (a pinned host table), they return None and the caller takes the full path
# above, which raises the check's own error. So every error is the full path's.

_I64 = torch.int64
_BF16 = torch.bfloat16


def _dequant_fast(weights, scales, ids, out, variant) -> Optional[torch.Tensor]:
    """The gather + dequant of ``ids`` into ``out`` (allocated when None) when every check
    passes; None otherwise, having launched nothing."""
    index = ids.get_device()
    if index < 0 or ids.dtype != _I64 or ids.dim() != 1 or not ids.is_contiguous():
        return None
    ws = weights.shape
    ss = scales.shape
    if len(ws) != 2 or len(ss) != 2:
        return None
    rows, dim = ws
    if (
        dim == 0
        or dim % 32
        or ss[0] != rows
        or ss[1] * 32 != dim
        or weights.dtype not in _E4M3
        or scales.dtype not in _E8M0
        or weights.get_device() != index
        or scales.get_device() != index
        or not weights.is_contiguous()
        or not scales.is_contiguous()
    ):
        return None
    n = ids.shape[0]
    if out is None:
        out = ids.new_empty((n, dim), dtype=_BF16)
    elif (
        out.shape != (n, dim)
        or out.dtype != _BF16
        or out.get_device() != index
        or not out.is_contiguous()
    ):
        return None
    if n == 0:
        return out
    w, i, o = weights.data_ptr(), ids.data_ptr(), out.data_ptr()
    if (w & 15 and rows) or i & 7 or o & 15:
        return None
    _native_at(index).launch(
        _variant_at(index, "gather_dequant", variant),
        w, scales.data_ptr(), rows, dim, i, n, o, 0, _raw_stream(index),
    )
    return out


def _gather_fast(table, ids, out, variant) -> Optional[torch.Tensor]:
    """:func:`_dequant_fast` for a gather of ``table``'s rows."""
    index = ids.get_device()
    if index < 0 or ids.dtype != _I64 or ids.dim() != 1 or not ids.is_contiguous():
        return None
    ts = table.shape
    if len(ts) != 2 or table.get_device() != index or not table.is_contiguous():
        return None
    rows, width = ts
    row_bytes = width * table.element_size()
    if row_bytes == 0 or row_bytes % 16:
        return None
    dtype = table.dtype
    n = ids.shape[0]
    if out is None:
        out = ids.new_empty((n, width), dtype=dtype)
    elif (
        out.shape != (n, width)
        or out.dtype != dtype
        or out.get_device() != index
        or not out.is_contiguous()
    ):
        return None
    if n == 0:
        return out
    t, i, o = table.data_ptr(), ids.data_ptr(), out.data_ptr()
    if (t & 15 and rows) or i & 7 or o & 15:
        return None
    _native_at(index).launch(
        _variant_at(index, "gather", variant), t, 0, rows, row_bytes, i, n, o, 0, _raw_stream(index)
    )
    return out


# The registered kernels and fakes, one line each. The `_unchecked` ops take no status record:
# a mutable argument that may be None trips Inductor (torch 2.11: "getitem is not an
# OpOverload" when lowering the functionalized op), so a call without `status` goes to these,
# which mutate nothing but their `out`.


def _gather(table, ids, status, variant):
    if status is None:
        out = _gather_fast(table, ids, None, variant)
        if out is not None:
            return out
    return _new(_GATHER, (table,), ids, status, variant)


def _gather_fake(table, ids, status, variant):
    return _new_fake(_GATHER, (table,), ids, status, variant)


def _gather_out(table, ids, out, status, variant):
    if status is not None or _gather_fast(table, ids, out, variant) is None:
        _into(_GATHER, (table,), ids, out, status, variant)


def _gather_out_fake(table, ids, out, status, variant):
    _into_fake(_GATHER, (table,), ids, out, status, variant)


def _gather_unchecked(table, ids, variant):
    out = _gather_fast(table, ids, None, variant)
    return out if out is not None else _new(_GATHER, (table,), ids, None, variant)


def _gather_unchecked_fake(table, ids, variant):
    return _new_fake(_GATHER, (table,), ids, None, variant)


def _gather_out_unchecked(table, ids, out, variant):
    if _gather_fast(table, ids, out, variant) is None:
        _into(_GATHER, (table,), ids, out, None, variant)


def _gather_out_unchecked_fake(table, ids, out, variant):
    _into_fake(_GATHER, (table,), ids, out, None, variant)


def _gather_dequant(weights, scales, ids, status, variant):
    if status is None:
        out = _dequant_fast(weights, scales, ids, None, variant)
        if out is not None:
            return out
    return _new(_DEQUANT, (weights, scales), ids, status, variant)


def _gather_dequant_fake(weights, scales, ids, status, variant):
    return _new_fake(_DEQUANT, (weights, scales), ids, status, variant)


def _gather_dequant_out(weights, scales, ids, out, status, variant):
    if status is not None or _dequant_fast(weights, scales, ids, out, variant) is None:
        _into(_DEQUANT, (weights, scales), ids, out, status, variant)


def _gather_dequant_out_fake(weights, scales, ids, out, status, variant):
    _into_fake(_DEQUANT, (weights, scales), ids, out, status, variant)


def _gather_dequant_unchecked(weights, scales, ids, variant):
    out = _dequant_fast(weights, scales, ids, None, variant)
    return out if out is not None else _new(_DEQUANT, (weights, scales), ids, None, variant)


def _gather_dequant_unchecked_fake(weights, scales, ids, variant):
    return _new_fake(_DEQUANT, (weights, scales), ids, None, variant)


def _gather_dequant_out_unchecked(weights, scales, ids, out, variant):
    if _dequant_fast(weights, scales, ids, out, variant) is None:
        _into(_DEQUANT, (weights, scales), ids, out, None, variant)


def _gather_dequant_out_unchecked_fake(weights, scales, ids, out, variant):
    _into_fake(_DEQUANT, (weights, scales), ids, out, None, variant)


def _status_tensor(status: Any) -> Optional[torch.Tensor]:
    if status is None or isinstance(status, torch.Tensor):
        return status
    tensor = getattr(status, "tensor", None)
    if not isinstance(tensor, torch.Tensor):
        raise _bad("status", f"{type(status).__name__}; want a fetchahead.IdStatus or a tensor")
    return tensor


def gather(
    table: torch.Tensor,
    ids: torch.Tensor,
    *,
    variant: Optional[str] = None,
    status: Any = None,
) -> torch.Tensor:
    """``out[i] = table[ids[i]]``: a ``[rows, width]`` table (any dtype, rows of a multiple of
    16 bytes; on the GPU or pinned in host memory, read zero-copy) gathered by int64 CUDA
    ``ids``, on the current stream. An id outside ``0..rows`` gives a zero row and is counted in
    ``status`` (a :class:`fetchahead.IdStatus`, read later without a sync on the hot path).
    ``variant`` names a kernel of ``variants()["gather"]`` (default: the fastest measured).
    Meta and fake tensors give the output's shape without a launch."""
    if status is None:
        try:
            return _op_gather_unchecked(table, ids, variant)
        except RuntimeError as e:
            return _refused(e, lambda: _gather_unchecked(table, ids, variant))
    return _op_gather(table, ids, _status_tensor(status), variant)


def gather_out(
    table: torch.Tensor,
    ids: torch.Tensor,
    out: torch.Tensor,
    *,
    variant: Optional[str] = None,
    status: Any = None,
) -> torch.Tensor:
    """:func:`gather` into ``out`` (``[n, width]``, the table's dtype, contiguous, 16-byte
    aligned, on the ids' device); returns ``out``."""
    if status is None:
        try:
            _op_gather_out_unchecked(table, ids, out, variant)
        except RuntimeError as e:
            _refused(e, lambda: _gather_out_unchecked(table, ids, out, variant))
    else:
        _op_gather_out(table, ids, out, _status_tensor(status), variant)
    return out


def gather_dequant(
    weights: torch.Tensor,
    scales: torch.Tensor,
    ids: torch.Tensor,
    *,
    variant: Optional[str] = None,
    status: Any = None,
) -> torch.Tensor:
    """Rows of an MXFP8 table dequantized to bf16: ``weights`` ``[rows, dim]`` E4M3
    (``torch.float8_e4m3fn`` or uint8), ``scales`` ``[rows, dim // 32]`` E8M0
    (``torch.float8_e8m0fnu`` or uint8), ``dim`` a multiple of 32, on the GPU or pinned in
    host memory; returns ``[n, dim]`` bfloat16, exactly ``bf16(e4m3 * 2^(e8m0 - 127))``.
    ``variant`` names a kernel of ``variants()["gather_dequant"]``; ``status`` as for
    :func:`gather`. Meta and fake tensors give the output's shape without a launch."""
    if status is None:
        try:
            return _op_gather_dequant_unchecked(weights, scales, ids, variant)
        except RuntimeError as e:
            return _refused(e, lambda: _gather_dequant_unchecked(weights, scales, ids, variant))
    return _op_gather_dequant(weights, scales, ids, _status_tensor(status), variant)


def gather_dequant_out(
    weights: torch.Tensor,
    scales: torch.Tensor,
    ids: torch.Tensor,
    out: torch.Tensor,
    *,
    variant: Optional[str] = None,
    status: Any = None,
) -> torch.Tensor:
    """:func:`gather_dequant` into ``out`` (``[n, dim]`` bfloat16, contiguous, 16-byte
    aligned); returns ``out``."""
    if status is None:
        try:
            _op_gather_dequant_out_unchecked(weights, scales, ids, out, variant)
        except RuntimeError as e:
            _refused(e, lambda: _gather_dequant_out_unchecked(weights, scales, ids, out, variant))
    else:
        _op_gather_dequant_out(weights, scales, ids, out, _status_tensor(status), variant)
    return out


# ---- prefetcher ops ----------------------------------------------------------------------------
#
# A prefetcher is named by an integer handle (a constant in a compiled graph). `ticket` is a
# one-element device tensor per prefetcher that `prefetch` declares it mutates and the gathers
# read: it orders prefetch before gather in a compiled graph and keeps `prefetch`, which returns
# nothing, from being dropped as dead code. The kernels never touch it.

_prefetchers: dict[int, Any] = {}
_next_handle = [1]
_handles_lock = threading.Lock()


def register_prefetcher(native: Any, device: torch.device) -> tuple[int, torch.Tensor]:
    with _handles_lock:
        handle = _next_handle[0]
        _next_handle[0] += 1
        # [native, device, the ids of the pending prefetch]: holding the ids tensor until the
        # gather keeps the allocator from reusing its memory before the side stream read it.
        _prefetchers[handle] = [native, device, None]
        # The native kernels find it (and hold its ids) in the extension's own registry; a
        # prefetcher that is not the extension's (a test's stand-in) is served by the Python
        # kernels, which a native kernel's refusal of its handle falls back to.
        if "prefetch" in NATIVE_OPS and isinstance(native, _native.Prefetcher):
            _native.register_op_prefetcher(handle, native, device.index)
    return handle, torch.zeros(1, dtype=torch.int32, device=device)


def unregister_prefetcher(handle: int) -> None:
    with _handles_lock:
        found = _prefetchers.pop(handle, None)
        if found is not None and "prefetch" in NATIVE_OPS and isinstance(found[0], _native.Prefetcher):
            _native.unregister_op_prefetcher(handle)


def _entry(handle: int) -> list:
    found = _prefetchers.get(handle)
    if found is None:
        raise _bad("handle", f"no live prefetcher {handle}")
    return found


def _prefetcher(handle: int) -> tuple[Any, torch.device]:
    entry = _entry(handle)
    return entry[0], entry[1]


def _check_prefetch_ids(ids: torch.Tensor, device: torch.device) -> int:
    # The common case in one pass (see `_dequant_fast`); the checks one by one, which raise,
    # otherwise.
    if (
        ids.get_device() == device.index
        and ids.dtype == _I64
        and ids.dim() == 1
        and ids.is_contiguous()
    ):
        address = ids.data_ptr()
        if not address & 7:
            return address
    _check_ids(ids)
    if ids.device.type != "cuda" or ids.device.index != device.index:
        raise _bad("ids", f"on {ids.device}; want {device}")
    address = ids.data_ptr()
    if ids.numel() and address % 8:
        raise _bad("ids", f"address {address:#x} is not 8-byte aligned")
    return address


def _prefetch(handle: int, ids: torch.Tensor, ticket: torch.Tensor) -> None:
    entry = _entry(handle)
    native, device = entry[0], entry[1]
    address = _check_prefetch_ids(ids, device)
    native.prefetch(address, ids.shape[0], _raw_stream(device.index))
    entry[2] = ids


def _prefetch_fake(handle, ids, ticket):
    _check_ids(ids)


def _dequant_out(native: Any, device: torch.device, ids: torch.Tensor) -> torch.Tensor:
    # `ids` is on `device` (checked): its `new_empty` is the cheaper allocation.
    return ids.new_empty((ids.shape[0], native.dim), dtype=torch.bfloat16)


def _prefetched_gather_dequant(
    handle: int, ids: torch.Tensor, ticket: torch.Tensor
) -> torch.Tensor:
    entry = _entry(handle)
    native, device = entry[0], entry[1]
    _check_prefetch_ids(ids, device)
    out = _dequant_out(native, device, ids)
    native.gather_dequant(out.data_ptr(), _raw_stream(device.index))
    entry[2] = None
    return out


def _prefetched_gather_dequant_fake(handle, ids, ticket):
    _check_ids(ids)
    native, _ = _prefetcher(handle)
    return ids.new_empty((ids.shape[0], native.dim), dtype=torch.bfloat16)


def _prefetched_gather_dequant_out(
    handle: int, ids: torch.Tensor, ticket: torch.Tensor, out: torch.Tensor
) -> None:
    entry = _entry(handle)
    native, device = entry[0], entry[1]
    _check_prefetch_ids(ids, device)
    shape = (ids.shape[0], native.dim)
    if (
        out.shape == shape
        and out.dtype == _BF16
        and out.get_device() == device.index
        and out.is_contiguous()
        and not out.data_ptr() & 15
    ):
        address = out.data_ptr()
    else:
        _check_out(out, shape, torch.bfloat16)
        address = out.data_ptr()
        if out.numel() and address % 16:
            raise _bad("out", f"address {address:#x} is not 16-byte aligned")
        if out.device != device:
            raise _bad("out", f"on {out.device}; want {device}")
    native.gather_dequant(address, _raw_stream(device.index))
    entry[2] = None


def _prefetched_gather_dequant_out_fake(handle, ids, ticket, out):
    _check_ids(ids)
    native, _ = _prefetcher(handle)
    _check_out(out, (ids.shape[0], native.dim), torch.bfloat16)


def _finish_prefetch(handle: int, ticket: torch.Tensor) -> None:
    native, device = _prefetcher(handle)
    native.finish(_raw_stream(device.index))


def _finish_prefetch_fake(handle, ticket):
    return None


def _sync_gather_dequant(handle: int, ids: torch.Tensor, ticket: torch.Tensor) -> torch.Tensor:
    native, device = _prefetcher(handle)
    address = _check_prefetch_ids(ids, device)
    out = _dequant_out(native, device, ids)
    native.gather_dequant_sync(
        address, ids.shape[0], out.data_ptr(), _raw_stream(device.index)
    )
    return out


def _sync_gather_dequant_fake(handle, ids, ticket):
    _check_ids(ids)
    native, _ = _prefetcher(handle)
    return ids.new_empty((ids.shape[0], native.dim), dtype=torch.bfloat16)


# ---- registration: each function above as a torch op with its fake implementation ---------------
#
# (name, schema, kernel, fake). Tensor(a!) marks what an op writes; the kernels are registered for
# CUDA (any CUDA tensor among the arguments: pinned host tables beside CUDA ids too) and for CPU
# (all-host arguments, which the kernels' checks refuse with the argument named).

_OPS = [
    ("gather", "gather(Tensor table, Tensor ids, Tensor(a!)? status, str? variant) -> Tensor",
     _gather, _gather_fake),
    ("gather_out", "gather_out(Tensor table, Tensor ids, Tensor(a!) out, Tensor(b!)? status, str? variant) -> ()",
     _gather_out, _gather_out_fake),
    ("gather_dequant", "gather_dequant(Tensor weights, Tensor scales, Tensor ids, Tensor(a!)? status, str? variant) -> Tensor",
     _gather_dequant, _gather_dequant_fake),
    ("gather_dequant_out", "gather_dequant_out(Tensor weights, Tensor scales, Tensor ids, Tensor(a!) out, Tensor(b!)? status, str? variant) -> ()",
     _gather_dequant_out, _gather_dequant_out_fake),
    ("gather_unchecked", "gather_unchecked(Tensor table, Tensor ids, str? variant) -> Tensor",
     _gather_unchecked, _gather_unchecked_fake),
    ("gather_out_unchecked", "gather_out_unchecked(Tensor table, Tensor ids, Tensor(a!) out, str? variant) -> ()",
     _gather_out_unchecked, _gather_out_unchecked_fake),
    ("gather_dequant_unchecked", "gather_dequant_unchecked(Tensor weights, Tensor scales, Tensor ids, str? variant) -> Tensor",
     _gather_dequant_unchecked, _gather_dequant_unchecked_fake),
    ("gather_dequant_out_unchecked", "gather_dequant_out_unchecked(Tensor weights, Tensor scales, Tensor ids, Tensor(a!) out, str? variant) -> ()",
     _gather_dequant_out_unchecked, _gather_dequant_out_unchecked_fake),
    ("prefetch", "prefetch(int handle, Tensor ids, Tensor(a!) ticket) -> ()",
     _prefetch, _prefetch_fake),
    ("prefetched_gather_dequant", "prefetched_gather_dequant(int handle, Tensor ids, Tensor ticket) -> Tensor",
     _prefetched_gather_dequant, _prefetched_gather_dequant_fake),
    ("prefetched_gather_dequant_out", "prefetched_gather_dequant_out(int handle, Tensor ids, Tensor ticket, Tensor(a!) out) -> ()",
     _prefetched_gather_dequant_out, _prefetched_gather_dequant_out_fake),
    ("finish_prefetch", "finish_prefetch(int handle, Tensor(a!) ticket) -> ()",
     _finish_prefetch, _finish_prefetch_fake),
    ("sync_gather_dequant", "sync_gather_dequant(int handle, Tensor ids, Tensor ticket) -> Tensor",
     _sync_gather_dequant, _sync_gather_dequant_fake),
]

# Kept for the life of the process: dropping a Library removes its registrations. Each op's
# overload, which the public functions call, is looked up once (an attribute walk of torch.ops
# costs about a microsecond a call) and bound as the module global `_op_{name}`: a global is
# what torch.compile's tracing reads most simply in those functions.
_LIBRARY = torch.library.Library("fetchahead", "DEF")
for _name, _schema, _kernel, _fake in _OPS:
    _LIBRARY.define(_schema)


def _register_native(setting: Optional[str], torch_lib: str) -> tuple[frozenset, Optional[str]]:
    """The ops whose CUDA kernel is native (``torch_abi`` in the extension: the dispatcher
    calls Rust, with no Python kernel between) and, when none is, why. ``setting`` is
    ``FETCHAHEAD_TORCH_NATIVE`` (``0``: the Python kernels)."""
    if setting == "0":
        return frozenset(), "FETCHAHEAD_TORCH_NATIVE=0"
    try:
        return frozenset(_native.register_torch_kernels(torch_lib)), None
    except RuntimeError as e:  # a torch without the stable C shim (before 2.10)
        return frozenset(), str(e)


#: The ops with native CUDA kernels, and why there are none when empty (reported by
#: ``fetchahead.show_config()``).
NATIVE_OPS, NATIVE_OFF = _register_native(
    os.environ.get("FETCHAHEAD_TORCH_NATIVE"), os.path.join(os.path.dirname(torch.__file__), "lib")
)
for _name, _schema, _kernel, _fake in _OPS:
    if _name not in NATIVE_OPS:
        _LIBRARY.impl(_name, _kernel, "CUDA")
    _LIBRARY.impl(_name, _kernel, "CPU")
    torch.library.register_fake(f"fetchahead::{_name}", _fake, lib=_LIBRARY)
    globals()[f"_op_{_name}"] = getattr(ops, _name).default


def _refused(raised: RuntimeError, full: Any) -> Any:
    """After a native kernel refused a call (torch raises its refusal as ``raised``): for a
    bad argument, the Python kernel ``full()``, whose checks raise the argument's own error
    (or, should they pass, which does the work); any other error as fetchahead's class.
    A ``RuntimeError`` that is not a native refusal is raised as it is."""
    found = _native.take_op_error(str(raised))
    if found is None:
        raise raised
    if isinstance(found, InvalidArgumentError):
        return full()
    raise found from None


# ---- the prefetcher's entry points (Prefetcher's methods call these) ---------------------------


def prefetch(handle: int, ids: torch.Tensor, ticket: torch.Tensor) -> None:
    try:
        _op_prefetch(handle, ids, ticket)
    except RuntimeError as e:
        _refused(e, lambda: _prefetch(handle, ids, ticket))


def prefetched_gather_dequant(
    handle: int, ids: torch.Tensor, ticket: torch.Tensor, out: Optional[torch.Tensor] = None
) -> torch.Tensor:
    try:
        if out is None:
            return _op_prefetched_gather_dequant(handle, ids, ticket)
        _op_prefetched_gather_dequant_out(handle, ids, ticket, out)
    except RuntimeError as e:
        if out is None:
            return _refused(e, lambda: _prefetched_gather_dequant(handle, ids, ticket))
        _refused(e, lambda: _prefetched_gather_dequant_out(handle, ids, ticket, out))
    return out


def finish_prefetch(handle: int, ticket: torch.Tensor) -> None:
    _op_finish_prefetch(handle, ticket)


def sync_gather_dequant(handle: int, ids: torch.Tensor, ticket: torch.Tensor) -> torch.Tensor:
    return _op_sync_gather_dequant(handle, ids, ticket)
