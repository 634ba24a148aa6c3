"""fetchahead: gets bytes to the GPU's multiprocessors before the kernels that need them start.

For PyTorch engines:

- :func:`gather`, :func:`gather_dequant` (and their ``_out`` forms): the row gather and the
  fused gather + MXFP8 dequant kernels as registered torch ops (``torch.ops.fetchahead.*``),
  on the current stream, on CUDA tensors or pinned host tensors (read zero-copy).
- :class:`RowStore`: Engram rows read from safetensors shards on NVMe (needs only numpy);
  :meth:`RowStore.replay_trace` (:mod:`fetchahead.trace`) replays a real lookup trace on it.
- :class:`Prefetcher` and :class:`FlagLane`: one Engram layer's rows looked up and staged on a
  side stream while the model computes; ``prefetch`` and ``gather_dequant`` are torch ops too,
  so a compiled forward keeps them in its graph and a CUDA graph captures them.
- :class:`L2Plan`: learns which weights follow each collective and warms them into L2 while
  the collective runs.

Errors derive from :class:`fetchahead.Error` (see :mod:`fetchahead.errors`). Log records go to
``logging.getLogger("fetchahead")``; nothing is printed. ``torch`` is imported only by the parts
that need it.
"""
from __future__ import annotations

import atexit
import logging
import os
import weakref
from typing import TYPE_CHECKING, Any, Iterable, Optional, Sequence, Union

import numpy as np

from . import _native
from .errors import (
    CudaError,
    Error,
    FileError,
    FilePermissionError,
    IdsOutOfRangeError,
    InvalidArgumentError,
    MissingFileError,
    NoDeviceError,
    NoPtxError,
    NoSpaceError,
    NotWarmedError,
    OutOfMemoryError,
    PrefetchOrderError,
    ReadPathUnavailableError,
    RowIdError,
    RowLookupError,
    RowReadError,
    StagingFullError,
    TableError,
    WouldOverwriteError,
)

if TYPE_CHECKING:  # pragma: no cover
    import torch

__version__: str = _native.__version__
#: The git commit the native module was built from ("unknown" outside a git checkout).
__git_commit__: str = _native.__git_commit__

__all__ = [
    "Error",
    "CudaError",
    "FileError",
    "FilePermissionError",
    "IdsOutOfRangeError",
    "InvalidArgumentError",
    "MissingFileError",
    "NoDeviceError",
    "NoPtxError",
    "NoSpaceError",
    "NotWarmedError",
    "OutOfMemoryError",
    "PrefetchOrderError",
    "ReadPathUnavailableError",
    "RowIdError",
    "RowLookupError",
    "RowReadError",
    "StagingFullError",
    "TableError",
    "WouldOverwriteError",
    "FlagLane",
    "IdStatus",
    "L2Plan",
    "MemoryTable",
    "Prefetcher",
    "RowStore",
    "default_variant",
    "env_settings",
    "show_config",
    "flush_logs",
    "gather",
    "gather_dequant",
    "gather_dequant_out",
    "gather_out",
    "loaded_ptx",
    "make_table",
    "variants",
]

def _preload_nvtx() -> None:
    """With ``FETCHAHEAD_NVTX=1``: loads pip's copy of the NVTX library (``libnvToolsExt.so.1``
    of ``nvidia-nvtx-cu12``, ``libnvtx3interop.so.1`` of CUDA 13's ``nvidia-nvtx``: what torch's
    CUDA wheels install, off the loader's path) so that the native layer's ``dlopen`` of that
    name finds it. Nothing is loaded with the setting off, or without such a package."""
    if os.environ.get("FETCHAHEAD_NVTX", "").strip() != "1":
        return
    import ctypes
    import glob
    import importlib.util

    try:
        spec = importlib.util.find_spec("nvidia")
    except (ImportError, ValueError):
        return
    roots = list(spec.submodule_search_locations or []) if spec else []
    for name in ("libnvToolsExt.so.1", "libnvtx3interop.so.1"):
        for root in roots:
            for path in sorted(glob.glob(os.path.join(root, "*", "lib", name))):
                try:
                    ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
                except OSError:
                    continue
                return


_preload_nvtx()

# A library logs, the application decides where it goes (and nothing prints by default).
logging.getLogger("fetchahead").addHandler(logging.NullHandler())
atexit.register(_native.drain_logs)


def flush_logs() -> None:
    """Forwards log records queued by fetchahead's threads to ``logging`` now.

    Records from background threads (the driver's callback thread, lookup lanes) are queued and
    forwarded at the end of the next fetchahead call on a Python thread, or by this function;
    they never wait for the GIL. Past 4096 queued records new ones are dropped.
    """
    _native.drain_logs()


# ---- arguments ---------------------------------------------------------------------------------

_U32 = (1 << 32) - 1
_U64 = (1 << 64) - 1
_I64 = (1 << 63) - 1


def _int_arg(name: str, value: Any, lo: int, hi: int) -> int:
    """``value`` as an int in ``lo..=hi``, else :class:`InvalidArgumentError` naming ``name``
    (never a bare ``OverflowError`` or ``TypeError`` from the native layer)."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise InvalidArgumentError(
            f"invalid {name}: {value!r} ({type(value).__name__}); want an integer",
            argument=name,
            why="not an integer",
        )
    v = int(value)
    if not lo <= v <= hi:
        raise InvalidArgumentError(
            f"invalid {name}: {v}; want {lo} to {hi}",
            argument=name,
            why="out of range",
        )
    return v


def _opt_int(name: str, value: Any, lo: int, hi: int) -> Optional[int]:
    return None if value is None else _int_arg(name, value, lo, hi)


def _path_arg(name: str, path: Any) -> str:
    """A ``str``, ``bytes`` or ``os.PathLike`` path as the ``str`` the native layer takes
    (bytes decoded as the filesystem encodes names, so any name round-trips)."""
    try:
        return os.fsdecode(os.fspath(path))
    except TypeError:
        raise InvalidArgumentError(
            f"invalid {name}: {type(path).__name__}; want a str, bytes or os.PathLike path",
            argument=name,
            why="not a path",
        ) from None


def variants() -> dict[str, list[tuple[str, str]]]:
    """Every kernel variant by family: ``{"gather": [(name, about), ...], "gather_dequant": ...}``."""
    return _native.variants()


def default_variant(family: str, arch: Optional[str] = None, rows: Optional[int] = None) -> str:
    """The variant ``family`` ("gather" or "gather_dequant") uses by default on ``arch``
    (``"sm_90"``, ``"sm_121a"``; None: the tested chip's) for a call of ``rows`` rows (None: a
    large call): the fastest measured there at that size."""
    return _native.variant(family, None, arch).name_for((1 << 64) - 1 if rows is None else rows)


def env_settings() -> list[tuple[str, str]]:
    """The ``FETCHAHEAD_*`` variables that override row store defaults, with their meaning."""
    return _native.env_settings()


def show_config(*, file: Any = None, print_it: bool = True) -> dict[str, Any]:
    """Prints (to ``file``, default stdout; not when ``print_it`` is False) and returns what this
    build is and what it finds here, as ``fetchahead info`` does: ``version``, ``git_commit``,
    ``archs`` (the embedded PTX), ``device`` (name, compute capability and the ``ptx`` it
    loads, or ``"no device (...)"``), ``default_variants`` per arch, ``read_paths`` (io_uring
    probed with the features it got), ``nvtx``, ``torch_ops`` (the ops whose CUDA kernel is
    native, or why none is) and ``settings``: every ``FETCHAHEAD_*`` setting with its
    ``value`` and ``source`` (``"env"`` or ``"default"``)."""
    import json
    import sys

    report, text = _native.config_report()
    found = json.loads(report)
    torch_side = sys.modules.get("fetchahead._torch")
    if torch_side is None:
        found["torch_ops"] = {"native": [], "why": "the torch ops are not loaded yet"}
    else:
        found["torch_ops"] = {"native": sorted(torch_side.NATIVE_OPS), "why": torch_side.NATIVE_OFF}
    ops = found["torch_ops"]
    text += "torch ops with native CUDA kernels: " + (
        ", ".join(ops["native"]) if ops["native"] else f"none ({ops['why']})"
    ) + "\n"
    if print_it:
        print(text, end="", file=sys.stdout if file is None else file)
    return found


def make_table(
    dir: Union[str, os.PathLike],
    rows: int,
    layers: Sequence[int],
    *,
    dim: int = 256,
    shards: int = 1,
    seed: int = 1,
) -> list[str]:
    """Writes a generated Engram table (FP8-E4M3 weights, E8M0 scales) as safetensors shards in
    ``dir``, as ``fetchahead make-table`` does; returns the shard paths."""
    paths = _native.make_table(
        _path_arg("dir", dir),
        _int_arg("rows", rows, 1, _I64),
        [_int_arg("layers", layer, 0, _U32) for layer in layers],
        _int_arg("dim", dim, 1, _U32),
        _int_arg("shards", shards, 1, _U32),
        _int_arg("seed", seed, 0, _U64),
    )
    return [os.fspath(p) for p in paths]


# ---- host arrays -------------------------------------------------------------------------------


def _is_torch(x: Any) -> bool:
    return type(x).__module__.startswith("torch")


def _host_ids(ids: Any) -> np.ndarray:
    """Ids as a C-contiguous int64 numpy array (a copy only when needed). Only integers are ids:
    a float, bool or string id is refused, never truncated."""
    if _is_torch(ids):
        if ids.device.type != "cpu":
            raise InvalidArgumentError(
                f"invalid ids: a {ids.device} tensor; the row store reads host ids",
                argument="ids",
                why="not on the CPU",
            )
        ids = ids.numpy()
    arr = np.asarray(ids)
    if arr.size == 0 and arr.dtype.kind not in "iu":
        arr = arr.astype(np.int64)  # `[]` is float64 to numpy
    if arr.dtype.kind not in "iu":
        raise InvalidArgumentError(
            f"invalid ids: dtype {arr.dtype}; want integer ids (int64, or any integer dtype)",
            argument="ids",
            why="not integers",
        )
    if arr.dtype.kind == "u" and arr.dtype.itemsize == 8 and arr.size:
        big = arr > np.uint64(_I64)
        if big.any():
            first = int(np.argmax(big))
            raise RowIdError(
                f"{int(big.sum())} of {arr.size} row ids outside every table's rows (ids are "
                f"at most {_I64}); the first at position {first} is {int(arr.flat[first])} "
                "(nothing was read)",
                row_ids=[int(arr.flat[first])],
                count=int(big.sum()),
                n=int(arr.size),
                first_index=first,
            )
    arr = np.ascontiguousarray(arr, dtype=np.int64)
    if arr.ndim != 1:
        raise InvalidArgumentError(
            f"invalid ids: shape {arr.shape}; want one dimension",
            argument="ids",
            why="not one-dimensional",
        )
    return arr


def _host_buffer(x: Any, name: str, nbytes: int) -> int:
    """The address of a caller's C-contiguous host buffer of exactly ``nbytes`` bytes."""
    if _is_torch(x):
        if x.device.type != "cpu":
            raise InvalidArgumentError(
                f"invalid {name}: a {x.device} tensor; want a (pinned) CPU tensor",
                argument=name,
                why="not on the CPU",
            )
        if not x.is_contiguous():
            raise InvalidArgumentError(
                f"invalid {name}: not contiguous", argument=name, why="not contiguous"
            )
        size = x.numel() * x.element_size()
        address = x.data_ptr()
    elif isinstance(x, np.ndarray):
        if not x.flags.c_contiguous or not x.flags.writeable:
            raise InvalidArgumentError(
                f"invalid {name}: not a writable C-contiguous array",
                argument=name,
                why="not writable and C-contiguous",
            )
        size = x.nbytes
        address = x.ctypes.data
    else:
        raise InvalidArgumentError(
            f"invalid {name}: {type(x).__name__}; want a numpy array or a CPU tensor",
            argument=name,
            why="unsupported type",
        )
    if size != nbytes:
        raise InvalidArgumentError(
            f"invalid {name}: {size} bytes; want {nbytes}",
            argument=name,
            why="wrong size",
        )
    return address


class RowStore:
    """Engram rows of one tensor-parallel rank, read from safetensors shards on NVMe.

    ``path`` is a model directory or one ``.safetensors`` file (``str``, ``bytes`` or
    ``os.PathLike``), resolved to an absolute path when the store opens. Every option left ``None``
    takes its ``FETCHAHEAD_*`` environment variable when set (see :func:`env_settings`), else
    the default: ``read_path="auto"`` (chosen by batch size from :meth:`tune`'s figures),
    no DRAM row cache, resident scales, 64 preadv threads, the default io_uring depth, O_DIRECT
    where the filesystem allows it, no room for :meth:`advise_future`'s look-ahead. An option
    passed here wins over its variable, which is then not read. ``num_rows`` 0 (or None) means
    every row from ``row_start`` (as in C); ``preadv_threads`` is 1 to 1024 and ``uring_depth``
    1 to 4096, whichever way they arrive; an option out of bounds is an
    :class:`InvalidArgumentError` naming it.

    Lookups release the GIL; one store serves many threads at once.
    """

    def __init__(
        self,
        path: Union[str, os.PathLike],
        *,
        row_start: Optional[int] = None,
        num_rows: Optional[int] = None,
        read_path: Optional[str] = None,
        cache_bytes: Optional[int] = None,
        resident_scales: Optional[bool] = None,
        preadv_threads: Optional[int] = None,
        uring_depth: Optional[int] = None,
        direct_io: Optional[bool] = None,
        lookahead: Optional[bool] = None,
    ) -> None:
        self._store = _native.RowStore(
            _path_arg("path", path),
            _opt_int("row_start", row_start, 0, _I64),
            _opt_int("num_rows", num_rows, 0, _I64),
            read_path,
            _opt_int("cache_bytes", cache_bytes, 0, _U64),
            resident_scales,
            _opt_int("preadv_threads", preadv_threads, 0, _U64),
            _opt_int("uring_depth", uring_depth, 0, _U64),
            direct_io,
            lookahead,
        )
        #: The table's path, made absolute when the store opened (``tune`` writes beside it
        #: whatever the working directory is later).
        self.path: str = os.fspath(self._store.path)

    @property
    def dim(self) -> int:
        """FP8 elements (bytes) per row; a row's scales are ``dim // 32`` bytes."""
        return self._store.dim

    @property
    def layers(self) -> list[int]:
        """The Engram layers in the table."""
        return self._store.layers

    @property
    def row_range(self) -> range:
        """The row ids this store owns."""
        start, end = self._store.row_range
        return range(start, end)

    @property
    def read_path(self) -> str:
        """The configured read path (``auto``, ``uring``, ``preadv``, ``mmap``, ``buffered``)."""
        return self._store.read_path

    @property
    def direct_io_off(self) -> Optional[str]:
        """Why O_DIRECT is off, or None when reads bypass the page cache."""
        return self._store.direct_io_off

    @property
    def uring_off(self) -> Optional[str]:
        """Why io_uring is unavailable, or None."""
        return self._store.uring_off

    def auto_path(self, n: int) -> str:
        """The read path ``auto`` takes for a batch of ``n`` rows."""
        return self._store.auto_path(n)

    def lookup(
        self,
        layer: int,
        ids: Any,
        *,
        weights: Any = None,
        scales: Any = None,
        path: Optional[str] = None,
    ) -> tuple[Any, Any]:
        """The rows of ``ids`` (absolute row ids in :attr:`row_range`) of ``layer``, in order.

        Returns ``(weights, scales)``: ``[n, dim]`` and ``[n, dim // 32]`` uint8 numpy arrays
        (E4M3 and E8M0 bytes), or the caller's ``weights`` and ``scales`` filled in place (numpy
        arrays or CPU tensors, pinned for the engine's own copies, of exactly that many bytes).
        ``path`` reads through one read path instead of the configured one.
        """
        ids_arr = _host_ids(ids)
        n = ids_arr.shape[0]
        dim = self.dim
        if weights is None:
            weights = np.empty((n, dim), dtype=np.uint8)
        if scales is None:
            scales = np.empty((n, dim // 32), dtype=np.uint8)
        layer = _int_arg("layer", layer, 0, _U32)
        w = _host_buffer(weights, "weights", n * dim)
        s = _host_buffer(scales, "scales", n * dim // 32)
        self._store.lookup_into(layer, ids_arr.ctypes.data, n, w, s, path)
        return weights, scales

    def advise(self, layer: int, ids: Any) -> None:
        """Starts warming the rows of a coming batch (the next prefill chunk) and returns at
        once: into the row cache when there is one, else into the page cache."""
        layer = _int_arg("layer", layer, 0, _U32)
        ids_arr = _host_ids(ids)
        self._store.advise(layer, ids_arr.ctypes.data, ids_arr.shape[0])

    def advise_future(self, layer: int, ids: Any, steps_ahead: int = 1) -> int:
        """Hands the row cache ids that the lookup of ``layer`` ``steps_ahead`` lookups from
        now asks for (1: the next; a prompt's later prefill chunks, known when its request
        arrives): until then each is admitted when read and not evicted, and once that lookup
        is at most two lookups away the store's advise thread reads the rows into the cache
        (most asked first), so that the lookup finds them. Hand each chunk over once. Needs a
        store opened with ``lookahead=True`` (which keeps room for them in ``cache_bytes``);
        returns how many ids were noted (0 without it, and nothing is read ahead)."""
        layer = _int_arg("layer", layer, 0, _U32)
        steps_ahead = _int_arg("steps_ahead", steps_ahead, 0, _U32)
        ids_arr = _host_ids(ids)
        return self._store.advise_future(layer, ids_arr.ctypes.data, ids_arr.shape[0], steps_ahead)

    def wait_advised(self) -> None:
        """Blocks until the advise thread has read every batch :meth:`advise` and
        :meth:`advise_future`'s read-ahead sent it (for benchmarks that stand in for the
        compute a read overlaps)."""
        self._store.wait_advised()

    def stats(self) -> dict[str, Any]:
        """Counters since the store opened: ``hits``, ``misses``, ``reads``, ``bytes``,
        ``advised``, ``advise_dropped``, ``advise_failed``, ``cached_rows``, ``cached_bytes``,
        and the ``read_path`` configured, ``direct_io`` and ``uring`` availability."""
        return self._store.stats()

    def tune(self, *, seed: int = 1, force: bool = False) -> list[tuple[int, str]]:
        """Measures each read path on this disk (cold batches of growing size) and writes
        ``auto``'s choice beside the table, as ``fetchahead tune`` does; stores opened later
        use it. Returns ``[(max_batch, path), ...]``. Takes seconds to minutes; whether the tune
        file can be written is checked first. ``force`` replaces a file there that is not a
        tune file."""
        return self._store.tune(_int_arg("seed", seed, 0, _U64), bool(force))

    def evict_page_cache(self) -> None:
        """Drops the table's pages from the page cache, so that the next reads hit the disk."""
        self._store.evict_page_cache()

    def replay_trace(self, layer: int, trace: Any, **options: Any) -> dict[str, Any]:
        """Replays a lookup trace (a ``.u64`` / ``.u64.xz`` file or an id array) on this store
        step by step, first half warming the cache, and returns the report dict: see
        :func:`fetchahead.trace.replay_trace` for the options (``steps``, ``belady_rows``...)."""
        from .trace import replay_trace

        return replay_trace(self, layer, trace, **options)

    def __repr__(self) -> str:
        r = self.row_range
        return (
            f"RowStore({self.path!r}, layers={self.layers}, rows={r.start}..{r.stop}, "
            f"dim={self.dim}, read_path={self.read_path!r})"
        )


class MemoryTable:
    """A generated MXFP8 table in RAM, deterministic from ``seed``, with fault injection:
    a row source for :class:`Prefetcher` in tests and examples."""

    def __init__(self, rows: int, dim: int = 256, *, seed: int = 1) -> None:
        self._table = _native.MemoryTable(
            _int_arg("rows", rows, 0, _U64),
            _int_arg("dim", dim, 0, _U64),
            _int_arg("seed", seed, 0, _U64),
        )

    @property
    def rows(self) -> int:
        return self._table.rows

    @property
    def dim(self) -> int:
        return self._table.dim

    def arrays(self) -> tuple[np.ndarray, np.ndarray]:
        """``(weights [rows, dim], scales [rows, dim // 32])`` as uint8 numpy copies."""
        w, s = self._table.bytes()
        return (
            np.frombuffer(w, dtype=np.uint8).reshape(self.rows, self.dim),
            np.frombuffer(s, dtype=np.uint8).reshape(self.rows, self.dim // 32),
        )

    def inject(self, fault: str, arg: int = 0) -> None:
        """Arms a fault: ``"fail_on_id"`` (``arg``: the id, -1 disarms), ``"fail_next"`` and
        ``"corrupt_next"`` (``arg``: how many lookups), ``"latency_us"``, ``"none"``."""
        self._table.inject(fault, arg)


# ---- torch parts (imported on first use) -------------------------------------------------------


def _torch_ops() -> Any:
    from . import _torch

    return _torch


def _device_ordinal(device: Any) -> int:
    """The CUDA ordinal ``device`` names (None, ``"cuda"``: the current one, taken as 0 here),
    read without torch: an int, ``"cuda"`` / ``"cuda:N"``, or an object with ``.type`` and
    ``.index`` (a ``torch.device``). Anything else is left for torch to refuse later."""
    if device is None:
        return 0
    if isinstance(device, (int, np.integer)) and not isinstance(device, bool):
        return max(int(device), 0)
    if isinstance(device, str):
        kind, _, index = device.partition(":")
        return int(index) if kind == "cuda" and index.isdigit() else 0
    index = getattr(device, "index", None)
    return index if isinstance(index, int) else 0


def _require_device(device: Any) -> None:
    """:class:`NoDeviceError` when there is no CUDA driver or no such device, before torch (or
    its CUDA state) is touched: every constructor that needs a GPU calls it first."""
    _native.require_device(_device_ordinal(device))


class IdStatus:
    """A device record of ids outside ``0..rows`` that gather launches given it update: the
    count and the first position. Reading it waits for the device; launching never does.

    ``tensor`` is the int64 ``[2]`` CUDA tensor the kernels write (pass ``status=`` this object
    or that tensor).
    """

    def __init__(self, device: Any = None) -> None:
        _require_device(device)
        import torch

        dev = torch.device("cuda") if device is None else torch.device(device)
        self.tensor = torch.tensor([0, -1], dtype=torch.int64, device=dev)

    def read(self) -> tuple[int, Optional[int]]:
        """``(count, first_index)`` since the last reset (``first_index`` None when clean).
        Waits for the work enqueued before it on the current stream."""
        word0, first = self.tensor.tolist()
        count = word0 & 0xFFFFFFFF
        return count, (None if count == 0 else first)

    def reset(self) -> None:
        """Clears the record (on the current stream)."""
        self.tensor.copy_(self.tensor.new_tensor([0, -1]))

    def check(self, rows: int = -1) -> None:
        """Raises :class:`IdsOutOfRangeError` if a launch saw a bad id, then resets."""
        count, first = self.read()
        if count:
            self.reset()
            raise IdsOutOfRangeError(
                f"{count} ids outside 0..{rows}; the first at position {first} "
                "(those output rows were written as zeros)",
                count=count,
                first_index=first,
                first_id=None,
                rows=rows,
            )


def loaded_ptx(device: Any = None) -> dict[str, Any]:
    """Which embedded PTX fetchahead loaded for CUDA ``device`` (None: the current one) and why:
    ``{"arch": "sm_90", "why": "sm_90 PTX for a 10.0 device: the newest embedded PTX not newer
    than the device ...", "not_held": [(variant, sm), ...]}``, ``not_held`` listing the variants
    that PTX lacks (each needs the newer SM given). ``FETCHAHEAD_PTX_ARCH`` forces the choice."""
    t = _torch_ops()
    native = t.native_device(t.cuda_device(device))
    return {"arch": native.arch, "why": native.ptx_reason, "not_held": list(native.not_held)}


_TORCH_FUNCTIONS = ("gather", "gather_out", "gather_dequant", "gather_dequant_out")


def __getattr__(name: str) -> Any:
    # The kernel entry points live in `_torch` (which imports torch and registers the ops);
    # they are bound here on first use, as plain functions that torch.compile traces.
    if name in _TORCH_FUNCTIONS:
        value = getattr(_torch_ops(), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'fetchahead' has no attribute {name!r}")


class FlagLane:
    """A lookup thread that flag-mode prefetchers share: one lookup at a time, in the order the
    prefetches were enqueued (the layers' gather order)."""

    def __init__(self) -> None:
        self._lane = _native.FlagLane()


class Prefetcher:
    """Prefetches one Engram layer's rows on a side stream; see the module documentation.

    ``source`` is a :class:`RowStore` (reading ``layer``) or a :class:`MemoryTable`.
    ``completion="flag"`` (the default, the measured best: lookups on a lookup thread, the
    device's default lane shared by the prefetchers made without ``lane``, one lookup at a time;
    the side stream waits on a pinned flag) or ``"host_function"`` (lookups in a host function on
    the driver's callback thread). ``lane`` puts the prefetcher on a :class:`FlagLane` of the
    caller's instead (``rank``: the layer's gather order). ``join="tags"`` (the default, the
    decode step's measured best) has each gather wait on the device for its rows' tags and
    :meth:`finish` join the side stream once after the step's last gather (a CUDA graph capture
    cannot end without it; an eager caller may skip it); ``"at_gather"`` waits for the side
    stream at each gather. ``check=True`` also runs the synchronous path after every gather and
    counts differing outputs on the device (:meth:`check_differed`). With
    ``fallback_on_error`` a failed lookup switches gathers to the synchronous path until
    :meth:`resume`; :meth:`take_errors` returns the failures.

    Call :meth:`prefetch` then :meth:`gather_dequant` with the same ids, in pairs, on the
    current stream, and :meth:`finish` after the step's last gather; all are torch ops
    (``torch.ops.fetchahead.prefetch`` / ``prefetched_gather_dequant`` / ``finish_prefetch``),
    fine under ``torch.compile`` and inside ``torch.cuda.graph`` capture. Do not write to the
    ids tensor before the gather (the prefetcher holds a reference to it until then), and keep
    the prefetcher alive as long as a graph that captured it may be replayed.
    """

    def __init__(
        self,
        source: Union[RowStore, MemoryTable],
        *,
        layer: int = 0,
        device: Any = None,
        capacity: int = 4096,
        variant: Optional[str] = None,
        check: bool = False,
        fallback_on_error: bool = True,
        completion: str = "flag",
        check_log_ms: int = 0,
        lane: Optional[FlagLane] = None,
        rank: int = 0,
        join: str = "tags",
    ) -> None:
        # Checked before torch or a device is touched.
        layer = _int_arg("layer", layer, 0, _U32)
        capacity = _int_arg("capacity", capacity, 1, _U64)
        check_log_ms = _int_arg("check_log_ms", check_log_ms, 0, _U64)
        rank = _int_arg("rank", rank, 0, _U32)
        _require_device(device)
        t = _torch_ops()
        self._device = t.cuda_device(device)
        native_source = source._store if isinstance(source, RowStore) else source._table
        self._prefetcher = _native.Prefetcher(
            t.native_device(self._device),
            native_source,
            layer,
            capacity,
            t.variant_of(self._device, "gather_dequant", variant),
            check,
            fallback_on_error,
            completion,
            check_log_ms,
            None if lane is None else lane._lane,
            rank,
            join,
        )
        self.handle, self._ticket = t.register_prefetcher(self._prefetcher, self._device)
        self._t = t
        # The ops find the prefetcher by handle; dropping this object releases it (as close()).
        self._finalizer = weakref.finalize(self, t.unregister_prefetcher, self.handle)

    @property
    def dim(self) -> int:
        return self._prefetcher.dim

    @property
    def capacity(self) -> int:
        return self._prefetcher.capacity

    def prefetch(self, ids: "torch.Tensor") -> None:
        """Starts fetching the rows of int64 CUDA ``ids`` on the side stream, after the work
        enqueued on the current stream so far."""
        self._t.prefetch(self.handle, ids, self._ticket)

    def gather_dequant(
        self, ids: "torch.Tensor", *, out: Optional["torch.Tensor"] = None
    ) -> "torch.Tensor":
        """Joins the side stream and returns the rows of the ``ids`` last prefetched as
        ``[n, dim]`` bfloat16 (into ``out`` when given)."""
        return self._t.prefetched_gather_dequant(self.handle, ids, self._ticket, out)

    def finish(self) -> None:
        """``join="tags"``: the current stream waits for the side stream's work of the last
        prefetch, which the tagged gathers did not wait for. Call it once after the step's last
        gather (inside a capture: before it ends); nothing to do with ``join="at_gather"``."""
        self._t.finish_prefetch(self.handle, self._ticket)

    def late_rows(self) -> int:
        """``join="tags"``: rows the gathers since the last call gave up on after the tag
        timeout (1 s; gathered as zeros, and logged). Waits for the device."""
        return self._prefetcher.late_rows()

    def gather_dequant_sync(self, ids: "torch.Tensor") -> "torch.Tensor":
        """The synchronous path: lookup and gather of ``ids`` on the current stream."""
        return self._t.sync_gather_dequant(self.handle, ids, self._ticket)

    def take_errors(self) -> list[tuple[str, list[int]]]:
        """The failed lookups since the last call (their rows were zero-filled), oldest first:
        ``[(message, ids), ...]``."""
        return self._prefetcher.take_errors()

    def resume(self) -> None:
        """Goes back to prefetching after a fallback to the synchronous path."""
        self._prefetcher.resume()

    def stats(self) -> dict[str, Any]:
        """Counters: ``prefetches``, ``gathers``, ``sync_gathers`` (calls; a graph replay adds
        none), ``lookups``, ``rows_looked_up``, ``lookup_ns``, ``lookup_errors`` (replays
        included), ``check_logs``, ``fell_back``."""
        return self._prefetcher.stats()

    def check_differed(self) -> Optional[int]:
        """Check mode: gathers whose output differed from the synchronous path's (expected 0);
        None with check mode off. Waits for the device."""
        return self._prefetcher.check_differed()

    def poll_check(self) -> Optional[int]:
        """Check mode's periodic count for callers that replay graphs: a count that has
        arrived (also logged), else None. Never waits for the device."""
        return self._prefetcher.poll_check(_torch_ops().stream_of(self._device))

    def close(self) -> None:
        """Releases the prefetcher after waiting for the device (no graph may replay it);
        dropping the last reference does the same."""
        self._finalizer()
        self._prefetcher = None


_COLLECTIVE_KINDS = {"all_reduce": 0, "all_gather": 1, "other": 2}


class L2Plan:
    """Learns which weights the kernels after each collective read, and in later forwards warms
    them into L2 while the collective runs (a cache hint: outputs stay bit-identical).

    Per forward: ``begin_forward(signature)``, then before launching each collective
    ``collective()``, and for each weight a kernel reads after it ``consume(tensor)``; then
    ``end_forward()``. Or ``with plan.forward(signature): ...``. Works eagerly and inside
    ``torch.cuda.graph`` capture (the current stream is read at ``begin_forward``); a signature
    is frozen once captured, and its tables live as long as the plan: keep the plan alive as
    long as the graph.
    """

    def __init__(
        self,
        *,
        device: Any = None,
        budget_per_window: Optional[int] = None,
        replay: Optional[str] = None,
    ) -> None:
        """``replay`` names how a window is warmed: ``"auto"`` (the default: windows up to a
        half of L2 read by the SMs, larger ones bulk-prefetched), ``"access_policy"``, or an
        L2 prefetch variant (``"l2_prefetch"``, ``"l2_prefetch_loads"``, ...)."""
        _require_device(device)
        t = _torch_ops()
        self._device = t.cuda_device(device)
        self._plan = _native.L2Plan(
            t.native_device(self._device), t.stream_of(self._device), budget_per_window, replay
        )

    def begin_forward(self, signature: int) -> None:
        """Starts a forward of ``signature`` (a number the caller chooses per shape, e.g. the
        batch's token count) on the current stream."""
        self._plan.begin_forward(signature, _torch_ops().stream_of(self._device))

    def collective(self, kind: str = "all_reduce") -> None:
        """Call right before launching each collective on the current stream. ``kind`` is
        ``"all_reduce"`` (the default), ``"all_gather"`` or ``"other"``; with all-gather windows
        switched off (``set_all_gather(False)`` or ``FETCHAHEAD_L2_ALL_GATHER=0``) an
        all-gather's window is counted but not warmed."""
        if kind == "all_reduce":  # the common call, without the lookup
            self._plan.collective(0)
            return
        code = _COLLECTIVE_KINDS.get(kind)
        if code is None:
            raise InvalidArgumentError(
                f"invalid collective kind: {kind!r}; want one of {sorted(_COLLECTIVE_KINDS)}"
            )
        self._plan.collective(code)

    def set_all_gather(self, enabled: bool) -> None:
        """Whether all-gather windows are warmed (the default) or only counted."""
        self._plan.set_all_gather(bool(enabled))

    def set_host_pace(self, enabled: bool) -> None:
        """Whether eager windows are left cold while the GPU keeps up with the host (the
        default, ``FETCHAHEAD_L2_HOST_PACE``: their prefetch could not shorten the forward, and
        its launch would lengthen it; ``counters()["windows_host_bound"]`` counts them) or
        always warmed."""
        self._plan.set_host_pace(bool(enabled))

    def consume(self, tensor: "torch.Tensor", nbytes: Optional[int] = None) -> None:
        """A kernel after the latest collective reads ``tensor`` (a live CUDA weight; its first
        ``nbytes`` bytes when given)."""
        size = tensor.nbytes if nbytes is None else nbytes
        self._plan.consume(tensor.data_ptr(), size)

    def end_forward(self) -> dict[str, Any]:
        """Ends the forward: ``{"signature", "collectives", "captured", "learned",
        "new_signature"}``, and for a captured forward ``"tables"``: the device tables its graph
        reads (the plan keeps them too; keep this object beside the graph if the graph may
        outlive the plan)."""
        return self._plan.end_forward()

    def forward(self, signature: int) -> "_PlanForward":
        """``with plan.forward(signature):`` brackets one forward."""
        return _PlanForward(self, signature)

    def set_budget(self, budget_per_window: int) -> None:
        """Bytes kept per window for plans learned from now on."""
        self._plan.set_budget(budget_per_window)

    def counters(self) -> dict[str, int]:
        """``windows_prefetched``, ``bytes_prefetched``, ``forwards_without_plan``,
        ``mismatches_at_capture``, ``forwards``, ``signatures``, ``windows_host_bound``
        (eager windows left cold because the GPU had caught up with the host)."""
        return self._plan.counters()


class _PlanForward:
    def __init__(self, plan: L2Plan, signature: int) -> None:
        self._plan = plan
        self._signature = signature
        self.summary: Optional[dict[str, Any]] = None

    def __enter__(self) -> "_PlanForward":
        self._plan.begin_forward(self._signature)
        return self

    def __exit__(self, *exc: Any) -> None:
        self.summary = self._plan.end_forward()
