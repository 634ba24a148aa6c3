//! A simulated forward of a model with Engram layers, for the demo and the bench: a hash kernel
//! turns the step's tokens into each Engram layer's row ids, spin kernels stand in for each
//! layer's compute, and each Engram layer gathers its rows, one of three ways ([`GatherPath`]).
//! Each Engram layer reads its own table ([`LayerTable`]): the row store's layer
//! ([`LayerRows`]) or a generated table in RAM ([`MemoryRows`]).
//!
//! Everything is enqueued on one stream with raw device addresses taken at creation, so a whole
//! forward can be captured into a CUDA graph and replayed.
//!
//! A timed step ([`SimulatedForward::time`], [`SimulatedForward::time_replay`]) starts with a
//! lead-in kernel ([`LEAD_IN_US`]) ahead of its start event, so that the CPU enqueues the step
//! while the GPU is busy, as an engine's CPU runs ahead of its GPU: the step's GPU time holds no
//! wait for the CPU's launches, and the CPU time of those launches is measured on its own.
//!
//! In flag mode the Engram layers' lookups run on one shared lookup lane, layer by layer in
//! gather order ([`FlagLanes::Shared`]), or each on a lane of its own ([`FlagLanes::PerLayer`]).
//!
//! The Engram side of a step (token buffer, hash, prefetches, gathers, resident tables) is
//! [`EngramLayers`], which the decode step of [`crate::decode_step`] enqueues too.
use std::sync::Arc;
use std::time::Instant;

use cudarc::driver::{CudaEvent, CudaGraph, CudaSlice, CudaStream, DevicePtr, sys};
use fetchahead_gpu::hash;
use fetchahead_gpu::params::{DequantParams, HashParams, MAX_NGRAM};

use crate::LabKernels;
use fetchahead::error::CudaCall;
use fetchahead::kernels::id_check::IdCheck;
use fetchahead::prefetch::flag_worker::FlagLane;
use fetchahead::prefetch::lookup::{MemoryRows, RowLookup};
use fetchahead::prefetch::prefetcher::{Completion, Prefetcher, PrefetcherConfig, Stats};
use fetchahead::store::LayerRows;
use fetchahead::tables::table::{Mxfp8Table, Placement};
use fetchahead::{Error, Result};

/// The model being simulated.
#[derive(Clone, Debug)]
pub struct ForwardShape {
    /// Layers, each `compute_us` of compute.
    pub layers: u32,
    /// The Engram layers (1-based, sorted, distinct), each gathering after its compute.
    pub engram_layers: Vec<u32>,
    pub compute_us: u64,
    /// Ids per token per Engram layer.
    pub heads: u32,
    /// Tokens each id hashes (1..=8).
    pub ngram: u32,
    pub seed: u64,
}

impl ForwardShape {
    /// Checks the shape against Engram tables of `rows` rows each.
    pub fn check(&self, rows: u64) -> Result<()> {
        let sorted = self.engram_layers.windows(2).all(|w| w[0] < w[1]);
        if self.engram_layers.is_empty()
            || !sorted
            || self
                .engram_layers
                .iter()
                .any(|&l| l == 0 || l > self.layers)
        {
            return Err(Error::invalid(
                "engram layers",
                format!(
                    "{:?}: sorted, distinct, each in 1..={}",
                    self.engram_layers, self.layers
                ),
            ));
        }
        if rows == 0 || self.heads == 0 || self.ngram == 0 || self.ngram > MAX_NGRAM {
            return Err(Error::invalid(
                "forward",
                format!(
                    "{rows} rows per Engram layer, {} heads, n-gram {} (1..={MAX_NGRAM})",
                    self.heads, self.ngram
                ),
            ));
        }
        Ok(())
    }

    /// The hash seed of Engram layer `k`.
    pub fn layer_seed(&self, k: usize) -> u64 {
        self.seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ k as u64
    }

    /// The hash kernel's ids (in `0..rows`) for Engram layer `k`, computed on the CPU into `ids`.
    pub fn hash_on_host(&self, rows: u64, k: usize, tokens: &[u32], ids: &mut Vec<i64>) {
        ids.clear();
        let divisor = hash::divisor(rows);
        for t in 0..tokens.len() {
            for h in 0..self.heads {
                let mut state = hash::start(self.layer_seed(k), h);
                for j in 0..self.ngram as usize {
                    state = hash::fold(state, if j <= t { tokens[t - j] } else { 0 });
                }
                ids.push(hash::finish(state, 0, divisor));
            }
        }
    }
}

/// What [`LayerTable::with_bytes`] calls with a table's weights and scales.
pub type TableBytes<'a> = dyn FnMut(&[u8], &[u8]) -> Result<()> + 'a;

/// One Engram layer's table as the simulated forward reads it: lookups of row ids `0..rows`,
/// and the whole table's bytes for the resident path.
pub trait LayerTable: RowLookup {
    fn rows(&self) -> u64;

    /// Calls `f` with the layer's `[rows, dim]` E4M3 and `[rows, dim / 32]` E8M0 bytes.
    fn with_bytes(&self, f: &mut TableBytes<'_>) -> Result<()>;
}

impl LayerTable for MemoryRows {
    fn rows(&self) -> u64 {
        MemoryRows::rows(self)
    }

    fn with_bytes(&self, f: &mut TableBytes<'_>) -> Result<()> {
        f(self.weights(), self.scales())
    }
}

/// For a store opened from row 0 (a whole layer): ids below `row_range().start` are not its rows.
impl LayerTable for LayerRows {
    fn rows(&self) -> u64 {
        self.store().row_range().end
    }

    /// Read from the shard files around the store's cache and counters, so that the resident
    /// path leaves the store's stats to the lookups.
    fn with_bytes(&self, f: &mut TableBytes<'_>) -> Result<()> {
        let (weights, scales) = self.read_all()?;
        f(&weights, &scales)
    }
}

/// How the Engram layers get their rows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GatherPath {
    /// From the whole table in device memory: the floor, no lookup at all.
    Resident,
    /// The synchronous path: lookup and copies on the main stream at the gather.
    Sync,
    /// The side-stream prefetcher, started right after the hash.
    Prefetch,
}

/// In flag mode, which lookup threads the Engram layers' prefetchers use.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum FlagLanes {
    /// One lane for the forward: one lookup at a time, the earliest-gathered layer's first among
    /// those waiting ([`Prefetcher::in_lane`], ranked in gather order).
    #[default]
    Shared,
    /// A lane per layer: the layers' lookups run at the same time, sharing the disk.
    PerLayer,
}

/// The GPU's lead-in before a timed step's start event, microseconds: a spin kernel longer than
/// the CPU's enqueue of one step (the bench and the demo print that enqueue time, and
/// [`StepTime::lead_in_overrun`] says when the lead-in was not long enough).
pub const LEAD_IN_US: u64 = 500;

/// One timed step.
#[derive(Clone, Copy, Debug)]
pub struct StepTime {
    /// GPU milliseconds from the start event (after the lead-in) to the end of the step.
    pub gpu_ms: f64,
    /// Host wall-clock milliseconds of the step's enqueue (eager) or graph launch: the CPU cost
    /// of its launches, not part of `gpu_ms`.
    pub enqueue_ms: f64,
    /// The GPU had passed the start event before the enqueue returned: the lead-in ran out, and
    /// `gpu_ms` may hold time the GPU waited for the CPU.
    pub lead_in_overrun: bool,
}

/// One Engram layer's device buffers and prefetcher.
struct EngramLayer {
    prefetcher: Prefetcher,
    ids: CudaSlice<i64>,
    out: CudaSlice<u16>,
    resident_out: CudaSlice<u16>,
    ids_at: u64,
    out_at: u64,
    resident_out_at: u64,
    /// The layer's whole table on the device, and its weights' and scales' addresses.
    _resident: Mxfp8Table,
    resident_at: (u64, u64),
}

/// The Engram side of a simulated forward: the step's token buffer, and per Engram layer its
/// ids, outputs, resident table and warm prefetcher. [`SimulatedForward`] and
/// [`crate::decode_step::DecodeStep`] both enqueue through it: the hash (and prefetches) at the
/// head of the step, each layer's gather where the model reaches it.
pub struct EngramLayers {
    kernels: Arc<LabKernels>,
    /// The hash's heads, n-gram and seed (the layer counts and compute are the caller's).
    shape: ForwardShape,
    rows: u64,
    dim: usize,
    max_tokens: usize,
    tokens: CudaSlice<u32>,
    tokens_at: u64,
    layers: Vec<EngramLayer>,
    id_check: IdCheck,
}

impl EngramLayers {
    /// Buffers for up to `max_tokens` tokens per step, and per Engram layer (`tables[k]` for
    /// `shape.engram_layers[k]`, all of one row count and dim) its table copied to the device
    /// for the resident path and one warm prefetcher over it, configured as `prefetch` (its
    /// capacity is set here, from `max_tokens`); in flag mode the prefetchers' lookup threads
    /// are as `lanes` says.
    pub fn new(
        kernels: Arc<LabKernels>,
        main: &Arc<CudaStream>,
        tables: &[Arc<dyn LayerTable>],
        shape: &ForwardShape,
        max_tokens: usize,
        prefetch: PrefetcherConfig,
        lanes: FlagLanes,
    ) -> Result<EngramLayers> {
        let (rows, dim) = match tables.first() {
            Some(t) => (t.rows(), t.dim()),
            None => (0, 0),
        };
        if tables.len() != shape.engram_layers.len()
            || tables.iter().any(|t| t.rows() != rows || t.dim() != dim)
        {
            return Err(Error::invalid(
                "forward tables",
                format!(
                    "{} tables for {} Engram layers; each needs {rows} rows of dim {dim}",
                    tables.len(),
                    shape.engram_layers.len()
                ),
            ));
        }
        shape.check(rows)?;
        let max_tokens = max_tokens.max(1);
        let max_ids = max_tokens * shape.heads as usize;
        let config = PrefetcherConfig {
            capacity: max_ids,
            ..prefetch
        };
        let shared_lane = match (config.completion, lanes) {
            (Completion::Flag, FlagLanes::Shared) => {
                Some(FlagLane::start("fetchahead-lookup".into())?)
            }
            _ => None,
        };
        let mut layers = Vec::new();
        for (k, table) in tables.iter().enumerate() {
            let mut resident = None;
            table.with_bytes(&mut |weights, scales| {
                resident = Some(Mxfp8Table::from_bytes(
                    main,
                    weights,
                    scales,
                    dim as u32,
                    Placement::Device,
                )?);
                Ok(())
            })?;
            let mut resident = resident
                .ok_or_else(|| Error::invalid("forward tables", "a table gave no bytes"))?;
            let resident_at = (
                resident.weights.address(main),
                resident.scales.address(main),
            );
            let store: Arc<dyn RowLookup> = table.clone();
            let mut prefetcher = match (&shared_lane, config.completion) {
                // Ranked in gather order: `engram_layers` is sorted.
                (Some(lane), _) => {
                    Prefetcher::in_lane(kernels.product().clone(), store, config, lane, k as u32)?
                }
                // `FlagLanes::PerLayer`: a lane of this layer's own.
                (None, Completion::Flag) => {
                    let own = FlagLane::start(format!("fetchahead-layer{k}"))?;
                    Prefetcher::in_lane(kernels.product().clone(), store, config, &own, 0)?
                }
                (None, Completion::HostFunction) => {
                    Prefetcher::new(kernels.product().clone(), store, config)?
                }
            };
            prefetcher.warm()?;
            let ids = main.alloc_zeros::<i64>(max_ids).call("cuMemAlloc")?;
            let out = main.alloc_zeros::<u16>(max_ids * dim).call("cuMemAlloc")?;
            let resident_out = main.alloc_zeros::<u16>(max_ids * dim).call("cuMemAlloc")?;
            let ids_at = ids.device_ptr(main).0;
            let out_at = out.device_ptr(main).0;
            let resident_out_at = resident_out.device_ptr(main).0;
            layers.push(EngramLayer {
                ids_at,
                out_at,
                resident_out_at,
                prefetcher,
                ids,
                out,
                resident_out,
                _resident: resident,
                resident_at,
            });
        }
        let tokens = main.alloc_zeros::<u32>(max_tokens).call("cuMemAlloc")?;
        let id_check = IdCheck::new(main)?;
        let tokens_at = tokens.device_ptr(main).0;
        Ok(EngramLayers {
            kernels,
            shape: shape.clone(),
            rows,
            dim,
            max_tokens,
            tokens,
            tokens_at,
            layers,
            id_check,
        })
    }

    /// Rows of each Engram layer's table.
    pub fn rows(&self) -> u64 {
        self.rows
    }

    /// Elements per row.
    pub fn dim(&self) -> usize {
        self.dim
    }

    /// Most tokens per step.
    pub fn max_tokens(&self) -> usize {
        self.max_tokens
    }

    /// Engram layers.
    pub fn len(&self) -> usize {
        self.layers.len()
    }

    pub fn is_empty(&self) -> bool {
        self.layers.is_empty()
    }

    /// Writes the next step's tokens (at most `max_tokens`) into the token buffer on `main`.
    pub fn set_tokens(&mut self, main: &Arc<CudaStream>, tokens: &[u32]) -> Result<()> {
        if tokens.len() > self.max_tokens {
            return Err(Error::StagingFull {
                count: tokens.len(),
                capacity: self.max_tokens,
            });
        }
        main.memcpy_htod(tokens, &mut self.tokens)
            .call("cuMemcpyHtoD")
    }

    fn check_tokens(&self, n_tokens: usize) -> Result<()> {
        if n_tokens > self.max_tokens {
            return Err(Error::StagingFull {
                count: n_tokens,
                capacity: self.max_tokens,
            });
        }
        Ok(())
    }

    /// The head of a step on `s`: each Engram layer's hash of the first `n_tokens` tokens into
    /// its ids, and with [`GatherPath::Prefetch`] its prefetch right after. Capturable.
    ///
    /// # Safety
    /// `s` is a valid stream of this device's context, the one the step's later
    /// [`EngramLayers::enqueue_gather`] calls get.
    pub unsafe fn enqueue_head(
        &mut self,
        path: GatherPath,
        n_tokens: usize,
        s: sys::CUstream,
    ) -> Result<()> {
        self.check_tokens(n_tokens)?;
        let shape = &self.shape;
        let n = n_tokens * shape.heads as usize;
        for (k, layer) in self.layers.iter_mut().enumerate() {
            let p = HashParams {
                tokens: self.tokens_at,
                ids: layer.ids_at,
                n_tokens: n_tokens as u64,
                seed: shape.layer_seed(k),
                row_start: 0,
                rows: self.rows,
                heads: shape.heads,
                ngram: shape.ngram,
            };
            // SAFETY: the token buffer holds max_tokens >= n_tokens tokens and `ids` room for
            // max_tokens * heads ids.
            unsafe { self.kernels.launch_hash(s, p)? };
            if path == GatherPath::Prefetch {
                // SAFETY: `ids` holds n ids, rewritten only by the next step's hash, which
                // comes after this layer's gather on the same stream.
                unsafe { layer.prefetcher.prefetch(layer.ids_at, n, s)? };
            }
        }
        Ok(())
    }

    /// Engram layer `k`'s gather of the step's rows on `s`, the way `path` says. Capturable.
    ///
    /// # Safety
    /// As [`EngramLayers::enqueue_head`], which this step called before with the same `path`
    /// and `n_tokens`.
    pub unsafe fn enqueue_gather(
        &mut self,
        k: usize,
        path: GatherPath,
        n_tokens: usize,
        s: sys::CUstream,
    ) -> Result<()> {
        self.check_tokens(n_tokens)?;
        let n = n_tokens * self.shape.heads as usize;
        let layer = self
            .layers
            .get_mut(k)
            .ok_or_else(|| Error::invalid("layer", format!("no Engram layer {k}")))?;
        match path {
            GatherPath::Resident => {
                let p = DequantParams {
                    weights: layer.resident_at.0,
                    scales: layer.resident_at.1,
                    ids: layer.ids_at,
                    out: layer.resident_out_at,
                    rows: self.rows,
                    n: fetchahead::kernels::dequant_rows(n as u64)?,
                    dim: self.dim as u32,
                    status: self.id_check.address(),
                    timeline: fetchahead_gpu::params::TimelineParams::OFF,
                };
                let variant = self.kernels.dequant_variant(None, p.n as u64)?;
                // SAFETY: the layer's resident table holds `rows` rows, `ids` n ids, `out` n
                // rows.
                unsafe { self.kernels.launch_gather_dequant(s, variant, p) }
            }
            // SAFETY: n ids and n * dim bf16 of output, both this step's.
            GatherPath::Sync => unsafe {
                layer
                    .prefetcher
                    .gather_dequant_sync(layer.ids_at, n, layer.out_at, s)
            },
            // SAFETY: n * dim bf16 of output.
            GatherPath::Prefetch => unsafe { layer.prefetcher.gather_dequant(layer.out_at, s) },
        }
    }

    /// The end of a step on `s`: each prefetcher joins its side stream back
    /// ([`Prefetcher::finish`]; nothing with [`Join::AtGather`](fetchahead::prefetch::prefetcher::Join)).
    /// Capturable.
    ///
    /// # Safety
    /// As [`EngramLayers::enqueue_head`].
    pub unsafe fn finish(&mut self, path: GatherPath, s: sys::CUstream) -> Result<()> {
        if path != GatherPath::Prefetch {
            return Ok(());
        }
        for layer in &mut self.layers {
            // SAFETY: the caller vouches for `s`, the stream the gathers were given.
            unsafe { layer.prefetcher.finish(s)? };
        }
        Ok(())
    }

    /// Fills every layer's outputs (both paths') with 0xFF bytes on `main`, so that an unwritten
    /// output shows.
    pub fn poison(&mut self, main: &Arc<CudaStream>) -> Result<()> {
        for layer in &mut self.layers {
            fetchahead::selfcheck::poison(main, &mut layer.out)?;
            fetchahead::selfcheck::poison(main, &mut layer.resident_out)?;
        }
        Ok(())
    }

    /// Engram layer `k`'s ids and output of the last step of `path`, `n_tokens` tokens.
    pub fn read(
        &self,
        main: &Arc<CudaStream>,
        k: usize,
        path: GatherPath,
        n_tokens: usize,
    ) -> Result<(Vec<i64>, Vec<u16>)> {
        self.check_tokens(n_tokens)?;
        let layer = self
            .layers
            .get(k)
            .ok_or_else(|| Error::invalid("layer", format!("no Engram layer {k}")))?;
        let n = n_tokens * self.shape.heads as usize;
        main.synchronize().call("cuStreamSynchronize")?;
        let ids = main.clone_dtoh(&layer.ids).call("cuMemcpyDtoH")?;
        let out = match path {
            GatherPath::Resident => &layer.resident_out,
            GatherPath::Sync | GatherPath::Prefetch => &layer.out,
        };
        let out = main.clone_dtoh(out).call("cuMemcpyDtoH")?;
        Ok((ids[..n].to_vec(), out[..n * self.dim].to_vec()))
    }

    /// Check mode's counters, summed over the Engram layers (`None` when it is off); waits for
    /// the device.
    pub fn check_differed(&self) -> Result<Option<u32>> {
        let mut total = None;
        for layer in &self.layers {
            if let Some(n) = layer.prefetcher.check_differed()? {
                total = Some(total.unwrap_or(0) + n);
            }
        }
        Ok(total)
    }

    /// Engram layer `k`'s prefetcher stats (`None` past the last layer).
    pub fn layer_stats(&self, k: usize) -> Option<Stats> {
        self.layers.get(k).map(|layer| layer.prefetcher.stats())
    }

    /// The prefetchers' stats, summed over the Engram layers.
    pub fn stats(&self) -> Stats {
        let mut total = Stats::default();
        for layer in &self.layers {
            total += layer.prefetcher.stats();
        }
        total
    }
}

/// The simulated forward's buffers, kernels and prefetchers on one stream.
pub struct SimulatedForward {
    kernels: Arc<LabKernels>,
    main: Arc<CudaStream>,
    shape: ForwardShape,
    engram: EngramLayers,
    /// Timing events of [`SimulatedForward::time`] and [`SimulatedForward::time_replay`].
    clock: StepClock,
}

impl SimulatedForward {
    /// Buffers for up to `max_tokens` tokens per step and the Engram layers' tables, resident
    /// copies and prefetchers ([`EngramLayers::new`]).
    pub fn new(
        kernels: Arc<LabKernels>,
        main: Arc<CudaStream>,
        tables: &[Arc<dyn LayerTable>],
        shape: ForwardShape,
        max_tokens: usize,
        prefetch: PrefetcherConfig,
        lanes: FlagLanes,
    ) -> Result<SimulatedForward> {
        let engram = EngramLayers::new(
            kernels.clone(),
            &main,
            tables,
            &shape,
            max_tokens,
            prefetch,
            lanes,
        )?;
        let clock = StepClock::new(&main)?;
        main.synchronize().call("cuStreamSynchronize")?;
        Ok(SimulatedForward {
            clock,
            kernels,
            main,
            shape,
            engram,
        })
    }

    pub fn shape(&self) -> &ForwardShape {
        &self.shape
    }

    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.main
    }

    /// Sets each layer's compute for later enqueues and captures (a graph captured before keeps
    /// the compute it was captured with).
    pub fn set_compute_us(&mut self, compute_us: u64) {
        self.shape.compute_us = compute_us;
    }

    /// Writes the next step's tokens (at most `max_tokens`) into the token buffer.
    pub fn set_tokens(&mut self, tokens: &[u32]) -> Result<()> {
        self.engram.set_tokens(&self.main, tokens)
    }

    /// Enqueues one forward over the first `n_tokens` tokens on the stream: capturable.
    pub fn enqueue(&mut self, path: GatherPath, n_tokens: usize) -> Result<()> {
        let s = self.main.cu_stream();
        // SAFETY: `s` is this forward's own stream, given to every call of the step.
        unsafe { self.engram.enqueue_head(path, n_tokens, s)? };
        for l in 1..=self.shape.layers {
            // SAFETY: `s` is this forward's own stream.
            unsafe { self.kernels.launch_spin(s, self.shape.compute_us * 1000)? };
            let Some(k) = self.shape.engram_layers.iter().position(|&e| e == l) else {
                continue;
            };
            // SAFETY: the head above was enqueued on `s` with this path and token count.
            unsafe { self.engram.enqueue_gather(k, path, n_tokens, s)? };
        }
        // SAFETY: this forward's own stream.
        unsafe { self.engram.finish(path, s) }
    }

    /// One eager forward, enqueued behind the lead-in, between timing events.
    pub fn time(&mut self, path: GatherPath, n_tokens: usize) -> Result<StepTime> {
        self.timed(|forward| forward.enqueue(path, n_tokens))
    }

    /// One launch of `graph` (captured from this forward), behind the lead-in, between timing
    /// events.
    pub fn time_replay(&mut self, graph: &CudaGraph) -> Result<StepTime> {
        self.timed(|_| graph.launch().call("cuGraphLaunch"))
    }

    /// Lead-in, start event, `enqueue` (timed on the host), end event; waits for the end.
    fn timed(
        &mut self,
        enqueue: impl FnOnce(&mut SimulatedForward) -> Result<()>,
    ) -> Result<StepTime> {
        let started = self.clock.begin(&self.kernels, &self.main, LEAD_IN_US)?;
        enqueue(self)?;
        self.clock.finish(&self.main, started)
    }

    /// Captures one forward into a graph (launch it on [`SimulatedForward::stream`]). Drop the
    /// graph before this forward.
    pub fn capture(&mut self, path: GatherPath, n_tokens: usize) -> Result<CudaGraph> {
        let mode = sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL;
        self.main.begin_capture(mode).call("cuStreamBeginCapture")?;
        let enqueued = self.enqueue(path, n_tokens);
        let graph = self
            .main
            .end_capture(sys::CUgraphInstantiate_flags(0))
            .call("cuStreamEndCapture")?;
        enqueued?;
        graph.ok_or_else(|| Error::invalid("graph", "the capture recorded nothing"))
    }

    /// Engram layer `k`'s ids and output of the last forward of `path`, `n_tokens` tokens.
    pub fn read(
        &self,
        k: usize,
        path: GatherPath,
        n_tokens: usize,
    ) -> Result<(Vec<i64>, Vec<u16>)> {
        self.engram.read(&self.main, k, path, n_tokens)
    }

    /// Engram layers.
    pub fn engram_layers(&self) -> usize {
        self.engram.len()
    }

    /// Check mode's counters, summed over the Engram layers (`None` when it is off); waits for
    /// the device.
    pub fn check_differed(&self) -> Result<Option<u32>> {
        self.engram.check_differed()
    }

    /// Milliseconds of compute a step runs before its first Engram gather.
    pub fn compute_before_first_gather_ms(&self) -> f64 {
        let first = self.shape.engram_layers.first().copied().unwrap_or(0);
        (self.shape.compute_us * u64::from(first)) as f64 / 1e3
    }

    /// Engram layer `k`'s prefetcher stats (`None` past the last layer).
    pub fn layer_stats(&self, k: usize) -> Option<Stats> {
        self.engram.layer_stats(k)
    }

    /// The prefetchers' stats, summed over the Engram layers.
    pub fn stats(&self) -> Stats {
        self.engram.stats()
    }
}

/// A timed step's events: started behind a lead-in kernel, so that the CPU's enqueue of the
/// step is not in its GPU time.
pub(crate) struct StepClock {
    start: CudaEvent,
    end: CudaEvent,
}

/// A started [`StepClock`] measurement: when the enqueue began on the host.
pub(crate) struct Started(Instant);

impl StepClock {
    /// Two timing-enabled events on `main`'s context.
    pub(crate) fn new(main: &Arc<CudaStream>) -> Result<StepClock> {
        let timed = Some(sys::CUevent_flags::CU_EVENT_DEFAULT);
        let start = main.context().new_event(timed).call("cuEventCreate")?;
        let end = main.context().new_event(timed).call("cuEventCreate")?;
        Ok(StepClock { start, end })
    }

    /// A `lead_in_us` spin kernel on `main`, then the start event; the step's enqueue follows.
    pub(crate) fn begin(
        &self,
        kernels: &LabKernels,
        main: &Arc<CudaStream>,
        lead_in_us: u64,
    ) -> Result<Started> {
        // SAFETY: the caller's own stream.
        unsafe { kernels.launch_spin(main.cu_stream(), lead_in_us * 1000)? };
        self.start.record(main).call("cuEventRecord")?;
        Ok(Started(Instant::now()))
    }

    /// The end event after the step's enqueue; waits for it.
    pub(crate) fn finish(&self, main: &Arc<CudaStream>, started: Started) -> Result<StepTime> {
        let enqueue_ms = started.0.elapsed().as_secs_f64() * 1e3;
        let lead_in_overrun = self.start.try_is_complete().call("cuEventQuery")?;
        self.end.record(main).call("cuEventRecord")?;
        self.end.synchronize().call("cuEventSynchronize")?;
        let gpu_ms = self
            .start
            .elapsed_ms(&self.end)
            .call("cuEventElapsedTime")? as f64;
        Ok(StepTime {
            gpu_ms,
            enqueue_ms,
            lead_in_overrun,
        })
    }
}
