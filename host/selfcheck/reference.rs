//! The CPU reference the product's kernels are checked against, built on the `half` and `float8`
//! crates rather than on the kernels' own scalar code (the lab's GEMV reference is the lab's).
use float8::F8E4M3;
use half::bf16;

/// `out[i] = table[ids[i]]`; a zero row for an id outside the table.
pub fn gather(table: &[u8], row_bytes: usize, ids: &[i64]) -> Vec<u8> {
    let rows = table.len() / row_bytes;
    let mut out = vec![0u8; ids.len() * row_bytes];
    for (dst, &id) in out.chunks_exact_mut(row_bytes).zip(ids) {
        if (0..rows as i64).contains(&id) {
            let id = id as usize;
            dst.copy_from_slice(&table[id * row_bytes..(id + 1) * row_bytes]);
        }
    }
    out
}

/// One MXFP8 element, OCP MX rules: `e4m3(x) * 2^(scale - 127)` rounded once to bf16 (the product
/// is exact in f64), NaN for an E4M3 NaN or the E8M0 NaN (0xFF).
pub fn dequant(x: u8, scale: u8) -> bf16 {
    let value = F8E4M3::from_bits(x).to_f64();
    if scale == 0xFF {
        return bf16::NAN;
    }
    bf16::from_f64(value * 2f64.powi(scale as i32 - 127))
}

/// `[ids.len(), dim]` bf16 bits from `[rows, dim]` E4M3 weights and `[rows, dim / 32]` scales;
/// a zero row for an id outside the table.
pub fn gather_dequant(weights: &[u8], scales: &[u8], dim: usize, ids: &[i64]) -> Vec<u16> {
    let rows = weights.len() / dim;
    let blocks = dim / 32;
    let mut out = vec![0u16; ids.len() * dim];
    for (dst, &id) in out.chunks_exact_mut(dim).zip(ids) {
        if !(0..rows as i64).contains(&id) {
            continue;
        }
        let id = id as usize;
        let row = &weights[id * dim..(id + 1) * dim];
        let row_scales = &scales[id * blocks..(id + 1) * blocks];
        for (j, (d, &x)) in dst.iter_mut().zip(row).enumerate() {
            *d = dequant(x, row_scales[j / 32]).to_bits();
        }
    }
    out
}

/// Whether two bf16 results agree: the same bits, or both NaN (NaN payloads may differ).
pub fn same_bf16(a: u16, b: u16) -> bool {
    a == b || (bf16::from_bits(a).is_nan() && bf16::from_bits(b).is_nan())
}

/// The first position where a kernel's bf16 output disagrees with the reference.
pub fn first_bf16_mismatch(got: &[u16], want: &[u16]) -> Option<usize> {
    if got.len() != want.len() {
        return Some(got.len().min(want.len()));
    }
    got.iter().zip(want).position(|(&g, &w)| !same_bf16(g, w))
}
