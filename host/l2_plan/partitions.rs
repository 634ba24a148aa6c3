//! Which L2 partition each SM is near, measured on the device.
//!
//! Hopper's L2 is two partitions, each caching for the SMs of its own GPCs. A line only SMs of
//! one partition read serves the other partition's SMs from across the chip: on the H200
//! (2026-12-01, `benches/cuda/l2_partition_probe.cu`) such hits took 367-390 cycles against
//! 281-304 for near ones, and a streaming reader of 24 MiB got 0.91 of its warm speed from lines
//! every SM had read once, 0.22-0.37 from lines one partition had read, and 0.98 from lines read
//! by an SM of each partition (12 MiB: 0.80 and 0.97). So `l2_prefetch_loads` reads every byte
//! once from each partition when the plan has a map ([`PrefetchParams::partitions`]).
//!
//! The map comes from `l2_partition_probe`: SM 0 reads a set of lines, then every SM times its
//! own share of them with dependent `ld.global.cg` loads. SMs whose hops take longer than the
//! midpoint of the fastest and slowest are far from SM 0. A device whose SMs differ by less than
//! [`SPREAD`] has one partition, and the plan reads each byte once.
//!
//! [`PrefetchParams::partitions`]: fetchahead_gpu::params::PrefetchParams
use std::sync::Arc;

use cudarc::driver::{CudaStream, DevicePtr, DevicePtrMut};
use fetchahead_gpu::params::{MAX_SMS, PROBE_LINE_STRIDE, PartitionProbeParams, SmPartitions};

use crate::Result;
use crate::error::CudaCall;
use crate::kernels::Kernels;

/// Lines each SM times.
pub const LINES_PER_SM: u32 = 16;

/// The least ratio of the slowest SM's hop to the fastest's that counts as two partitions.
pub const SPREAD: f64 = 1.12;

/// The measured map.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Partitions {
    /// Per SM, 0 (near SM 0) or 1.
    pub of_sm: SmPartitions,
    /// Per SM, the median cycles of a hop on lines SM 0 read (0: the SM ran no probe block).
    pub cycles: Vec<u32>,
    /// Whether two partitions were told apart.
    pub two: bool,
}

impl Partitions {
    /// Measures the map on `stream` (three probes, the median per SM). Takes about a
    /// millisecond of device time and `2 x L2` of scratch memory for the flush.
    pub fn measure(kernels: &Kernels, stream: &Arc<CudaStream>) -> Result<Partitions> {
        let gpu = kernels.gpu();
        let sms = gpu.multiprocessors.min(MAX_SMS as u32);
        let lines_bytes = sms as usize * LINES_PER_SM as usize * PROBE_LINE_STRIDE as usize;
        let lines = stream.alloc_zeros::<u8>(lines_bytes).call("cuMemAlloc")?;
        let mut flush = stream
            .alloc_zeros::<u8>((2 * gpu.l2_bytes as usize).max(1 << 20))
            .call("cuMemAlloc")?;
        let mut claims = stream.alloc_zeros::<u32>(sms as usize).call("cuMemAlloc")?;
        let mut out = stream
            .alloc_zeros::<u32>(2 * sms as usize)
            .call("cuMemAlloc")?;
        let lines_at = lines.device_ptr(stream).0;
        let out_at = out.device_ptr_mut(stream).0;
        let claims_at = claims.device_ptr_mut(stream).0;
        let mut runs: Vec<Vec<u32>> = Vec::new();
        for _ in 0..3 {
            let mut launch = |mode: u32| -> Result<()> {
                stream.memset_zeros(&mut claims).call("cuMemsetD8")?;
                let p = PartitionProbeParams {
                    lines: lines_at,
                    out: out_at,
                    claims: claims_at,
                    per_sm: LINES_PER_SM,
                    sms,
                    mode,
                    mask: 0,
                };
                // SAFETY: the buffers above hold what the probe reads and writes and live until
                // the stream is synchronized below.
                unsafe { kernels.launch_partition_probe(stream.cu_stream(), p) }
            };
            // The flush's writes evict the probe's lines; SM 0 reads them in; each SM times them.
            stream.memset_zeros(&mut flush).call("cuMemsetD8")?;
            launch(0)?;
            stream.memset_zeros(&mut out).call("cuMemsetD8")?;
            launch(1)?;
            let words = stream.clone_dtoh(&out).call("cuMemcpyDtoH")?;
            runs.push(
                words
                    .chunks(2)
                    .map(|w| if w[1] == 1 { w[0] } else { 0 })
                    .collect(),
            );
        }
        let cycles: Vec<u32> = (0..sms as usize)
            .map(|s| {
                let mut v: Vec<u32> = runs.iter().map(|r| r[s]).collect();
                v.sort_unstable();
                v[1]
            })
            .collect();
        Ok(Partitions::from_cycles(cycles))
    }

    /// The map from per-SM hop cycles on lines SM 0 read (0: not measured, counted near).
    pub fn from_cycles(cycles: Vec<u32>) -> Partitions {
        let seen = cycles.iter().copied().filter(|&c| c > 0);
        let (lo, hi) = seen.fold((u32::MAX, 0), |(lo, hi), c| (lo.min(c), hi.max(c)));
        let two = hi > 0 && hi as f64 > SPREAD * lo as f64;
        let cut = (lo as u64 + hi as u64) / 2;
        let mut of_sm = [0u8; MAX_SMS];
        if two {
            for (s, &c) in cycles.iter().enumerate().take(MAX_SMS) {
                of_sm[s] = u8::from(c as u64 > cut);
            }
        }
        Partitions { of_sm, cycles, two }
    }

    /// SMs in partition 0 and 1.
    pub fn sizes(&self) -> (usize, usize) {
        let far = self.of_sm[..self.cycles.len().min(MAX_SMS)]
            .iter()
            .filter(|&&p| p == 1)
            .count();
        (self.cycles.len() - far, far)
    }
}

impl std::fmt::Display for Partitions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (near, far) = self.sizes();
        let seen = self.cycles.iter().copied().filter(|&c| c > 0);
        let (lo, hi) = seen.fold((u32::MAX, 0), |(lo, hi), c| (lo.min(c), hi.max(c)));
        if self.two {
            write!(
                f,
                "two L2 partitions: {near} SMs near SM 0, {far} far ({lo}-{hi} cycles a hit)"
            )
        } else {
            write!(f, "one L2 partition ({lo}-{hi} cycles a hit)")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn two_partitions_split_at_the_midpoint() {
        let p = Partitions::from_cycles(vec![292, 290, 378, 377, 300, 0, 380]);
        assert!(p.two);
        assert_eq!(&p.of_sm[..7], &[0, 0, 1, 1, 0, 0, 1]);
        assert_eq!(p.sizes(), (4, 3));
        assert!(
            p.to_string()
                .starts_with("two L2 partitions: 4 SMs near SM 0, 3 far")
        );
    }

    #[test]
    fn a_small_spread_is_one_partition() {
        let p = Partitions::from_cycles(vec![300, 310, 305, 320]);
        assert!(!p.two);
        assert!(p.of_sm.iter().all(|&s| s == 0));
        assert_eq!(p.sizes(), (4, 0));
    }
}
