//! Row tables the kernels read: in device memory, or in pinned host memory mapped for the device
//! (read over the bus through unified addressing; on the GB10 host and GPU share that memory).
use std::sync::Arc;

use cudarc::driver::{
    CudaContext, CudaSlice, CudaStream, DevicePtr, DevicePtrMut, PinnedHostSlice,
};
use fetchahead_gpu::dequant::DequantVariant;
use fetchahead_gpu::gather::GatherVariant;
use fetchahead_gpu::params::{DequantParams, GatherParams, MX_BLOCK};

use crate::driver;
use crate::error::CudaCall;
use crate::kernels::Kernels;
use crate::kernels::id_check::IdCheck;
use crate::{Error, Result};

/// Where a table's bytes live.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Placement {
    Device,
    /// Pinned host memory mapped into the device's address space.
    PinnedHost,
}

/// One allocation of table bytes and the address the kernels read it at.
#[derive(Debug)]
pub enum TableMemory {
    Device(CudaSlice<u8>),
    PinnedHost {
        host: PinnedHostSlice<u8>,
        device_address: u64,
    },
}

impl TableMemory {
    /// Copies `bytes` into a new allocation of the given placement.
    pub fn from_bytes(
        stream: &Arc<CudaStream>,
        bytes: &[u8],
        placement: Placement,
    ) -> Result<Self> {
        match placement {
            Placement::Device => Ok(TableMemory::Device(
                stream.clone_htod(bytes).call("cuMemcpyHtoD")?,
            )),
            Placement::PinnedHost => {
                let mut memory = TableMemory::pinned_host(stream.context(), bytes.len())?;
                if let TableMemory::PinnedHost { host, .. } = &mut memory {
                    host.as_mut_slice()
                        .call("cuEventSynchronize")?
                        .copy_from_slice(bytes);
                }
                Ok(memory)
            }
        }
    }

    /// `len` bytes of pinned host memory, mapped for the device, cached for CPU reads and writes
    /// (not write-combined), contents unspecified until written.
    pub fn pinned_host(ctx: &Arc<CudaContext>, len: usize) -> Result<Self> {
        let (host, device_address) = driver::memory::mapped_pinned(ctx, len)?;
        Ok(TableMemory::PinnedHost {
            host,
            device_address,
        })
    }

    /// The address kernels read the table at.
    pub fn address(&mut self, stream: &CudaStream) -> u64 {
        match self {
            TableMemory::Device(slice) => slice.device_ptr_mut(stream).0,
            TableMemory::PinnedHost { device_address, .. } => *device_address,
        }
    }

    pub fn len(&self) -> usize {
        match self {
            TableMemory::Device(slice) => slice.len(),
            TableMemory::PinnedHost { host, .. } => host.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A table of `rows` rows of `row_bytes` bytes.
#[derive(Debug)]
pub struct RowTable {
    pub memory: TableMemory,
    pub rows: u64,
    pub row_bytes: u32,
}

impl RowTable {
    pub fn from_bytes(
        stream: &Arc<CudaStream>,
        bytes: &[u8],
        row_bytes: u32,
        placement: Placement,
    ) -> Result<Self> {
        if row_bytes == 0 || !bytes.len().is_multiple_of(row_bytes as usize) {
            return Err(Error::invalid(
                "table",
                format!(
                    "{} bytes is not a whole number of {row_bytes}-byte rows",
                    bytes.len()
                ),
            ));
        }
        Ok(RowTable {
            memory: TableMemory::from_bytes(stream, bytes, placement)?,
            rows: (bytes.len() / row_bytes as usize) as u64,
            row_bytes,
        })
    }

    /// `out[i] = row ids[i]` with gather `variant`; a bad id writes a zero row and is kept in
    /// `check` (read it with [`IdCheck::take`]).
    #[allow(clippy::too_many_arguments)]
    pub fn gather(
        &mut self,
        kernels: &Kernels,
        stream: &Arc<CudaStream>,
        variant: GatherVariant,
        ids: &CudaSlice<i64>,
        out: &mut CudaSlice<u8>,
        check: &IdCheck,
    ) -> Result<()> {
        let n = ids.len() as u64;
        if (out.len() as u64) < n * self.row_bytes as u64 {
            return Err(Error::invalid(
                "output",
                format!(
                    "{} bytes for {n} rows of {} bytes",
                    out.len(),
                    self.row_bytes
                ),
            ));
        }
        // The guards record the slices' use on `stream` when they drop, after the launch.
        let (ids_address, _ids_use) = ids.device_ptr(stream);
        let (out_address, _out_use) = out.device_ptr_mut(stream);
        let p = GatherParams {
            table: self.memory.address(stream),
            ids: ids_address,
            out: out_address,
            status: check.address(),
            n,
            rows: self.rows,
            row_bytes: self.row_bytes,
            _pad: 0,
            timeline: fetchahead_gpu::params::TimelineParams::OFF,
        };
        // SAFETY: every address belongs to an allocation of the size the kernel reads or writes,
        // all of which outlive the launch's stream order (the slices record their use).
        unsafe { kernels.launch_gather(stream.cu_stream(), variant, p) }
    }
}

/// An MXFP8 table: `[rows, dim]` FP8-E4M3 weights and `[rows, dim / 32]` E8M0 scales.
#[derive(Debug)]
pub struct Mxfp8Table {
    pub weights: TableMemory,
    pub scales: TableMemory,
    pub rows: u64,
    pub dim: u32,
}

impl Mxfp8Table {
    pub fn from_bytes(
        stream: &Arc<CudaStream>,
        weights: &[u8],
        scales: &[u8],
        dim: u32,
        placement: Placement,
    ) -> Result<Self> {
        if dim == 0 || !dim.is_multiple_of(MX_BLOCK) || !weights.len().is_multiple_of(dim as usize)
        {
            return Err(Error::invalid(
                "table",
                format!(
                    "{} weight bytes with dim {dim} (a multiple of 32)",
                    weights.len()
                ),
            ));
        }
        let rows = weights.len() / dim as usize;
        if scales.len() != rows * (dim / MX_BLOCK) as usize {
            return Err(Error::invalid(
                "table",
                format!("{} scale bytes for {rows} rows of dim {dim}", scales.len()),
            ));
        }
        Ok(Mxfp8Table {
            weights: TableMemory::from_bytes(stream, weights, placement)?,
            scales: TableMemory::from_bytes(stream, scales, placement)?,
            rows: rows as u64,
            dim,
        })
    }

    /// `out[i] = bf16(row ids[i])` (`out` as bf16 bits) with gather + dequant `variant`.
    pub fn gather_dequant(
        &mut self,
        kernels: &Kernels,
        stream: &Arc<CudaStream>,
        variant: DequantVariant,
        ids: &CudaSlice<i64>,
        out: &mut CudaSlice<u16>,
        check: &IdCheck,
    ) -> Result<()> {
        let n = ids.len() as u64;
        if (out.len() as u64) < n * self.dim as u64 {
            return Err(Error::invalid(
                "output",
                format!("{} bf16 for {n} rows of dim {}", out.len(), self.dim),
            ));
        }
        // The guards record the slices' use on `stream` when they drop, after the launch.
        let (ids_address, _ids_use) = ids.device_ptr(stream);
        let (out_address, _out_use) = out.device_ptr_mut(stream);
        let p = DequantParams {
            weights: self.weights.address(stream),
            scales: self.scales.address(stream),
            ids: ids_address,
            out: out_address,
            n: crate::kernels::dequant_rows(n)?,
            rows: self.rows,
            dim: self.dim,
            status: check.address(),
            timeline: fetchahead_gpu::params::TimelineParams::OFF,
        };
        // SAFETY: every address belongs to an allocation of the size the kernel reads or writes.
        unsafe { kernels.launch_gather_dequant(stream.cu_stream(), variant, p) }
    }
}
