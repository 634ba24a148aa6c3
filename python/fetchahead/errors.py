"""fetchahead's exceptions: every error the library raises derives from :class:`Error`.

Each carries, as attributes, what the caller needs to act: the file and tensor of a bad table,
the row ids of a failed read, the CUDA call that failed. Errors about an argument also derive
from :class:`ValueError`, file errors from :class:`OSError` (with ``.filename`` and ``.errno``
set), a missing file from :class:`FileNotFoundError` and a refused one from
:class:`PermissionError`. The class of each error comes from the crate's ``ErrorKind``, the
mapping the C ABI's status codes come from too.
"""
from __future__ import annotations

from typing import Any

__all__ = [
    "Error",
    "CudaError",
    "NoDeviceError",
    "NoPtxError",
    "InvalidArgumentError",
    "IdsOutOfRangeError",
    "RowIdError",
    "RowLookupError",
    "RowReadError",
    "StagingFullError",
    "NotWarmedError",
    "PrefetchOrderError",
    "FileError",
    "MissingFileError",
    "FilePermissionError",
    "TableError",
    "ReadPathUnavailableError",
    "OutOfMemoryError",
    "NoSpaceError",
    "WouldOverwriteError",
]


class Error(Exception):
    """The base of every fetchahead error; ``str(e)`` is the full message."""

    def __init__(self, message: str, **attributes: Any) -> None:
        super().__init__(message)
        self.message = message
        for name, value in attributes.items():
            setattr(self, name, value)
        if isinstance(self, OSError):
            # What `except OSError as e` reads: the path and the errno, where known.
            self.filename = attributes.get("file")
            self.errno = attributes.get("errno")
            self.strerror = message

    def __str__(self) -> str:
        # OSError's own str() would print "[Errno N] ...: filename" in place of the message.
        return self.message


class CudaError(Error):
    """A CUDA driver call failed: ``.call`` names it, ``.code`` is its ``CUresult``."""

    call: str
    code: int


class NoDeviceError(Error):
    """No CUDA driver or no device: ``.why`` says which."""

    why: str


class NoPtxError(Error):
    """This build has no PTX for the device's arch (``.arch``; ``.built`` lists those built), or
    a kernel (``.kernel``) needs an arch (``.arch``) newer than the loaded PTX (``.built``)."""

    arch: str
    built: str


class InvalidArgumentError(Error, ValueError):
    """A bad argument: ``.argument`` names it, ``.why`` says what is wrong."""

    argument: str
    why: str


class IdsOutOfRangeError(Error, ValueError):
    """Ids outside ``0..rows`` (their output rows were written as zeros): ``.count``,
    ``.first_index``, ``.first_id``, ``.rows``."""

    count: int
    first_index: int
    first_id: int
    rows: int


class RowIdError(Error, IndexError):
    """Row ids outside the rows this store owns (nothing was read): ``.row_ids`` (the first),
    ``.row_range``, ``.count``."""

    row_ids: list[int]


class RowLookupError(Error):
    """A row lookup failed (``.row_ids`` when known)."""

    row_ids: list[int]


class RowReadError(RowLookupError, OSError):
    """Reading rows from a shard failed: ``.file``, ``.layer``, ``.row_ids``, ``.offset``."""

    file: str
    layer: int
    offset: int


class StagingFullError(Error, ValueError):
    """More ids than the prefetcher's capacity: ``.count``, ``.capacity``."""

    count: int
    capacity: int


class NotWarmedError(Error):
    """A prefetcher was first used inside a CUDA graph capture (``.what``)."""

    what: str


class PrefetchOrderError(Error):
    """``prefetch`` and ``gather_dequant`` were not called in pairs (``.why``)."""

    why: str


class FileError(Error, OSError):
    """A file operation failed: ``.file``, ``.op``, ``.errno``; or the path is not a regular
    file (``.kind``: a FIFO, a device), which is refused rather than read."""

    file: str
    op: str


class MissingFileError(FileError, FileNotFoundError):
    """The file does not exist (``errno`` ENOENT): a :class:`FileError` that is also a
    :class:`FileNotFoundError`."""


class FilePermissionError(FileError, PermissionError):
    """The file may not be opened or written (``errno`` EACCES / EPERM): a :class:`FileError`
    that is also a :class:`PermissionError`."""


class NoSpaceError(Error, OSError):
    """Writing ``.need`` bytes under ``.file`` would not fit its filesystem's ``.available``
    bytes; nothing was written."""

    file: str
    need: int
    available: int


class WouldOverwriteError(Error, OSError):
    """Refused to replace ``.file``, which fetchahead did not write (``.why``)."""

    file: str
    why: str


class OutOfMemoryError(Error, MemoryError):
    """``.what`` would take ``.bytes`` bytes; ``.available`` (None when unknown) is what the
    machine has. Nothing was allocated."""

    what: str
    bytes: int
    available: "int | None"


class TableError(Error, ValueError):
    """A table that is missing, malformed or truncated: ``.file``, ``.tensor`` (when one is
    named), ``.layer`` / ``.layers`` for a missing layer, ``.layer_rows`` when its layers
    disagree in rows."""

    file: str
    tensor: str


class ReadPathUnavailableError(Error):
    """The read path asked for is not available here (``.path``, ``.why``)."""

    path: str
    why: str
