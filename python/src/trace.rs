//! Lookup traces for `fetchahead.trace`: the crate's own reader, step batching, look-ahead
//! schedule and Belady's MIN (`fetchahead::store::trace`, `fetchahead::store::belady`), so that
//! the Python tooling and `bench-io --trace` read and count a trace one way.
//!
//! Steps cross as `(decode, prefill)` pairs and batches as `(start, end, prefill)` ranges of the
//! trace, as the Python layer keeps them.
use fetchahead::store::belady;
use fetchahead::store::trace::{self, Step, StepBatch};
use pyo3::prelude::*;
use pyo3::types::PyBytes;

use super::{PyRes, done};

fn to_steps(steps: &[(u32, u32)]) -> Vec<Step> {
    steps
        .iter()
        .map(|&(decode, prefill)| Step { decode, prefill })
        .collect()
}

fn to_batches(cut: &[(usize, usize, bool)]) -> Vec<StepBatch> {
    cut.iter()
        .map(|&(start, end, prefill)| StepBatch {
            ids: start..end,
            prefill,
        })
        .collect()
}

/// The row ids of a `.u64` or `.u64.xz` file, as little-endian i64 bytes.
#[pyfunction]
fn trace_read_ids<'py>(py: Python<'py>, path: std::path::PathBuf) -> PyRes<Bound<'py, PyBytes>> {
    let ids = py.detach(|| trace::read_ids(&path));
    let ids = done(py, ids)?;
    let bytes: Vec<u8> = ids.iter().flat_map(|id| id.to_le_bytes()).collect();
    Ok(PyBytes::new(py, &bytes))
}

/// The `(decode, prefill)` steps of a `.steps.u32` file.
#[pyfunction]
fn trace_read_steps(py: Python<'_>, path: std::path::PathBuf) -> PyRes<Vec<(u32, u32)>> {
    let steps = py.detach(|| trace::read_steps(&path));
    Ok(done(py, steps)?
        .into_iter()
        .map(|s| (s.decode, s.prefill))
        .collect())
}

/// `store::trace::step_batches`: a batch per step, or per `batch_tokens` tokens without steps.
#[pyfunction]
#[pyo3(signature = (n_ids, steps, ids_per_token, batch_tokens))]
fn trace_step_batches(
    py: Python<'_>,
    n_ids: usize,
    steps: Option<Vec<(u32, u32)>>,
    ids_per_token: usize,
    batch_tokens: usize,
) -> PyRes<Vec<(usize, usize, bool)>> {
    let steps = steps.as_deref().map(to_steps);
    let cut = trace::step_batches(n_ids, steps.as_deref(), ids_per_token, batch_tokens);
    Ok(done(py, cut)?
        .into_iter()
        .map(|b| (b.ids.start, b.ids.end, b.prefill))
        .collect())
}

/// `store::trace::known_future`: per step, the `(steps_ahead, start, end)` chunks to hand over
/// before its lookup.
#[pyfunction]
fn trace_known_future(
    py: Python<'_>,
    steps: Vec<(u32, u32)>,
    cut: Vec<(usize, usize, bool)>,
    prompts: Vec<u64>,
    ids_per_token: usize,
    horizon: u32,
) -> PyRes<Vec<Vec<(u32, usize, usize)>>> {
    let future = trace::known_future(
        &to_steps(&steps),
        &to_batches(&cut),
        &prompts,
        ids_per_token,
        horizon,
    );
    Ok(done(py, future)?
        .into_iter()
        .map(|chunks| {
            chunks
                .into_iter()
                .map(|c| (c.steps_ahead, c.ids.start, c.ids.end))
                .collect()
        })
        .collect())
}

/// `store::belady::belady` on the batches `cut` of the `n` ids at `ids` (a live, contiguous
/// int64 array the caller holds through the call): the hit rate over batches `counted_from..`.
#[pyfunction]
fn trace_belady(
    py: Python<'_>,
    ids: usize,
    n: usize,
    cut: Vec<(usize, usize)>,
    capacity: usize,
    counted_from: usize,
) -> PyRes<f64> {
    if let Some(&(start, end)) = cut.iter().find(|&&(a, e)| a > e || e > n) {
        let why = format!("batch {start}..{end} lies outside the trace's {n} ids");
        return done(py, Err(fetchahead::Error::invalid("trace batches", why)));
    }
    let ids: &[i64] = if n == 0 {
        &[]
    } else {
        // SAFETY: the Python layer passes the data pointer and length of a C-contiguous int64
        // array that it keeps alive for this call, and nothing writes it meanwhile.
        unsafe { std::slice::from_raw_parts(ids as *const i64, n) }
    };
    let batches: Vec<Vec<i64>> = cut.iter().map(|&(a, e)| ids[a..e].to_vec()).collect();
    Ok(py.detach(|| belady::belady(&batches, capacity, counted_from).rate()))
}

pub(crate) fn add_to(m: &Bound<'_, PyModule>) -> PyRes<()> {
    m.add_function(wrap_pyfunction!(trace_read_ids, m)?)?;
    m.add_function(wrap_pyfunction!(trace_read_steps, m)?)?;
    m.add_function(wrap_pyfunction!(trace_step_batches, m)?)?;
    m.add_function(wrap_pyfunction!(trace_known_future, m)?)?;
    m.add_function(wrap_pyfunction!(trace_belady, m)?)?;
    Ok(())
}
