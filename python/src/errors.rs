//! The crate's `Error` as the exception classes of `fetchahead.errors`, with the fields a user
//! acts on as attributes.
use fetchahead::Error;
use fetchahead::error::ErrorKind;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyDict, PyModule};

/// The exception class name for `e`, and its attributes: the variants by family, each family's
/// attributes set by its own function (this match is the exhaustive list).
fn classify<'py>(py: Python<'py>, e: &Error) -> PyResult<(&'static str, Bound<'py, PyDict>)> {
    let a = PyDict::new(py);
    match e {
        Error::Cuda { .. }
        | Error::NoDevice(_)
        | Error::NoPtxForDevice { .. }
        | Error::UnknownArch { .. }
        | Error::KernelNeedsArch { .. } => device_attrs(&a, e)?,
        Error::IdsOutOfRange { .. }
        | Error::RowOutOfRange { .. }
        | Error::RowsOutOfRange { .. }
        | Error::InjectedFault { .. }
        | Error::LookupPanicked(_)
        | Error::RowRead { .. }
        | Error::NoSuchLayer { .. }
        | Error::ReadPathUnavailable { .. } => row_attrs(&a, e)?,
        Error::StagingFull { .. }
        | Error::NotWarmed { .. }
        | Error::PrefetchOrder(_)
        | Error::Invalid { .. }
        | Error::OutOfMemory { .. } => usage_attrs(&a, e)?,
        Error::Io { .. }
        | Error::TableHeader { .. }
        | Error::TableIndex { .. }
        | Error::ShardChanged { .. }
        | Error::MissingTensor { .. }
        | Error::BadTensor { .. }
        | Error::TruncatedShard { .. }
        | Error::NotRegularFile { .. }
        | Error::NoSpace { .. }
        | Error::WouldOverwrite { .. }
        | Error::LayerRowsDiffer { .. } => file_attrs(&a, e)?,
    }
    Ok((class_of(e.kind()), a))
}

/// The attributes of the device's errors: CUDA calls, no device, no PTX for it.
fn device_attrs(a: &Bound<'_, PyDict>, e: &Error) -> PyResult<()> {
    match e {
        Error::Cuda { call, source } => {
            a.set_item("call", *call)?;
            a.set_item("code", source.0 as u32)?;
        }
        Error::NoDevice(why) => {
            a.set_item("why", why)?;
        }
        Error::NoPtxForDevice {
            device,
            wanted,
            built,
            ..
        } => {
            a.set_item("device", device)?;
            a.set_item("arch", wanted)?;
            a.set_item("built", built)?;
        }
        Error::UnknownArch { arch, built } => {
            a.set_item("arch", arch)?;
            a.set_item("built", built)?;
        }
        Error::KernelNeedsArch {
            kernel,
            needs,
            loaded,
            ..
        } => {
            a.set_item("kernel", *kernel)?;
            a.set_item("arch", format!("sm_{needs}"))?;
            a.set_item("built", *loaded)?;
        }
        // The other families' variants: `classify` sends them to their own functions.
        _ => {}
    }
    Ok(())
}

/// The attributes of the errors of ids and rows: out of range, failed lookups and reads, a
/// layer or read path that is not there.
fn row_attrs(a: &Bound<'_, PyDict>, e: &Error) -> PyResult<()> {
    match e {
        Error::IdsOutOfRange {
            count,
            n,
            rows,
            first_index,
            first_id,
        } => {
            a.set_item("count", *count)?;
            a.set_item("n", *n)?;
            a.set_item("rows", *rows)?;
            a.set_item("first_index", *first_index)?;
            a.set_item("first_id", *first_id)?;
        }
        Error::RowOutOfRange { id, rows } => {
            a.set_item("row_ids", vec![*id])?;
            a.set_item("rows", *rows)?;
        }
        Error::RowsOutOfRange {
            count,
            n,
            start,
            end,
            first_index,
            first_id,
        } => {
            a.set_item("row_ids", vec![*first_id])?;
            a.set_item("count", *count)?;
            a.set_item("n", *n)?;
            a.set_item("row_range", (*start, *end))?;
            a.set_item("first_index", *first_index)?;
        }
        Error::InjectedFault { id } => {
            a.set_item("row_ids", vec![*id])?;
        }
        Error::LookupPanicked(why) => {
            a.set_item("why", why)?;
        }
        Error::RowRead {
            layer,
            rows,
            file,
            offset,
            ..
        } => {
            a.set_item("layer", *layer)?;
            a.set_item("row_ids", rows.0.clone())?;
            a.set_item("file", file.display().to_string())?;
            a.set_item("offset", *offset)?;
        }
        Error::NoSuchLayer { layer, have } => {
            a.set_item("layer", *layer)?;
            a.set_item("layers", have.clone())?;
        }
        Error::ReadPathUnavailable { path, why } => {
            a.set_item("path", *path)?;
            a.set_item("why", why)?;
        }
        // The other families' variants: `classify` sends them to their own functions.
        _ => {}
    }
    Ok(())
}

/// The attributes of the errors of a call's use: a bad argument, staging too small, the
/// prefetcher used before it was warmed or out of order, more memory than there is.
fn usage_attrs(a: &Bound<'_, PyDict>, e: &Error) -> PyResult<()> {
    match e {
        Error::StagingFull { count, capacity } => {
            a.set_item("count", *count)?;
            a.set_item("capacity", *capacity)?;
        }
        Error::NotWarmed { what } => {
            a.set_item("what", *what)?;
        }
        Error::PrefetchOrder(why) => {
            a.set_item("why", *why)?;
        }
        Error::Invalid { what, why } => {
            a.set_item("argument", *what)?;
            a.set_item("why", why)?;
        }
        Error::OutOfMemory {
            what,
            bytes,
            available,
        } => {
            a.set_item("what", what)?;
            a.set_item("bytes", *bytes)?;
            a.set_item("available", *available)?;
        }
        // The other families' variants: `classify` sends them to their own functions.
        _ => {}
    }
    Ok(())
}

/// The attributes of the errors of files and tables: a failed file operation, a bad or
/// changed table, no room, a file not ours to overwrite.
fn file_attrs(a: &Bound<'_, PyDict>, e: &Error) -> PyResult<()> {
    match e {
        Error::Io { file, op, source } => {
            a.set_item("file", file.display().to_string())?;
            a.set_item("op", *op)?;
            a.set_item("errno", source.raw_os_error())?;
        }
        Error::TableHeader { file, .. } | Error::TableIndex { file, .. } => {
            a.set_item("file", file.display().to_string())?;
        }
        Error::ShardChanged { file, why } => {
            a.set_item("file", file.display().to_string())?;
            a.set_item("why", why)?;
        }
        Error::MissingTensor { file, tensor } | Error::BadTensor { file, tensor, .. } => {
            a.set_item("file", file.display().to_string())?;
            a.set_item("tensor", tensor)?;
        }
        Error::TruncatedShard {
            file,
            tensor,
            len,
            end,
        } => {
            a.set_item("file", file.display().to_string())?;
            a.set_item("tensor", tensor)?;
            a.set_item("file_bytes", *len)?;
            a.set_item("tensor_end", *end)?;
        }
        Error::NotRegularFile { file, kind } => {
            a.set_item("file", file.display().to_string())?;
            a.set_item("op", "open")?;
            a.set_item("kind", *kind)?;
        }
        Error::NoSpace {
            dir,
            need,
            available,
        } => {
            a.set_item("file", dir.display().to_string())?;
            a.set_item("need", *need)?;
            a.set_item("available", *available)?;
        }
        Error::WouldOverwrite { path, why } => {
            a.set_item("file", path.display().to_string())?;
            a.set_item("why", why)?;
        }
        Error::LayerRowsDiffer { rows } => {
            a.set_item("layer_rows", rows.clone())?;
        }
        // The other families' variants: `classify` sends them to their own functions.
        _ => {}
    }
    Ok(())
}

/// The class of `fetchahead.errors` that Python raises for errors of `kind` (C's status code is
/// made from the same kind, `fetchahead::ffi`).
pub fn class_of(kind: ErrorKind) -> &'static str {
    match kind {
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

/// The Python exception for `e`: `fetchahead.errors.<Class>(message, **attributes)`.
pub fn to_py(py: Python<'_>, e: Error) -> PyErr {
    static MODULE: PyOnceLock<Py<PyModule>> = PyOnceLock::new();
    let made = (|| -> PyResult<PyErr> {
        let module =
            MODULE.get_or_try_init(py, || py.import("fetchahead.errors").map(Bound::unbind))?;
        let (class, attrs) = classify(py, &e)?;
        let exc = module
            .bind(py)
            .getattr(class)?
            .call((e.to_string(),), Some(&attrs))?;
        Ok(PyErr::from_value(exc))
    })();
    made.unwrap_or_else(|err| err)
}

/// One error of each kind, for the tests of the mapping.
pub fn example(kind: &str) -> Error {
    use std::io;
    use std::path::PathBuf;
    let file = PathBuf::from("/models/engram/shard-0.safetensors");
    match kind {
        "cuda" => Error::Cuda {
            call: "cuLaunchKernel",
            source: cudarc::driver::DriverError(
                cudarc::driver::sys::cudaError_enum::CUDA_ERROR_INVALID_VALUE,
            ),
        },
        "no_device" => Error::NoDevice("no device here".into()),
        "no_ptx" => Error::UnknownArch {
            arch: "sm_70".into(),
            built: "sm_90".into(),
        },
        "ids_out_of_range" => Error::IdsOutOfRange {
            count: 2,
            n: 8,
            rows: 100,
            first_index: 3,
            first_id: 1000,
        },
        "row_id" => Error::RowsOutOfRange {
            count: 1,
            n: 4,
            start: 0,
            end: 10,
            first_index: 2,
            first_id: 99,
        },
        "row_lookup" => Error::InjectedFault { id: 7 },
        "row_read" => Error::RowRead {
            layer: 2,
            rows: fetchahead::error::RowIds(vec![5, 6, 7]),
            file: file.clone(),
            offset: 4096,
            source: io::Error::from_raw_os_error(5),
        },
        "staging_full" => Error::StagingFull {
            count: 5000,
            capacity: 4096,
        },
        "not_warmed" => Error::NotWarmed {
            what: "the prefetcher",
        },
        "prefetch_order" => Error::PrefetchOrder("gather_dequant without a prefetch"),
        "file" => Error::Io {
            file: file.clone(),
            op: "read",
            source: io::Error::from_raw_os_error(5),
        },
        "file_not_found" => Error::Io {
            file: file.clone(),
            op: "open",
            source: io::Error::from_raw_os_error(2),
        },
        "file_permission" => Error::Io {
            file: file.clone(),
            op: "open",
            source: io::Error::from_raw_os_error(13),
        },
        "table" => Error::MissingTensor {
            file,
            tensor: "engram.2.weight".into(),
        },
        "out_of_memory" => Error::OutOfMemory {
            what: "the row cache".into(),
            bytes: 1 << 40,
            available: Some(1 << 30),
        },
        "no_space" => Error::NoSpace {
            dir: PathBuf::from("/models/engram"),
            need: 1 << 30,
            available: 1 << 20,
        },
        "would_overwrite" => Error::WouldOverwrite {
            path: PathBuf::from("/models/engram/model.safetensors"),
            why: "it is not a table this tool wrote; pass --force".into(),
        },
        "not_regular_file" => Error::NotRegularFile {
            file: PathBuf::from("/tmp/fifo"),
            kind: "a FIFO",
        },
        "read_path" => Error::ReadPathUnavailable {
            path: "uring",
            why: "io_uring is disabled".into(),
        },
        _ => Error::Invalid {
            what: "kind",
            why: format!("no example error `{kind}`"),
        },
    }
}
