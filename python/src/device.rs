//! One device's loaded kernels, shared by the Python `Device` class and the native torch
//! kernels (`torch_abi`), and the one launch path both take.
use std::sync::{Arc, Mutex, PoisonError};

use cudarc::driver::sys;
use fetchahead::device_abi::params::{DequantParams, GatherParams, TimelineParams};
use fetchahead::error::CudaCall;
use fetchahead::kernels::{IdCheck, Kernels};

use crate::{Family, Handle, Variant};

/// The kernels of one device, its default variant of each family, and a scratch id status
/// for launches given none.
pub(crate) struct DeviceKernels {
    pub kernels: Arc<Kernels>,
    /// The `IdStatus` launches without a status of their own record into (never read).
    scratch: IdCheck,
    gather_default: Handle,
    dequant_default: Handle,
}

/// The kernels of device `ordinal`, loaded on first use and kept for the process (as torch
/// keeps its context): a lock and a scan of a list of devices a call.
pub(crate) fn on_device(ordinal: usize) -> fetchahead::Result<Arc<DeviceKernels>> {
    static LOADED: Mutex<Vec<(usize, Arc<DeviceKernels>)>> = Mutex::new(Vec::new());
    let mut loaded = LOADED.lock().unwrap_or_else(PoisonError::into_inner);
    if let Some((_, found)) = loaded.iter().find(|(o, _)| *o == ordinal) {
        return Ok(found.clone());
    }
    let kernels = Kernels::shared(ordinal)?;
    let stream = kernels.gpu().ctx.default_stream();
    let scratch = IdCheck::new(&stream)?;
    // Clean before a launch on another stream (the caller's) records into it.
    stream.synchronize().call("cuStreamSynchronize")?;
    let defaults = kernels.defaults();
    let Variant(gather_default) = Family::Gather.variant(None, defaults)?;
    let Variant(dequant_default) = Family::Dequant.variant(None, defaults)?;
    let made = Arc::new(DeviceKernels {
        kernels,
        scratch,
        gather_default,
        dequant_default,
    });
    loaded.push((ordinal, made.clone()));
    Ok(made)
}

/// What one launch reads and writes: device addresses (`scales` 0 for a gather, `status` 0
/// for the scratch status) and the shape.
pub(crate) struct Launch {
    pub table: u64,
    pub scales: u64,
    /// Rows of the table.
    pub rows: u64,
    /// Bytes of a gather's row, elements of a gather + dequant's.
    pub width: u32,
    pub ids: u64,
    pub n: u64,
    pub out: u64,
    pub status: u64,
}

impl DeviceKernels {
    /// `family`'s variant `name`, or this device's default for None.
    pub fn variant(&self, family: Family, name: Option<&str>) -> fetchahead::Result<Handle> {
        match (name, family) {
            (None, Family::Gather) => Ok(self.gather_default),
            (None, Family::Dequant) => Ok(self.dequant_default),
            (Some(_), _) => Ok(family.variant(name, self.kernels.defaults())?.0),
        }
    }

    /// Launches `variant` on `stream`.
    ///
    /// # Safety
    /// The caller checked each address against the shape (devices, sizes, dtypes, alignment),
    /// and the memory outlives the launch in `stream`'s order.
    pub unsafe fn launch(
        &self,
        variant: Handle,
        at: &Launch,
        stream: sys::CUstream,
    ) -> fetchahead::Result<()> {
        let status = if at.status == 0 {
            self.scratch.address()
        } else {
            at.status
        };
        let timeline = TimelineParams::OFF;
        // SAFETY: the caller's contract, passed on.
        unsafe {
            match variant {
                Handle::Gather(v) => self.kernels.launch_gather(
                    stream,
                    v.for_rows(at.n),
                    GatherParams {
                        table: at.table,
                        ids: at.ids,
                        out: at.out,
                        status,
                        n: at.n,
                        rows: at.rows,
                        row_bytes: at.width,
                        _pad: 0,
                        timeline,
                    },
                ),
                Handle::Dequant(v) => self.kernels.launch_gather_dequant(
                    stream,
                    v.for_rows(at.n),
                    DequantParams {
                        weights: at.table,
                        scales: at.scales,
                        ids: at.ids,
                        out: at.out,
                        rows: at.rows,
                        n: fetchahead::kernels::dequant_rows(at.n)?,
                        dim: at.width,
                        status,
                        timeline,
                    },
                ),
            }
        }
    }
}
