//! Staging for one lookup path: pinned host buffers the lookup fills (ids, weights, scales) and
//! their device mirrors the gather reads, sized once to a power-of-two number of rows.
//!
//! Everything a prefetch or gather will touch is allocated and used once by `StagingBuffers::warm`,
//! before any graph capture: a capture must not be the first use of a buffer or a kernel.
use std::sync::Arc;

use cudarc::driver::{CudaSlice, CudaStream, DevicePtr, PinnedHostSlice, sys};
use fetchahead_gpu::dequant::DequantVariant;
use fetchahead_gpu::params::{DequantParams, MX_BLOCK, StagedParams};

use crate::driver::stream;
use crate::error::CudaCall;
use crate::kernels::Kernels;
use crate::kernels::id_check::IdCheck;
use crate::{Error, Result};

/// The rows staged per lookup, rounded up to a power of two, and the row width.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StagingLayout {
    capacity: usize,
    dim: usize,
}

impl StagingLayout {
    /// The most rows one staging set holds (2^24: 4 GiB of 256-element rows).
    pub const MAX_CAPACITY: usize = 1 << 24;
    /// The widest row (elements).
    pub const MAX_DIM: usize = 1 << 16;

    /// Room for `rows` rows (at least one) of `dim` elements (a multiple of 32).
    pub fn new(rows: usize, dim: usize) -> Result<StagingLayout> {
        if rows == 0 || rows > Self::MAX_CAPACITY {
            return Err(Error::invalid(
                "staging capacity",
                format!("{rows} rows; it must be 1..={}", Self::MAX_CAPACITY),
            ));
        }
        if dim == 0 || !dim.is_multiple_of(MX_BLOCK as usize) || dim > Self::MAX_DIM {
            return Err(Error::invalid(
                "staging dim",
                format!("{dim} is not a multiple of 32 in 32..={}", Self::MAX_DIM),
            ));
        }
        Ok(StagingLayout {
            capacity: rows.next_power_of_two(),
            dim,
        })
    }

    /// Rows the buffers hold: a power of two.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    pub fn dim(&self) -> usize {
        self.dim
    }

    /// Whether `count` rows fit.
    pub fn check_count(&self, count: usize) -> Result<()> {
        if count > self.capacity {
            return Err(Error::StagingFull {
                count,
                capacity: self.capacity,
            });
        }
        Ok(())
    }

    /// FP8 weight bytes of `count` rows.
    pub fn weight_bytes(&self, count: usize) -> usize {
        count * self.dim
    }

    /// E8M0 scale bytes of `count` rows.
    pub fn scale_bytes(&self, count: usize) -> usize {
        count * self.dim / MX_BLOCK as usize
    }
}

/// The pinned host buffers, as raw pointers a host function can write through.
#[derive(Clone, Copy, Debug)]
pub(crate) struct HostSpans {
    /// `capacity` ids, copied from the device: cached memory, read by the CPU.
    pub ids: *mut i64,
    /// `capacity * dim` bytes, written by the lookup, read by the copy engine.
    pub weights: *mut u8,
    /// `capacity * dim / 32` bytes, likewise.
    pub scales: *mut u8,
}

/// The device mirrors and what the gather of staged rows reads.
#[derive(Clone, Copy, Debug)]
pub(crate) struct DeviceSpans {
    pub weights: u64,
    pub scales: u64,
    /// `capacity` int64 ids `0, 1, 2, ...`: staged row `i` is row `i` of the mirrors.
    pub arange: u64,
    /// `capacity` int64: the id staged row `i` holds (written after the rows, for the tagged
    /// gather), `i64::MIN` before any.
    pub tags: u64,
    pub status: u64,
}

/// Pinned host buffers and their device mirrors for one lookup path.
#[derive(Debug)]
pub(crate) struct StagingBuffers {
    layout: StagingLayout,
    host: HostSpans,
    device: DeviceSpans,
    warmed: bool,
    /// One bf16 row the warm-up gather writes.
    scratch: CudaSlice<u16>,
    _arange: CudaSlice<i64>,
    _tags: CudaSlice<i64>,
    _weights: CudaSlice<u8>,
    _scales: CudaSlice<u8>,
    status: IdCheck,
    _host_ids: PinnedHostSlice<i64>,
    _host_weights: PinnedHostSlice<u8>,
    _host_scales: PinnedHostSlice<u8>,
}

// SAFETY: the raw pointers in `host` point into the pinned allocations this struct owns; they are
// written only by the host function of the stream that owns this staging set, in stream order.
unsafe impl Send for StagingBuffers {}
// SAFETY: as above; shared references expose the pointers but write nothing through them.
unsafe impl Sync for StagingBuffers {}

impl StagingBuffers {
    /// Allocates the buffers on `stream`'s device (not yet warm).
    pub fn new(stream: &Arc<CudaStream>, layout: StagingLayout) -> Result<StagingBuffers> {
        let ctx = stream.context();
        let cap = layout.capacity;
        // The ids come back from the device to be read by the CPU: cached, not write-combined.
        // SAFETY: contents are unspecified until written; `warm` zeroes them.
        let mut host_ids =
            unsafe { ctx.alloc_pinned_with_flags::<i64>(cap, 0) }.call("cuMemHostAlloc")?;
        // Rows are written by the CPU and read by the copy engine only: write-combined.
        let wc = sys::CU_MEMHOSTALLOC_WRITECOMBINED;
        // SAFETY: as above.
        let mut host_weights =
            unsafe { ctx.alloc_pinned_with_flags::<u8>(layout.weight_bytes(cap), wc) }
                .call("cuMemHostAlloc")?;
        // SAFETY: as above.
        let mut host_scales =
            unsafe { ctx.alloc_pinned_with_flags::<u8>(layout.scale_bytes(cap), wc) }
                .call("cuMemHostAlloc")?;
        let host = HostSpans {
            ids: host_ids.as_mut_ptr().call("cuEventSynchronize")?,
            weights: host_weights.as_mut_ptr().call("cuEventSynchronize")?,
            scales: host_scales.as_mut_ptr().call("cuEventSynchronize")?,
        };
        let arange: Vec<i64> = (0..cap as i64).collect();
        let arange = stream.clone_htod(&arange).call("cuMemcpyHtoD")?;
        // No id equals i64::MIN before the first lookup: an id that does is invalid, so its
        // lookup stages a zero row, the zeroed bytes below.
        let tags = stream
            .clone_htod(&vec![i64::MIN; cap])
            .call("cuMemcpyHtoD")?;
        let weights = stream
            .alloc_zeros::<u8>(layout.weight_bytes(cap))
            .call("cuMemAlloc")?;
        let scales = stream
            .alloc_zeros::<u8>(layout.scale_bytes(cap))
            .call("cuMemAlloc")?;
        let scratch = stream.alloc_zeros::<u16>(layout.dim).call("cuMemAlloc")?;
        let status = IdCheck::new(stream)?;
        let device = DeviceSpans {
            weights: weights.device_ptr(stream).0,
            scales: scales.device_ptr(stream).0,
            arange: arange.device_ptr(stream).0,
            tags: tags.device_ptr(stream).0,
            status: status.address(),
        };
        stream.synchronize().call("cuStreamSynchronize")?;
        Ok(StagingBuffers {
            layout,
            host,
            device,
            warmed: false,
            scratch,
            _arange: arange,
            _tags: tags,
            _weights: weights,
            _scales: scales,
            status,
            _host_ids: host_ids,
            _host_weights: host_weights,
            _host_scales: host_scales,
        })
    }

    pub fn layout(&self) -> StagingLayout {
        self.layout
    }

    pub fn host(&self) -> HostSpans {
        self.host
    }

    pub fn device(&self) -> DeviceSpans {
        self.device
    }

    /// Rows the tagged gathers since the last call gave up on, and the first of them (waits for
    /// `stream`).
    pub fn take_late(&mut self, stream: &Arc<CudaStream>) -> Result<(u32, u64)> {
        self.status.take_count(stream)
    }

    pub fn is_warm(&self) -> bool {
        self.warmed
    }

    /// The gather of the first `count` staged rows into `out` (`count * dim` bf16).
    pub fn gather_params(&self, out: u64, count: usize) -> DequantParams {
        DequantParams {
            weights: self.device.weights,
            scales: self.device.scales,
            ids: self.device.arange,
            out,
            rows: self.layout.capacity as u64,
            // count <= capacity <= 2^24 (`StagingLayout::MAX_CAPACITY`), so it fits.
            n: count as u32,
            dim: self.layout.dim as u32,
            status: self.device.status,
            timeline: fetchahead_gpu::params::TimelineParams::OFF,
        }
    }

    /// The tagged gather of the first `count` staged rows for the `count` ids at `ids` into `out`:
    /// each row waits for its tag (at most `timeout_ns`); late rows are recorded in `status`.
    pub fn tagged_params(&self, out: u64, ids: u64, count: usize, timeout_ns: u64) -> StagedParams {
        StagedParams {
            weights: self.device.weights,
            scales: self.device.scales,
            tags: self.device.tags,
            ids,
            out,
            late: self.device.status,
            n: count as u64,
            timeout_ns,
            dim: self.layout.dim as u32,
            _pad: 0,
            timeline: fetchahead_gpu::params::TimelineParams::OFF,
        }
    }

    /// First use of everything, eagerly on `stream`: zeroes the pinned buffers, copies them to
    /// the mirrors, copies one id back, and runs the gather `variant` once. Refused on a stream
    /// being captured.
    pub fn warm(
        &mut self,
        kernels: &Kernels,
        variants: &[DequantVariant],
        stream: &CudaStream,
    ) -> Result<()> {
        if self.warmed {
            return Ok(());
        }
        let s = stream.cu_stream();
        // SAFETY: `stream` is a live stream of its own context.
        if unsafe { stream::is_capturing(stream.context(), s)? } {
            return Err(Error::NotWarmed {
                what: "the staging buffers",
            });
        }
        let (cap, l) = (self.layout.capacity, self.layout);
        // SAFETY: each span is the whole of an allocation this struct owns, and the stream is
        // synchronized before they can be used again.
        unsafe {
            std::ptr::write_bytes(self.host.ids, 0, cap);
            std::ptr::write_bytes(self.host.weights, 0, l.weight_bytes(cap));
            std::ptr::write_bytes(self.host.scales, 0, l.scale_bytes(cap));
            stream::copy_to_device(
                self.device.weights,
                self.host.weights,
                l.weight_bytes(cap),
                s,
            )?;
            stream::copy_to_device(self.device.scales, self.host.scales, l.scale_bytes(cap), s)?;
            stream::copy_to_host(self.host.ids.cast(), self.device.arange, 8, s)?;
            let (out, _use) = self.scratch.device_ptr(stream);
            for &variant in variants {
                kernels.launch_gather_dequant(s, variant, self.gather_params(out, 1))?;
            }
            // The tagged gather too, its one row asking for the id its tag holds (the tags
            // themselves as ids): ready at once.
            let tags = self.device.tags;
            kernels.launch_staged_dequant(s, self.tagged_params(out, tags, 1, 0))?;
        }
        stream.synchronize().call("cuStreamSynchronize")?;
        self.warmed = true;
        Ok(())
    }
}
