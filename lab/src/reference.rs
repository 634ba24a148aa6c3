//! The CPU reference of the lab's GEMV, in f64 on the `half` crate's bf16 rather than on the
//! kernel's own scalar code.
use half::bf16;

/// `y[m, n] = sum_k x[m, k] * w[n, k]` in f64 (bf16 inputs are exact in f64), `[m, n]` row-major.
pub fn gemv(x: &[bf16], w: &[bf16], m: usize, k: usize) -> Vec<f64> {
    if k == 0 {
        return Vec::new();
    }
    let n = w.len() / k;
    let mut y = vec![0f64; m * n];
    for (mi, xr) in x.chunks_exact(k).take(m).enumerate() {
        for (ni, wr) in w.chunks_exact(k).enumerate() {
            y[mi * n + ni] = xr
                .iter()
                .zip(wr)
                .map(|(a, b)| a.to_f64() * b.to_f64())
                .sum();
        }
    }
    y
}
