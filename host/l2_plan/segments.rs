//! Segments an L2 prefetch may be given: validated on the host, uploaded once as a device table.
//!
//! The bulk prefetch wants a 16-byte aligned address and a size that is a multiple of 16; a
//! weight that is not is trimmed to its aligned interior (a prefetch of part of a tensor is still
//! a useful hint), and a null address is refused. Nothing unchecked reaches the device.
use std::sync::Arc;

use cudarc::driver::{CudaSlice, CudaStream, DevicePtr};
use fetchahead_gpu::params::{Segment, SmPartitions};

use crate::error::CudaCall;
use crate::{Error, Result};

/// Alignment and size granule of `cp.async.bulk.prefetch.L2`.
pub const SEGMENT_ALIGN: u64 = 16;

/// The 16-byte aligned part of `bytes` bytes at `address`: `Ok(None)` when nothing aligned is
/// left, an error for a null address or a span that wraps the address space.
pub fn aligned_segment(address: u64, bytes: u64) -> Result<Option<Segment>> {
    if address == 0 {
        return Err(Error::invalid(
            "prefetch segment",
            format!("null address ({bytes} bytes)"),
        ));
    }
    let end = address.checked_add(bytes).ok_or_else(|| {
        Error::invalid(
            "prefetch segment",
            format!("{bytes} bytes at {address:#x} wrap around"),
        )
    })?;
    let start = address.next_multiple_of(SEGMENT_ALIGN);
    let end = end - end % SEGMENT_ALIGN;
    Ok((end > start).then(|| Segment {
        address: start,
        bytes: end - start,
    }))
}

/// Refuses a segment the kernel must not see: null, unaligned, empty or not a multiple of 16.
pub fn check_segment(s: &Segment) -> Result<()> {
    let aligned = s.address != 0 && s.address.is_multiple_of(SEGMENT_ALIGN);
    let sized = s.bytes != 0 && s.bytes.is_multiple_of(SEGMENT_ALIGN);
    if !aligned || !sized || s.address.checked_add(s.bytes).is_none() {
        return Err(Error::invalid(
            "prefetch segment",
            format!(
                "{} bytes at {:#x}: want a non-null, 16-byte aligned span of 16-byte multiples",
                s.bytes, s.address
            ),
        ));
    }
    Ok(())
}

/// A table of checked segments in device memory, in the layout `l2_prefetch` reads
/// (`{address, bytes}` as two u64 each).
#[derive(Debug)]
pub struct SegmentTable {
    _words: CudaSlice<u64>,
    address: u64,
    len: usize,
    bytes: u64,
    /// With a partition map: its device address and the claims' (0 without).
    partitions: u64,
    claims: u64,
}

impl SegmentTable {
    /// Checks every segment and copies the table to the device in `stream`'s order.
    pub fn upload(stream: &Arc<CudaStream>, segments: &[Segment]) -> Result<SegmentTable> {
        SegmentTable::upload_with(stream, segments, None)
    }

    /// [`SegmentTable::upload`] with the device's L2 partition map after the segments, and the
    /// zeroed claims a partitioned `l2_prefetch_loads` launch counts its jobs in: the table then
    /// holds everything such a launch reads, for as long as a graph that baked it in needs it.
    pub fn upload_with(
        stream: &Arc<CudaStream>,
        segments: &[Segment],
        partitions: Option<&SmPartitions>,
    ) -> Result<SegmentTable> {
        segments.iter().try_for_each(check_segment)?;
        let mut words: Vec<u64> = segments.iter().flat_map(|s| [s.address, s.bytes]).collect();
        // One word at least, so that even an empty table has an address.
        if words.is_empty() {
            words = vec![0, 0];
        }
        let tail = words.len() as u64 * 8;
        if let Some(map) = partitions {
            // The claims (16 bytes, zero), then the map's bytes as little-endian words.
            words.extend([0, 0]);
            words.extend(
                map.chunks(8)
                    .map(|b| u64::from_le_bytes(b.try_into().expect("8-byte chunks"))),
            );
        }
        let words = stream.clone_htod(&words).call("cuMemcpyHtoD")?;
        let address = words.device_ptr(stream).0;
        let (claims, partitions) = match partitions {
            Some(_) => (address + tail, address + tail + 16),
            None => (0, 0),
        };
        Ok(SegmentTable {
            _words: words,
            address,
            len: segments.len(),
            bytes: segments.iter().map(|s| s.bytes).sum(),
            partitions,
            claims,
        })
    }

    /// The partition map's and the claims' device addresses (`PrefetchParams::partitions` and
    /// `::claims`), both 0 for a table without a map.
    pub fn partitioned(&self) -> (u64, u64) {
        (self.partitions, self.claims)
    }

    /// Device address of segment 0 (16-byte aligned: segments are 16 bytes).
    pub fn address(&self) -> u64 {
        self.address
    }

    /// Device address of segment `i` (`i <= len`).
    pub fn address_of(&self, i: usize) -> u64 {
        self.address + 16 * i.min(self.len) as u64
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Bytes all segments cover.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }
}
