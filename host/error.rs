//! The crate's one error type: each variant carries what the caller needs to act.
use std::fmt;
use std::path::PathBuf;

use cudarc::driver::DriverError;

pub type Result<T, E = Error> = std::result::Result<T, E>;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("CUDA {call} failed: {source}")]
    Cuda {
        call: &'static str,
        #[source]
        source: DriverError,
    },

    #[error("no CUDA device: {0}")]
    NoDevice(String),

    #[error(
        "no PTX for {device} (compute capability {major}.{minor}, arch {wanted}); this build has \
         {built}, none of which runs there (a plain PTX runs on its arch and newer ones, an `a` \
         PTX on its arch only; the kernels need sm_80 or newer). For a newer chip, rebuild with \
         FETCHAHEAD_ARCHS={wanted},{built} cargo build --release"
    )]
    NoPtxForDevice {
        device: String,
        major: i32,
        minor: i32,
        wanted: String,
        built: String,
    },

    #[error("no PTX built for arch `{arch}`; this build has {built}")]
    UnknownArch { arch: String, built: String },

    #[error(
        "kernel `{kernel}` needs sm_{needs} or newer, and the loaded PTX is {loaded} ({why}); \
         run it on a device of compute capability {}.{} or newer without FETCHAHEAD_PTX_ARCH, \
         or pick another variant (`fetchahead kernels` lists each PTX's)",
        needs / 10, needs % 10
    )]
    KernelNeedsArch {
        kernel: &'static str,
        needs: u32,
        loaded: &'static str,
        /// Why that PTX was loaded (`crate::kernels::ptx::Choice`'s text).
        why: String,
    },

    #[error(
        "{count} of {n} ids outside 0..{rows}; the first at position {first_index} is {first_id} \
         (those output rows were written as zeros)"
    )]
    IdsOutOfRange {
        count: u32,
        n: u64,
        rows: u64,
        first_index: u64,
        first_id: i64,
    },

    #[error("row {id} is outside the table's {rows} rows")]
    RowOutOfRange { id: i64, rows: u64 },

    #[error("injected lookup failure at row {id} (fault injection of the in-memory table)")]
    InjectedFault { id: i64 },

    #[error("the row lookup panicked: {0}")]
    LookupPanicked(String),

    #[error(
        "{count} rows do not fit the staging buffers' {capacity} rows; create the prefetcher \
         with a capacity of at least {count}"
    )]
    StagingFull { count: usize, capacity: usize },

    #[error(
        "{what} was first used inside a CUDA graph capture; call Prefetcher::warm \
         (fetchahead_prefetcher_warm) on the stream before beginning the capture"
    )]
    NotWarmed { what: &'static str },

    #[error("{0}")]
    PrefetchOrder(&'static str),

    #[error("invalid {what}: {why}")]
    Invalid { what: &'static str, why: String },

    #[error("{}: {op} failed: {source}", file.display())]
    Io {
        file: PathBuf,
        op: &'static str,
        #[source]
        source: std::io::Error,
    },

    #[error("{}: bad safetensors header: {why}", file.display())]
    TableHeader { file: PathBuf, why: String },

    #[error("{}: bad table index: {why}", file.display())]
    TableIndex { file: PathBuf, why: String },

    #[error("{}: tensor {tensor} is missing", file.display())]
    MissingTensor { file: PathBuf, tensor: String },

    #[error("{}: tensor {tensor}: {why}", file.display())]
    BadTensor {
        file: PathBuf,
        tensor: String,
        why: String,
    },

    #[error(
        "{}: the file is {len} bytes but tensor {tensor} ends at byte {end}: the shard is truncated",
        file.display()
    )]
    TruncatedShard {
        file: PathBuf,
        tensor: String,
        len: u64,
        end: u64,
    },

    #[error("layer {layer} is not in this table (it has layers {have:?})")]
    NoSuchLayer { layer: u32, have: Vec<u32> },

    #[error(
        "{count} of {n} row ids outside the owned range {start}..{end}; the first at position \
         {first_index} is {first_id} (nothing was read)"
    )]
    RowsOutOfRange {
        count: u64,
        n: u64,
        start: u64,
        end: u64,
        first_index: u64,
        first_id: i64,
    },

    #[error(
        "reading rows {rows} of layer {layer} failed ({} at byte {offset}): {source}; the lookup's \
         outputs are not valid",
        file.display()
    )]
    RowRead {
        layer: u32,
        rows: RowIds,
        file: PathBuf,
        offset: u64,
        #[source]
        source: std::io::Error,
    },

    #[error(
        "{}: the shard changed since the store opened ({why}); a table rewritten in place under \
         an open store would serve new weights beside old scales, so this lookup's outputs are \
         not valid: reopen the store to read the new table",
        file.display()
    )]
    ShardChanged { file: PathBuf, why: String },

    #[error("read path {path} is not available here: {why}")]
    ReadPathUnavailable { path: &'static str, why: String },

    #[error(
        "{}: is {kind}, not a regular file; refusing to read it (a FIFO or device could block \
         or never end)",
        file.display()
    )]
    NotRegularFile { file: PathBuf, kind: &'static str },

    #[error(
        "{what} would take {bytes} bytes ({:.2} GiB) of memory{}; refusing to allocate it",
        *bytes as f64 / (1u64 << 30) as f64,
        available.map_or_else(
            || " and the allocation failed".to_string(),
            |a| format!(
                " but only {a} bytes ({:.2} GiB) are available",
                a as f64 / (1u64 << 30) as f64
            )
        )
    )]
    OutOfMemory {
        what: String,
        bytes: u64,
        available: Option<u64>,
    },

    #[error(
        "{}: writing needs {need} bytes ({:.2} GiB) but the filesystem has {available} bytes \
         ({:.2} GiB) free; nothing was written",
        dir.display(),
        *need as f64 / (1u64 << 30) as f64,
        *available as f64 / (1u64 << 30) as f64
    )]
    NoSpace {
        dir: PathBuf,
        need: u64,
        available: u64,
    },

    #[error("{}: refusing to write: {why}", path.display())]
    WouldOverwrite { path: PathBuf, why: String },

    #[error(
        "the table's layers disagree in rows ({}); every Engram layer of a table must have the \
         same rows",
        rows.iter().map(|(l, r)| format!("layer {l}: {r} rows")).collect::<Vec<_>>().join(", ")
    )]
    LayerRowsDiffer { rows: Vec<(u32, u64)> },
}

/// What kind of failure an [`Error`] is: the one mapping from which the C ABI's status codes
/// (`ffi`) and the Python package's exception classes are both made.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ErrorKind {
    Cuda,
    NoDevice,
    NoPtx,
    InvalidArgument,
    IdsOutOfRange,
    RowId,
    RowLookup,
    RowRead,
    StagingFull,
    NotWarmed,
    PrefetchOrder,
    /// A file operation failed for another reason than the two below.
    File,
    /// The file does not exist (Python: also a `FileNotFoundError`).
    FileNotFound,
    /// The file may not be opened or written (Python: also a `PermissionError`).
    FilePermission,
    Table,
    ReadPathUnavailable,
    OutOfMemory,
    NoSpace,
    WouldOverwrite,
}

impl ErrorKind {
    /// Every kind, in declaration order.
    pub const ALL: [ErrorKind; 19] = [
        ErrorKind::Cuda,
        ErrorKind::NoDevice,
        ErrorKind::NoPtx,
        ErrorKind::InvalidArgument,
        ErrorKind::IdsOutOfRange,
        ErrorKind::RowId,
        ErrorKind::RowLookup,
        ErrorKind::RowRead,
        ErrorKind::StagingFull,
        ErrorKind::NotWarmed,
        ErrorKind::PrefetchOrder,
        ErrorKind::File,
        ErrorKind::FileNotFound,
        ErrorKind::FilePermission,
        ErrorKind::Table,
        ErrorKind::ReadPathUnavailable,
        ErrorKind::OutOfMemory,
        ErrorKind::NoSpace,
        ErrorKind::WouldOverwrite,
    ];

    /// The class of `fetchahead.errors` that Python raises for this kind.
    pub fn python_class(self) -> &'static str {
        match self {
            ErrorKind::Cuda => "CudaError",
            ErrorKind::NoDevice => "NoDeviceError",
            ErrorKind::NoPtx => "NoPtxError",
            ErrorKind::InvalidArgument => "InvalidArgumentError",
            ErrorKind::IdsOutOfRange => "IdsOutOfRangeError",
            ErrorKind::RowId => "RowIdError",
            ErrorKind::RowLookup => "RowLookupError",
            ErrorKind::RowRead => "RowReadError",
            ErrorKind::StagingFull => "StagingFullError",
            ErrorKind::NotWarmed => "NotWarmedError",
            ErrorKind::PrefetchOrder => "PrefetchOrderError",
            ErrorKind::File => "FileError",
            ErrorKind::FileNotFound => "MissingFileError",
            ErrorKind::FilePermission => "FilePermissionError",
            ErrorKind::Table => "TableError",
            ErrorKind::ReadPathUnavailable => "ReadPathUnavailableError",
            ErrorKind::OutOfMemory => "OutOfMemoryError",
            ErrorKind::NoSpace => "NoSpaceError",
            ErrorKind::WouldOverwrite => "WouldOverwriteError",
        }
    }
}

/// Row ids named by an error; prints the first few and the count.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RowIds(pub Vec<u64>);

impl fmt::Display for RowIds {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const SHOWN: usize = 16;
        let ids = &self.0;
        write!(f, "[")?;
        for (i, id) in ids.iter().take(SHOWN).enumerate() {
            if i > 0 {
                write!(f, ", ")?;
            }
            write!(f, "{id}")?;
        }
        if ids.len() > SHOWN {
            write!(f, ", ... ({} rows in all)", ids.len())?;
        }
        write!(f, "]")
    }
}

impl Error {
    /// The kind of failure: what the C status code and the Python class are made from.
    pub fn kind(&self) -> ErrorKind {
        use std::io::ErrorKind as Io;
        match self {
            Error::Cuda { .. } => ErrorKind::Cuda,
            Error::NoDevice(_) => ErrorKind::NoDevice,
            Error::NoPtxForDevice { .. }
            | Error::UnknownArch { .. }
            | Error::KernelNeedsArch { .. } => ErrorKind::NoPtx,
            Error::Invalid { .. } => ErrorKind::InvalidArgument,
            Error::IdsOutOfRange { .. } => ErrorKind::IdsOutOfRange,
            Error::RowOutOfRange { .. } | Error::RowsOutOfRange { .. } => ErrorKind::RowId,
            Error::InjectedFault { .. } | Error::LookupPanicked(_) | Error::ShardChanged { .. } => {
                ErrorKind::RowLookup
            }
            Error::RowRead { .. } => ErrorKind::RowRead,
            Error::StagingFull { .. } => ErrorKind::StagingFull,
            Error::NotWarmed { .. } => ErrorKind::NotWarmed,
            Error::PrefetchOrder(_) => ErrorKind::PrefetchOrder,
            Error::Io { source, .. } => match source.kind() {
                Io::NotFound => ErrorKind::FileNotFound,
                Io::PermissionDenied => ErrorKind::FilePermission,
                _ => ErrorKind::File,
            },
            Error::NotRegularFile { .. } => ErrorKind::File,
            Error::TableHeader { .. }
            | Error::TableIndex { .. }
            | Error::MissingTensor { .. }
            | Error::BadTensor { .. }
            | Error::TruncatedShard { .. }
            | Error::NoSuchLayer { .. }
            | Error::LayerRowsDiffer { .. } => ErrorKind::Table,
            Error::ReadPathUnavailable { .. } => ErrorKind::ReadPathUnavailable,
            Error::OutOfMemory { .. } => ErrorKind::OutOfMemory,
            Error::NoSpace { .. } => ErrorKind::NoSpace,
            Error::WouldOverwrite { .. } => ErrorKind::WouldOverwrite,
        }
    }

    pub(crate) fn io(file: impl Into<PathBuf>, op: &'static str, source: std::io::Error) -> Self {
        Error::Io {
            file: file.into(),
            op,
            source,
        }
    }

    /// A bad argument: `what` it is and why.
    pub fn invalid(what: &'static str, why: impl Into<String>) -> Self {
        Error::Invalid {
            what,
            why: why.into(),
        }
    }
}

/// Names the driver call a `DriverError` came from (the lab's calls too).
pub trait CudaCall<T> {
    fn call(self, call: &'static str) -> Result<T>;
}

impl<T> CudaCall<T> for std::result::Result<T, DriverError> {
    fn call(self, call: &'static str) -> Result<T> {
        self.map_err(|source| Error::Cuda { call, source })
    }
}
