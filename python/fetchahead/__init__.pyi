import os
from typing import Any, Optional, Sequence, Union

import numpy as np
import torch

from .errors import (
    CudaError as CudaError,
    Error as Error,
    FileError as FileError,
    FilePermissionError as FilePermissionError,
    MissingFileError as MissingFileError,
    IdsOutOfRangeError as IdsOutOfRangeError,
    InvalidArgumentError as InvalidArgumentError,
    NoDeviceError as NoDeviceError,
    NoPtxError as NoPtxError,
    NoSpaceError as NoSpaceError,
    OutOfMemoryError as OutOfMemoryError,
    WouldOverwriteError as WouldOverwriteError,
    NotWarmedError as NotWarmedError,
    PrefetchOrderError as PrefetchOrderError,
    ReadPathUnavailableError as ReadPathUnavailableError,
    RowIdError as RowIdError,
    RowLookupError as RowLookupError,
    RowReadError as RowReadError,
    StagingFullError as StagingFullError,
    TableError as TableError,
)

__version__: str

_Ids = Union[Sequence[int], np.ndarray, torch.Tensor]
_HostBuffer = Union[np.ndarray, torch.Tensor]
_Status = Union["IdStatus", torch.Tensor, None]

__git_commit__: str

def flush_logs() -> None: ...
def show_config(*, file: Any = None, print_it: bool = True) -> dict[str, Any]: ...
def variants() -> dict[str, list[tuple[str, str]]]: ...
def default_variant(family: str, arch: Optional[str] = None) -> str: ...
def env_settings() -> list[tuple[str, str]]: ...
def make_table(
    dir: Union[str, bytes, os.PathLike[str], os.PathLike[bytes]],
    rows: int,
    layers: Sequence[int],
    *,
    dim: int = 256,
    shards: int = 1,
    seed: int = 1,
) -> list[str]: ...

class RowStore:
    path: str
    def __init__(
        self,
        path: Union[str, bytes, os.PathLike[str], os.PathLike[bytes]],
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
    ) -> None: ...
    @property
    def dim(self) -> int: ...
    @property
    def layers(self) -> list[int]: ...
    @property
    def row_range(self) -> range: ...
    @property
    def read_path(self) -> str: ...
    @property
    def direct_io_off(self) -> Optional[str]: ...
    @property
    def uring_off(self) -> Optional[str]: ...
    def auto_path(self, n: int) -> str: ...
    def lookup(
        self,
        layer: int,
        ids: _Ids,
        *,
        weights: Optional[_HostBuffer] = None,
        scales: Optional[_HostBuffer] = None,
        path: Optional[str] = None,
    ) -> tuple[Any, Any]: ...
    def advise(self, layer: int, ids: _Ids) -> None: ...
    def stats(self) -> dict[str, Any]: ...
    def tune(self, *, seed: int = 1, force: bool = False) -> list[tuple[int, str]]: ...
    def advise_future(self, layer: int, ids: Any, steps_ahead: int = 1) -> int: ...
    def replay_trace(self, layer: int, trace: Any, **options: Any) -> dict[str, Any]: ...
    def evict_page_cache(self) -> None: ...

class MemoryTable:
    def __init__(self, rows: int, dim: int = 256, *, seed: int = 1) -> None: ...
    @property
    def rows(self) -> int: ...
    @property
    def dim(self) -> int: ...
    def arrays(self) -> tuple[np.ndarray, np.ndarray]: ...
    def inject(self, fault: str, arg: int = 0) -> None: ...

class IdStatus:
    tensor: torch.Tensor
    def __init__(self, device: Any = None) -> None: ...
    def read(self) -> tuple[int, Optional[int]]: ...
    def reset(self) -> None: ...
    def check(self, rows: int = -1) -> None: ...

def gather(
    table: torch.Tensor, ids: torch.Tensor, *, variant: Optional[str] = None, status: _Status = None
) -> torch.Tensor: ...
def gather_out(
    table: torch.Tensor,
    ids: torch.Tensor,
    out: torch.Tensor,
    *,
    variant: Optional[str] = None,
    status: _Status = None,
) -> torch.Tensor: ...
def gather_dequant(
    weights: torch.Tensor,
    scales: torch.Tensor,
    ids: torch.Tensor,
    *,
    variant: Optional[str] = None,
    status: _Status = None,
) -> torch.Tensor: ...
def gather_dequant_out(
    weights: torch.Tensor,
    scales: torch.Tensor,
    ids: torch.Tensor,
    out: torch.Tensor,
    *,
    variant: Optional[str] = None,
    status: _Status = None,
) -> torch.Tensor: ...

class FlagLane:
    def __init__(self) -> None: ...

class Prefetcher:
    handle: int
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
    ) -> None: ...
    @property
    def dim(self) -> int: ...
    @property
    def capacity(self) -> int: ...
    def prefetch(self, ids: torch.Tensor) -> None: ...
    def gather_dequant(
        self, ids: torch.Tensor, *, out: Optional[torch.Tensor] = None
    ) -> torch.Tensor: ...
    def finish(self) -> None: ...
    def late_rows(self) -> int: ...
    def gather_dequant_sync(self, ids: torch.Tensor) -> torch.Tensor: ...
    def take_errors(self) -> list[tuple[str, list[int]]]: ...
    def resume(self) -> None: ...
    def stats(self) -> dict[str, Any]: ...
    def check_differed(self) -> Optional[int]: ...
    def poll_check(self) -> Optional[int]: ...
    def close(self) -> None: ...

class _PlanForward:
    summary: Optional[dict[str, Any]]
    def __enter__(self) -> _PlanForward: ...
    def __exit__(self, *exc: Any) -> None: ...

class L2Plan:
    def __init__(
        self,
        *,
        device: Any = None,
        budget_per_window: Optional[int] = None,
        replay: Optional[str] = None,
    ) -> None: ...
    def begin_forward(self, signature: int) -> None: ...
    def collective(self, kind: str = "all_reduce") -> None: ...
    def set_all_gather(self, enabled: bool) -> None: ...
    def consume(self, tensor: torch.Tensor, nbytes: Optional[int] = None) -> None: ...
    def end_forward(self) -> dict[str, Any]: ...
    def forward(self, signature: int) -> _PlanForward: ...
    def set_budget(self, budget_per_window: int) -> None: ...
    def counters(self) -> dict[str, int]: ...
