//! The self-check's run: every variant against the reference, timed.
use std::sync::Arc;

use cudarc::driver::{CudaSlice, CudaStream, DevicePtr, sys};
use fetchahead_gpu::dequant::DequantVariant;
use fetchahead_gpu::gather::GatherVariant;
use rand::{Rng, RngExt, SeedableRng, rngs::SmallRng};

use super::{Outcome, ROW_BYTES, check_variant_name, poison, reference};
use crate::Result;
use crate::error::CudaCall;
use crate::kernels::Kernels;
use crate::kernels::id_check::IdCheck;
use crate::tables::table::{Mxfp8Table, Placement, RowTable};

/// Random `ids` into `rows`, a table of random bytes, every variant launched once to warm up and
/// once timed; the output is poisoned before each launch.
pub fn run(kernels: &Kernels, table_rows: u64, n: usize, seed: u64) -> Result<Vec<Outcome>> {
    run_only(kernels, table_rows, n, seed, None)
}

/// As [`run`], for the one variant named `only` when given (an error listing the names when
/// no variant [`run`] checks has that name).
pub fn run_only(
    kernels: &Kernels,
    table_rows: u64,
    n: usize,
    seed: u64,
    only: Option<&str>,
) -> Result<Vec<Outcome>> {
    if let Some(name) = only {
        check_variant_name(name)?;
    }
    let wanted = |name: &str| only.is_none_or(|o| o == name);
    // Unless named, a variant the loaded PTX does not hold (it needs a newer arch) is left
    // out ([`not_held`] lists them); named, its launch fails saying which arch it needs.
    let skipped = |name: &str| only.is_none() && !kernels.holds(name);
    let stream = kernels.gpu().ctx.default_stream();
    let mut rng = SmallRng::seed_from_u64(seed);
    let dim = ROW_BYTES as usize;
    let mut weights = vec![0u8; table_rows as usize * dim];
    rng.fill_bytes(&mut weights);
    let mut scales = vec![0u8; table_rows as usize * dim / 32];
    // Scales near 127 keep most results normal numbers; the tests cover the edges.
    scales
        .iter_mut()
        .for_each(|s| *s = rng.random_range(120..135));
    let ids: Vec<i64> = (0..n)
        .map(|_| rng.random_range(0..table_rows as i64))
        .collect();
    let ids_dev = stream.clone_htod(&ids).call("cuMemcpyHtoD")?;
    let ids_address = ids_dev.device_ptr(&stream).0;
    let mut check = IdCheck::new(&stream)?;

    let want_rows = reference::gather(&weights, dim, &ids);
    let want_bf16 = reference::gather_dequant(&weights, &scales, dim, &ids);
    let mut outcomes = Vec::new();
    for placement in [Placement::Device, Placement::PinnedHost] {
        let mut table = RowTable::from_bytes(&stream, &weights, ROW_BYTES, placement)?;
        let mut out = stream.alloc_zeros::<u8>(n * dim).call("cuMemAlloc")?;
        for variant in GatherVariant::all() {
            let v = variant.variant();
            if !wanted(v.name) || skipped(v.name) {
                continue;
            }
            let bytes_per_s = time(&stream, &mut out, |out| {
                table.gather(kernels, &stream, variant, &ids_dev, out, &check)
            })?
            .map(|s| (2 * n * dim + 8 * n) as f64 / s)
            .unwrap_or(0.0);
            check.take(&stream, ids_address, n as u64, table_rows)?;
            let got = stream.clone_dtoh(&out).call("cuMemcpyDtoH")?;
            let mismatch = got.iter().zip(&want_rows).position(|(a, b)| a != b);
            outcomes.push(outcome(
                v.name,
                placement,
                mismatch.map(|i| i / dim),
                bytes_per_s,
            ));
        }
        let mut mx = Mxfp8Table::from_bytes(&stream, &weights, &scales, ROW_BYTES, placement)?;
        let mut out = stream.alloc_zeros::<u16>(n * dim).call("cuMemAlloc")?;
        for variant in DequantVariant::all() {
            let v = variant.variant();
            if !wanted(v.name) || skipped(v.name) {
                continue;
            }
            let bytes_per_s = time(&stream, &mut out, |out| {
                mx.gather_dequant(kernels, &stream, variant, &ids_dev, out, &check)
            })?
            .map(|s| (n * (dim + dim / 32) + n * 2 * dim + 8 * n) as f64 / s)
            .unwrap_or(0.0);
            check.take(&stream, ids_address, n as u64, table_rows)?;
            let got = stream.clone_dtoh(&out).call("cuMemcpyDtoH")?;
            let mismatch = reference::first_bf16_mismatch(&got, &want_bf16);
            outcomes.push(outcome(
                v.name,
                placement,
                mismatch.map(|i| i / dim),
                bytes_per_s,
            ));
        }
    }
    Ok(outcomes)
}

fn outcome(
    kernel: &'static str,
    placement: Placement,
    bad_row: Option<usize>,
    bytes_per_s: f64,
) -> Outcome {
    Outcome {
        kernel,
        placement,
        passed: bad_row.is_none(),
        detail: bad_row
            .map(|r| format!("output row {r} differs from the reference"))
            .unwrap_or_default(),
        bytes_per_s,
    }
}

/// Runs `launch` once to warm up, poisons `out`, and runs it again between events: the seconds
/// of the second run, whose output the caller then checks.
fn time<T: cudarc::driver::DeviceRepr>(
    stream: &Arc<CudaStream>,
    out: &mut CudaSlice<T>,
    mut launch: impl FnMut(&mut CudaSlice<T>) -> Result<()>,
) -> Result<Option<f64>> {
    launch(out)?;
    poison(stream, out)?;
    let ctx = stream.context();
    let start = ctx
        .new_event(Some(sys::CUevent_flags::CU_EVENT_DEFAULT))
        .call("cuEventCreate")?;
    let end = ctx
        .new_event(Some(sys::CUevent_flags::CU_EVENT_DEFAULT))
        .call("cuEventCreate")?;
    start.record(stream).call("cuEventRecord")?;
    launch(out)?;
    end.record(stream).call("cuEventRecord")?;
    end.synchronize().call("cuEventSynchronize")?;
    let ms = start.elapsed_ms(&end).call("cuEventElapsedTime")?;
    Ok((ms > 0.0).then_some(ms as f64 / 1e3))
}
