//! The kernels of one device, loaded from the PTX built for its arch, and their launches.
//!
//! Launches go straight to `cuLaunchKernel` with the caller's raw stream and one parameter struct
//! by value: nothing is allocated per launch, and every launch can be captured into a CUDA graph.
use std::sync::{Arc, Mutex, PoisonError, Weak};

use cudarc::driver::{CudaFunction, CudaModule, sys};
use fetchahead_gpu::dequant::DequantVariant;
use fetchahead_gpu::gather::GatherVariant;
use fetchahead_gpu::l2_prefetch::PrefetchVariant;
use fetchahead_gpu::params::{
    CHUNK_BYTES, CheckParams, DequantParams, GatherParams, MX_BLOCK, PrefetchParams, TimelineParams,
};
use fetchahead_gpu::{check, defaults, dequant, gather, l2_prefetch, staged};

use crate::driver;
use crate::error::CudaCall;
use crate::kernels::gpu::Gpu;
use crate::kernels::ptx::{self, BuiltPtx, Choice};
use crate::timeline::TimelineSwitch;
use crate::{Error, Result};

/// A loaded kernel and how many of its blocks fit on one multiprocessor.
#[derive(Debug)]
pub struct LoadedKernel {
    pub(crate) function: CudaFunction,
    blocks_per_sm: u32,
    /// Its index in `fetchahead_gpu::all_kernels()`: the kernel id its timeline records carry.
    pub(crate) id: u32,
    /// Its twin that records the device timeline (`{name}_timed`), for the kernels that have one.
    timed: Option<CudaFunction>,
    /// Its build for one row width (`fetchahead_gpu::WidthBuild`), launched in its place for
    /// calls of that width.
    at_width: Option<(u32, Box<LoadedKernel>)>,
}

impl LoadedKernel {
    /// Kernel `name` of `module`, its blocks per multiprocessor measured for blocks of
    /// `block_threads` threads (static shared memory included), with its timed twin and its
    /// width build when it has them.
    pub(crate) fn load(
        module: &Arc<CudaModule>,
        name: &str,
        block_threads: u32,
    ) -> Result<LoadedKernel> {
        let at_width = fetchahead_gpu::width_build(name)
            .map(|b| {
                LoadedKernel::load(module, b.name, block_threads)
                    .map(|build| (b.width, Box::new(build)))
            })
            .transpose()?;
        let listed = fetchahead_gpu::all_kernels()
            .enumerate()
            .find(|(_, e)| e.name == name);
        if let Some(required) = listed.and_then(|(_, e)| e.block_threads)
            && required != block_threads
        {
            return Err(Error::Invalid {
                what: "kernel block size",
                why: format!(
                    "{name} is compiled for blocks of {required} threads (.reqntid), not \
                     {block_threads}"
                ),
            });
        }
        let function = module.load_function(name).call("cuModuleGetFunction")?;
        let blocks_per_sm = function
            .occupancy_max_active_blocks_per_multiprocessor(block_threads, 0, None)
            .call("cuOccupancyMaxActiveBlocksPerMultiprocessor")?
            .max(1);
        let id = listed.map_or(usize::MAX, |(i, _)| i) as u32;
        let timed = fetchahead_gpu::timed_twin(name)
            .map(|twin| module.load_function(twin).call("cuModuleGetFunction"))
            .transpose()?;
        Ok(LoadedKernel {
            function,
            blocks_per_sm,
            id,
            timed,
            at_width,
        })
    }

    /// What a call of rows `width` wide launches: the width build when it has one for that
    /// width, else this kernel.
    pub(crate) fn for_width(&self, width: u32) -> &LoadedKernel {
        match &self.at_width {
            Some((w, build)) if *w == width => build,
            _ => self,
        }
    }

    /// Its index in `fetchahead_gpu::all_kernels()`: the kernel id its timeline records carry.
    pub fn id(&self) -> u32 {
        self.id
    }

    /// Its entry's name.
    pub fn name(&self) -> &'static str {
        fetchahead_gpu::all_kernels()
            .nth(self.id as usize)
            .map_or("?", |e| e.name)
    }

    /// The function a launch handing the kernel `timeline` runs: the timed twin when the
    /// timeline is on, the plain kernel (unchanged by the timeline) otherwise.
    pub(crate) fn function_for(&self, timeline: &TimelineParams) -> &CudaFunction {
        match &self.timed {
            Some(timed) if timeline.ring != 0 => timed,
            _ => &self.function,
        }
    }

    /// The empty kernel `empty` sized as this kernel is (its blocks per SM), so that a launch of
    /// it gets this kernel's grid; it records no timeline.
    fn empty_like(&self, empty: &LoadedKernel) -> LoadedKernel {
        LoadedKernel {
            function: empty.function.clone(),
            blocks_per_sm: self.blocks_per_sm,
            id: empty.id,
            timed: None,
            at_width: None,
        }
    }
}

/// A variant's kernel, or why the loaded PTX does not hold it.
#[derive(Debug)]
pub enum Slot {
    Loaded(LoadedKernel),
    /// Its instructions need SM `needs`, newer than the loaded PTX's arch.
    Absent {
        name: &'static str,
        needs: u32,
    },
}

impl Slot {
    /// Kernel `name` of `module` when `ptx` holds it (build.rs checked that a PTX holds exactly
    /// the kernels whose needs its arch meets), else why not.
    pub(crate) fn load(
        module: &Arc<CudaModule>,
        ptx: &BuiltPtx,
        name: &'static str,
        needs: u32,
        block_threads: u32,
    ) -> Result<Slot> {
        if ptx.holds(needs) {
            LoadedKernel::load(module, name, block_threads).map(Slot::Loaded)
        } else {
            Ok(Slot::Absent { name, needs })
        }
    }
}

/// Every kernel of the product's PTX module that the PTX loaded for one device holds (a variant
/// that needs a newer arch is absent, and its launch says so). Another module (the lab's) loads
/// beside it through [`Kernels::load_module`].
#[derive(Debug)]
pub struct Kernels {
    pub(crate) gpu: Gpu,
    choice: Choice,
    _module: Arc<CudaModule>,
    gather: Vec<Slot>,
    empty: LoadedKernel,
    dequant: Vec<Slot>,
    prefetch: Vec<Slot>,
    check: LoadedKernel,
    staged: LoadedKernel,
    partition_probe: LoadedKernel,
    /// The device timeline: off unless enabled (`crate::timeline`).
    pub(crate) timeline: TimelineSwitch,
}

impl Kernels {
    /// The loaded kernels of device `ordinal`, shared by every user in the process while one
    /// holds them (the C ABI's prefetchers and plans, the Python binding's devices): the module
    /// is loaded, and its PTX compiled by the driver, once, not once per Engram layer.
    pub fn shared(ordinal: usize) -> Result<Arc<Kernels>> {
        static LOADED: Mutex<Vec<(usize, Weak<Kernels>)>> = Mutex::new(Vec::new());
        let mut loaded = LOADED.lock().unwrap_or_else(PoisonError::into_inner);
        loaded.retain(|(_, k)| k.strong_count() > 0);
        if let Some(kernels) = loaded
            .iter()
            .find(|(o, _)| *o == ordinal)
            .and_then(|(_, k)| k.upgrade())
        {
            return Ok(kernels);
        }
        let kernels = Arc::new(Kernels::load(&Gpu::open(ordinal)?)?);
        loaded.push((ordinal, Arc::downgrade(&kernels)));
        Ok(kernels)
    }

    /// Loads the PTX for `gpu`'s compute capability: the newest embedded not newer than it, or
    /// the one `FETCHAHEAD_PTX_ARCH` names ([`ptx::for_device`]).
    pub fn load(gpu: &Gpu) -> Result<Kernels> {
        let (major, minor) = gpu.compute_capability;
        Kernels::load_choice(gpu, ptx::for_device(&gpu.name, major, minor)?)
    }

    /// Loads the PTX of `arch` (as `FETCHAHEAD_PTX_ARCH={arch}` would), checked to run on
    /// `gpu`: the tests run the baseline this way on a newer chip.
    pub fn load_arch(gpu: &Gpu, arch: &str) -> Result<Kernels> {
        let choice = ptx::choose(ptx::BUILT, &gpu.name, gpu.compute_capability, Some(arch))?;
        Kernels::load_choice(gpu, choice)
    }

    fn load_choice(gpu: &Gpu, choice: Choice) -> Result<Kernels> {
        let ptx = choice.ptx;
        let module = gpu
            .ctx
            .load_module(cudarc::nvrtc::Ptx::from_src(ptx.text))
            .call("cuModuleLoadData")?;
        let load = |name: &str| LoadedKernel::load(&module, name, gather::BLOCK_THREADS);
        let slot =
            |name, needs, block_threads| Slot::load(&module, ptx, name, needs, block_threads);
        let threads = gather::BLOCK_THREADS;
        let kernels = Kernels {
            gather: gather::VARIANTS
                .iter()
                .zip(gather::NEEDS)
                .map(|(v, &needs)| slot(v.name, needs, v.shape.block_threads()))
                .collect::<Result<_>>()?,
            empty: load(gather::EMPTY_KERNEL)?,
            dequant: dequant::VARIANTS
                .iter()
                .zip(dequant::NEEDS)
                .map(|(v, &needs)| slot(v.name, needs, v.shape.block_threads()))
                .collect::<Result<_>>()?,
            prefetch: l2_prefetch::VARIANTS
                .iter()
                .zip(l2_prefetch::NEEDS)
                .map(|(v, &needs)| slot(v.name, needs, threads))
                .collect::<Result<_>>()?,
            check: load(check::KERNEL)?,
            staged: load(staged::KERNEL)?,
            partition_probe: load(l2_prefetch::PARTITION_PROBE_KERNEL)?,
            _module: module,
            choice,
            gpu: gpu.clone(),
            timeline: TimelineSwitch::off(),
        };
        if crate::timeline::enabled_by_env() {
            kernels.enable_timeline(crate::timeline::DEFAULT_CAPACITY)?;
        }
        Ok(kernels)
    }

    pub fn gpu(&self) -> &Gpu {
        &self.gpu
    }

    /// The arch whose PTX was loaded.
    pub fn arch(&self) -> &'static str {
        self.choice.ptx.arch
    }

    /// Which PTX was loaded and why (its `Display`: "sm_90 PTX for a 10.0 device: ...").
    pub fn ptx_choice(&self) -> &Choice {
        &self.choice
    }

    /// Whether the loaded PTX holds kernel `name`: false for a kernel that needs a newer arch
    /// (and for a name that is no kernel).
    pub fn holds(&self, name: &str) -> bool {
        ptx::kernel_needs(name).is_some_and(|needs| self.choice.ptx.holds(needs))
    }

    /// The default variants for this device's arch (`fetchahead_gpu::defaults`).
    pub fn defaults(&self) -> &'static defaults::Defaults {
        defaults::for_arch(self.choice.ptx.arch)
    }

    /// The gather + dequant variant a user named (parsed here, at the edge), or for `None`
    /// this arch's default for a call of `rows` rows.
    pub fn dequant_variant(&self, name: Option<&str>, rows: u64) -> Result<DequantVariant> {
        name.map_or(
            Ok(self.defaults().dequant.for_rows(rows)),
            dequant_variant_named,
        )
    }

    /// The gather variant a user named, or for `None` this arch's default for a call of `rows`
    /// rows.
    pub fn gather_variant(&self, name: Option<&str>, rows: u64) -> Result<GatherVariant> {
        name.map_or(
            Ok(self.defaults().gather.for_rows(rows)),
            gather_variant_named,
        )
    }

    /// The PTX entry a gather of `variant` over rows of `row_bytes` runs (what a profiler
    /// names): the variant's width build for rows of its width, else the variant's own.
    pub fn gather_entry(&self, variant: GatherVariant, row_bytes: u32) -> Result<&'static str> {
        let kernel = self.pick(&self.gather, variant.index(), "gather")?;
        Ok(kernel.for_width(row_bytes).name())
    }

    /// As [`Kernels::gather_entry`], for a gather + dequant of rows of `dim` elements.
    pub fn dequant_entry(&self, variant: DequantVariant, dim: u32) -> Result<&'static str> {
        let kernel = self.pick(&self.dequant, variant.index(), "gather_dequant")?;
        Ok(kernel.for_width(dim).name())
    }

    /// Launches gather `variant` on `stream`.
    ///
    /// # Safety
    /// `p`'s addresses are valid device addresses for the whole launch: `table` holds `rows` rows
    /// of `row_bytes`, `ids` holds `n` int64, `out` holds `n * row_bytes` bytes and is written by
    /// nothing else, and `status` is a live `IdStatus`.
    pub unsafe fn launch_gather(
        &self,
        stream: sys::CUstream,
        variant: GatherVariant,
        p: GatherParams,
    ) -> Result<()> {
        let grid = gather_grid(variant, &p, self.gpu.multiprocessors)?;
        let kernel = self
            .pick(&self.gather, variant.index(), "gather")?
            .for_width(p.row_bytes);
        let p = GatherParams {
            timeline: self.timeline.params(kernel.id),
            ..p
        };
        // SAFETY: the caller guarantees the addresses; the checks above bound the indexing.
        unsafe { self.launch_sized(kernel, &p.timeline, grid, stream, p) }
    }

    /// Launches the empty kernel with exactly the grid gather `variant` would get for `p`.
    ///
    /// # Safety
    /// None beyond a valid stream: the kernel reads nothing.
    pub unsafe fn launch_empty(
        &self,
        stream: sys::CUstream,
        variant: GatherVariant,
        p: GatherParams,
    ) -> Result<()> {
        let grid = gather_grid(variant, &p, self.gpu.multiprocessors)?;
        let empty = self
            .pick(&self.gather, variant.index(), "gather")?
            .empty_like(&self.empty);
        // SAFETY: the empty kernel touches no memory.
        unsafe { self.launch_sized(&empty, &TimelineParams::OFF, grid, stream, p) }
    }

    /// Launches the empty kernel with exactly the grid gather + dequant `variant` would get for
    /// `p`.
    ///
    /// # Safety
    /// None beyond a valid stream: the kernel reads nothing.
    pub unsafe fn launch_empty_like_dequant(
        &self,
        stream: sys::CUstream,
        variant: DequantVariant,
        p: DequantParams,
    ) -> Result<()> {
        let shape = dequant_shape(variant)?;
        let empty = self
            .pick(&self.dequant, variant.index(), "gather_dequant")?
            .empty_like(&self.empty);
        let unused = GatherParams {
            table: 0,
            ids: 0,
            out: 0,
            status: 0,
            n: 0,
            rows: 0,
            row_bytes: 0,
            _pad: 0,
            timeline: fetchahead_gpu::params::TimelineParams::OFF,
        };
        let grid = dequant_grid(shape, p.n as u64, p.dim);
        // SAFETY: the empty kernel touches no memory.
        unsafe { self.launch_sized(&empty, &TimelineParams::OFF, grid, stream, unused) }
    }

    /// Launches gather + dequant `variant` on `stream`.
    ///
    /// # Safety
    /// As [`Kernels::launch_gather`], for `weights` (`rows * dim` bytes), `scales`
    /// (`rows * dim / 32` bytes), `ids` (`n`) and `out` (`n * dim` bf16).
    pub unsafe fn launch_gather_dequant(
        &self,
        stream: sys::CUstream,
        variant: DequantVariant,
        p: DequantParams,
    ) -> Result<()> {
        let n = p.n as u64;
        if !check_dequant(p.dim, n, [p.weights, p.out, p.scales, p.ids, p.status])? {
            return Ok(()); // nothing to write: the addresses of empty buffers may be null
        }
        let shape = dequant_shape(variant)?;
        // The kernels index 8-element units in u32, and a quad-pass variant's threads too.
        check_chunk_count(n * (p.dim / 8) as u64)?;
        let grid = dequant_grid(shape, n, p.dim);
        check_chunk_count(grid.threads)?;
        let kernel = self
            .pick(&self.dequant, variant.index(), "gather_dequant")?
            .for_width(p.dim);
        let p = DequantParams {
            timeline: self.timeline.params(kernel.id),
            ..p
        };
        // SAFETY: the caller guarantees the addresses; the checks above bound the indexing.
        unsafe { self.launch_sized(kernel, &p.timeline, grid, stream, p) }
    }

    /// The prefetcher's tagged gather of `p.n` staged rows ([`staged`]): each row waits for its
    /// tag to equal its id (at most `p.timeout_ns`), then comes out dequantized.
    ///
    /// # Safety
    /// The staged rows, tags and ids hold `p.n` entries, `out` `p.n * dim` bf16 and `late` a live
    /// `IdStatus`; the rows and tags are written only by copies that write a row before its tag.
    pub unsafe fn launch_staged_dequant(
        &self,
        stream: sys::CUstream,
        p: fetchahead_gpu::params::StagedParams,
    ) -> Result<()> {
        if !check_dequant(p.dim, p.n, [p.weights, p.out, p.scales, p.ids, p.late])? {
            return Ok(());
        }
        check_aligned_to("tags", p.tags, 8)?;
        check_chunk_count(p.n * (p.dim / 8) as u64)?;
        let threads = staged::threads(p.n, p.dim);
        let p = fetchahead_gpu::params::StagedParams {
            timeline: self.timeline.params(self.staged.id),
            ..p
        };
        // SAFETY: the caller guarantees the addresses; the checks above bound the indexing.
        unsafe {
            self.launch(
                &self.staged,
                &p.timeline,
                threads,
                stream,
                p,
                gather::BLOCK_THREADS,
            )
        }
    }

    /// Launches the L2 partition probe (`l2_partition_probe`, 4 blocks of 32 threads an SM,
    /// so that every SM gets one).
    ///
    /// # Safety
    /// `p.lines` holds `p.per_sm * p.sms` lines `PROBE_LINE_STRIDE` apart, `p.out` two writable
    /// u32 per SM and `p.claims` one zeroed, writable u32 per SM, all alive until the launch ends.
    pub unsafe fn launch_partition_probe(
        &self,
        stream: sys::CUstream,
        p: fetchahead_gpu::params::PartitionProbeParams,
    ) -> Result<()> {
        let blocks = p.sms.saturating_mul(4).max(1);
        // SAFETY: as the caller guarantees; the probe's block and thread counts are fixed.
        unsafe { self.launch_exact(&self.partition_probe.function, blocks, 32, stream, p) }
    }

    /// Launches L2 prefetch `variant` over `p.n`
    /// segments with `blocks x threads` (the defaults: `min(n, 8) x 64`).
    ///
    /// # Safety
    /// `p.segments` holds `p.n` segments, each 16-byte aligned and sized, inside valid device
    /// allocations (the L2 plan validates them before they reach the device).
    pub unsafe fn launch_l2_prefetch(
        &self,
        stream: sys::CUstream,
        variant: PrefetchVariant,
        p: PrefetchParams,
        blocks: u32,
        threads: u32,
    ) -> Result<()> {
        if p.chunk == 0 || !p.chunk.is_multiple_of(16) {
            return Err(Error::invalid(
                "prefetch chunk",
                format!("{} is not a positive multiple of 16", p.chunk),
            ));
        }
        if blocks == 0 || threads == 0 || threads > 1024 {
            return Err(Error::invalid(
                "prefetch launch",
                format!("{blocks} blocks x {threads} threads"),
            ));
        }
        if p.n == 0 {
            return Ok(());
        }
        check_aligned_to("segments", p.segments, 16)?;
        let kernel = self.pick(&self.prefetch, variant.index(), "l2_prefetch")?;
        let p = PrefetchParams {
            timeline: self.timeline.params(kernel.id),
            ..p
        };
        // SAFETY: the caller guarantees the segments; the checks above bound the launch.
        unsafe { self.launch_exact(kernel.function_for(&p.timeline), blocks, threads, stream, p) }
    }

    /// Compares `p.a` and `p.b` (`p.chunks` 16-byte chunks each) and adds one to the
    /// `CheckCounter` at `p.counter` if they differ.
    ///
    /// # Safety
    /// `a` and `b` hold `chunks * 16` bytes each, written by nothing during the launch, and
    /// `counter` is a live `CheckCounter` used by no concurrent launch.
    pub unsafe fn launch_check_equal(&self, stream: sys::CUstream, p: CheckParams) -> Result<()> {
        check_aligned("check a", p.a)?;
        check_aligned("check b", p.b)?;
        check_aligned("check counter", p.counter)?;
        // SAFETY: the caller guarantees the addresses; the kernel reads chunks 0..p.chunks.
        unsafe {
            self.launch(
                &self.check,
                &TimelineParams::OFF,
                p.chunks,
                stream,
                p,
                gather::BLOCK_THREADS,
            )
        }
    }

    /// Variant `variant`'s kernel in `slots`, or why there is none: an index past the family,
    /// or a kernel the loaded PTX does not hold (naming the arch it needs).
    pub fn pick<'a>(
        &self,
        slots: &'a [Slot],
        variant: usize,
        family: &'static str,
    ) -> Result<&'a LoadedKernel> {
        match slots.get(variant) {
            Some(Slot::Loaded(kernel)) => Ok(kernel),
            Some(&Slot::Absent { name, needs }) => Err(Error::KernelNeedsArch {
                kernel: name,
                needs,
                loaded: self.choice.ptx.arch,
                why: self.choice.to_string(),
            }),
            None => Err(Error::invalid(
                "variant",
                format!("{family} has no variant {variant}"),
            )),
        }
    }

    /// One launch of `threads` threads in blocks of `block_threads`, the grid capped at what fits
    /// on the device at once (the kernels are grid-stride loops); `kernel.blocks_per_sm` was
    /// measured for that block size (for the plain kernel: a timed twin may fit fewer). `timeline`
    /// (the one inside `p`) picks the plain kernel or its timed twin. No threads: no launch.
    ///
    /// # Safety
    /// `P` is the parameter struct `kernel` takes, and the addresses inside `p` are valid for
    /// the launch; `stream` is a valid stream of this device's context.
    pub unsafe fn launch<P: Copy>(
        &self,
        kernel: &LoadedKernel,
        timeline: &TimelineParams,
        threads: u64,
        stream: sys::CUstream,
        p: P,
        block_threads: u32,
    ) -> Result<()> {
        if threads == 0 {
            return Ok(());
        }
        let resident = self.gpu.multiprocessors as u64 * kernel.blocks_per_sm as u64;
        let blocks = threads.div_ceil(block_threads as u64).min(resident) as u32;
        // SAFETY: the caller guarantees the addresses inside `p`.
        unsafe {
            self.launch_exact(
                kernel.function_for(timeline),
                blocks,
                block_threads,
                stream,
                p,
            )
        }
    }

    /// Launches `kernel` over `grid`: every block of a one-pass grid, or at most as many as fit
    /// on the device at once for a striding one.
    ///
    /// # Safety
    /// As [`Kernels::launch`].
    unsafe fn launch_sized<P: Copy>(
        &self,
        kernel: &LoadedKernel,
        timeline: &TimelineParams,
        grid: Grid,
        stream: sys::CUstream,
        p: P,
    ) -> Result<()> {
        if !grid.one_pass {
            // SAFETY: the caller's guarantees, passed on.
            return unsafe {
                self.launch(
                    kernel,
                    timeline,
                    grid.threads,
                    stream,
                    p,
                    grid.block_threads,
                )
            };
        }
        if grid.threads == 0 {
            return Ok(());
        }
        // The kernels count their units (16-byte chunks, 8-element units) in u32, and a block of
        // a one-pass shape takes at least 128 of them: below 2^25 blocks, inside the grid limit.
        let blocks = grid.threads.div_ceil(grid.block_threads as u64) as u32;
        // SAFETY: the caller's guarantees, passed on; every tile gets its own block or warp.
        unsafe { self.launch_grid(kernel, timeline, blocks, grid.block_threads, stream, p) }
    }

    /// One `cuLaunchKernel` of `blocks x threads` with `p` as the kernel's one argument, by value.
    ///
    /// # Safety
    /// `P` is the parameter struct `function` takes, and the addresses inside `p` are valid for
    /// the launch.
    pub(crate) unsafe fn launch_exact<P: Copy>(
        &self,
        function: &CudaFunction,
        blocks: u32,
        threads: u32,
        stream: sys::CUstream,
        p: P,
    ) -> Result<()> {
        self.gpu.ctx.bind_to_thread().call("cuCtxSetCurrent")?;
        // SAFETY: the caller guarantees `P` and the addresses inside `p`; the context is bound
        // above.
        unsafe { driver::launch::launch_kernel(function, blocks, threads, stream, p) }
    }
}

/// The threads a launch needs, in blocks of `block_threads`, and whether they all launch at once
/// (`one_pass`) or are capped at what fits on the device.
#[derive(Clone, Copy, Debug)]
struct Grid {
    threads: u64,
    block_threads: u32,
    one_pass: bool,
}

/// The grid gather + dequant of `n` rows of `dim` elements gets from a variant of `shape`.
fn dequant_grid(shape: dequant::Shape, n: u64, dim: u32) -> Grid {
    Grid {
        threads: shape.threads(n, dim),
        block_threads: shape.block_threads(),
        one_pass: shape.one_pass(),
    }
}

/// The shape of gather + dequant `variant`, or an error naming it.
fn dequant_shape(variant: DequantVariant) -> Result<dequant::Shape> {
    Ok(variant.variant().shape)
}

/// The L2 prefetch variant named `name`, or an error that lists the names.
pub fn prefetch_variant_named(name: &str) -> Result<PrefetchVariant> {
    PrefetchVariant::named(name).ok_or_else(|| {
        let names: Vec<_> = l2_prefetch::VARIANTS.iter().map(|v| v.name).collect();
        Error::invalid(
            "L2 prefetch variant",
            format!(
                "no L2 prefetch variant named `{name}` (one of: {})",
                names.join(", ")
            ),
        )
    })
}

/// The gather variant `name`, or an error naming it.
pub fn gather_variant_named(name: &str) -> Result<GatherVariant> {
    GatherVariant::named(name).ok_or_else(|| {
        Error::invalid(
            "gather variant",
            format!("no gather variant named `{name}` (`fetchahead kernels` lists them)"),
        )
    })
}

/// The gather + dequant variant `name`, or an error naming it.
pub fn dequant_variant_named(name: &str) -> Result<DequantVariant> {
    DequantVariant::named(name).ok_or_else(|| {
        Error::invalid(
            "gather + dequant variant",
            format!("no gather + dequant variant named `{name}` (`fetchahead kernels` lists them)"),
        )
    })
}

/// Checks a gather's shape and returns the grid gather `variant` needs for it.
fn gather_grid(variant: GatherVariant, p: &GatherParams, sms: u32) -> Result<Grid> {
    if p.row_bytes == 0 || !p.row_bytes.is_multiple_of(CHUNK_BYTES) {
        return Err(Error::invalid(
            "row width",
            format!(
                "{} bytes is not a positive multiple of {CHUNK_BYTES}",
                p.row_bytes
            ),
        ));
    }
    let shape = variant.variant().shape;
    let grid = |threads| Grid {
        threads,
        block_threads: shape.block_threads(),
        one_pass: shape.one_pass(),
    };
    if p.n == 0 {
        // nothing to write: the addresses of empty buffers may be null
        return Ok(grid(0));
    }
    check_aligned("table", p.table)?;
    check_aligned("out", p.out)?;
    check_aligned_to("ids", p.ids, 8)?;
    check_aligned_to("status", p.status, 8)?;
    let chunks = (p.row_bytes / CHUNK_BYTES) as u64;
    check_chunk_count(p.n * chunks)?;
    let threads = match shape {
        gather::Shape::ChunkPerThread { unroll, .. } => (p.n * chunks).div_ceil(unroll as u64),
        gather::Shape::ChunkTile { unroll } => {
            let tile = unroll as u64 * shape.block_threads() as u64;
            (p.n * chunks).div_ceil(tile) * shape.block_threads() as u64
        }
        gather::Shape::WarpPerRow => p.n * 32,
        gather::Shape::WarpPerRows => p.n.div_ceil(32) * 32,
        gather::Shape::WarpSpan {
            unroll,
            blocks_per_sm,
        } => ((p.n * chunks).div_ceil(unroll as u64 * 32) * 32)
            .min(sms as u64 * blocks_per_sm as u64 * shape.block_threads() as u64),
        gather::Shape::TilePerBlock {
            block_threads,
            tile_bytes,
        } => (p.n * p.row_bytes as u64).div_ceil(tile_bytes as u64) * block_threads as u64,
        gather::Shape::RowsTile { rows, warps } => {
            fetchahead_gpu::warp_rows::threads(p.n, rows, warps)
        }
        gather::Shape::WordsOnePass { word_bytes } => {
            // Rows are whole 16-byte chunks (checked above), so whole words (`word_bytes`
            // divides CHUNK_BYTES: tests/variants.rs). The kernel indexes its threads in u32,
            // whole blocks included.
            let threads = p.n * (p.row_bytes / word_bytes) as u64;
            check_chunk_count(threads.next_multiple_of(shape.block_threads() as u64))?;
            threads
        }
    };
    Ok(grid(threads))
}

/// The kernels index 16-byte chunks with 32-bit arithmetic.
fn check_chunk_count(chunks: u64) -> Result<()> {
    if chunks >= u32::MAX as u64 {
        return Err(Error::invalid(
            "batch",
            format!(
                "{chunks} chunks (16 bytes of a gather; 8 elements of a dequant, 4 of a quad-pass one) in one launch; split it below 2^32"
            ),
        ));
    }
    Ok(())
}

/// `n` rows of one gather + dequant launch as [`DequantParams::n`] holds them: an error for 2^32
/// rows or more (the kernels index 8-element units in 32 bits, so such a call could not run
/// anyway).
pub fn dequant_rows(n: u64) -> Result<u32> {
    u32::try_from(n).map_err(|_| {
        Error::invalid(
            "batch",
            format!("{n} rows in one gather + dequant launch; split it below 2^32"),
        )
    })
}

/// An error naming `what` unless `address` is a non-null, 16-byte aligned device address.
pub fn check_aligned(what: &'static str, address: u64) -> Result<()> {
    check_aligned_to(what, address, 16)
}

/// The checks every gather + dequant launch shares: `dim` a positive multiple of 32, and (for
/// `n > 0`) `[weights, out, scales, ids, status]` aligned as the kernels read them. False: no
/// rows, nothing to launch.
fn check_dequant(dim: u32, n: u64, [weights, out, scales, ids, status]: [u64; 5]) -> Result<bool> {
    if dim == 0 || !dim.is_multiple_of(MX_BLOCK) {
        return Err(Error::invalid(
            "dim",
            format!("{dim} is not a positive multiple of 32"),
        ));
    }
    if n == 0 {
        return Ok(false);
    }
    check_aligned("weights", weights)?;
    check_aligned("out", out)?;
    check_aligned_to("scales", scales, 1)?;
    check_aligned_to("ids", ids, 8)?;
    check_aligned_to("status", status, 8)?;
    Ok(true)
}

/// An error naming `what` unless `address` is non-null and `align`-byte aligned.
pub fn check_aligned_to(what: &'static str, address: u64, align: u64) -> Result<()> {
    if address == 0 || !address.is_multiple_of(align) {
        return Err(Error::invalid(
            what,
            format!("address {address:#x} is null or not {align}-byte aligned"),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::offset_of;

    /// Bytes of the field `field` projects out of a `T`, with no `T` at hand.
    fn field_size<T, F>(_field: fn(&T) -> &F) -> usize {
        std::mem::size_of::<F>()
    }

    /// Where each named field of `$t` ends, in bytes from the struct's start.
    macro_rules! field_ends {
        ($t:ty: $($f:ident),+) => {
            [$(offset_of!($t, $f) + field_size(|p: &$t| &p.$f)),+]
        };
    }

    /// A kernel's parameters start 16 bytes into a 64-byte line of its constant bank; what a
    /// gather reads before its first row must fit that line's 48 bytes, and what it reads only
    /// for a bad id or on the timeline comes after.
    #[test]
    fn the_fields_read_before_the_first_row_fit_one_constant_line() {
        const LINE: usize = 48;
        let gather_hot = field_ends!(GatherParams: table, ids, out, n, rows, row_bytes);
        assert!(gather_hot.iter().all(|&end| end <= LINE), "{gather_hot:?}");
        assert!(offset_of!(GatherParams, status) >= LINE);
        let dequant_hot = field_ends!(DequantParams: weights, scales, ids, out, rows, n, dim);
        assert!(
            dequant_hot.iter().all(|&end| end <= LINE),
            "{dequant_hot:?}"
        );
        assert!(offset_of!(DequantParams, status) >= LINE);
    }

    #[test]
    fn a_dequant_launch_of_2_to_the_32_rows_is_refused() {
        assert_eq!(dequant_rows(u32::MAX as u64).unwrap(), u32::MAX);
        let refused = dequant_rows(1 << 32).unwrap_err().to_string();
        assert!(refused.contains("4294967296 rows") && refused.contains("split it below 2^32"));
    }

    /// The threads and block size of gather `variant`'s grid for `p` on `sms` SMs.
    fn gather_threads(variant: GatherVariant, p: &GatherParams, sms: u32) -> Result<(u64, u32)> {
        gather_grid(variant, p, sms).map(|g| (g.threads, g.block_threads))
    }

    /// A gather of 1000 rows of 256 bytes at aligned stand-in addresses.
    fn thousand_rows() -> GatherParams {
        GatherParams {
            table: 0x1000,
            ids: 0x2000,
            out: 0x3000,
            status: 0x4000,
            n: 1000,
            rows: 10,
            row_bytes: 256,
            _pad: 0,
            timeline: fetchahead_gpu::params::TimelineParams::OFF,
        }
    }

    #[test]
    fn a_tile_variant_gets_one_block_of_its_size_per_tile() {
        let variant = GatherVariant::named("gather_bulk").unwrap();
        let p = thousand_rows();
        // 1000 rows of 256 bytes fill 31.25 tiles of 8 KiB: 32 blocks of one warp.
        assert_eq!(gather_threads(variant, &p, 132).unwrap(), (32 * 32, 32));
        let chunked = GatherParams { n: 0, ..p };
        assert_eq!(
            gather_threads(GatherVariant::at(0).unwrap(), &chunked, 132).unwrap(),
            (0, gather::BLOCK_THREADS)
        );
        // A warp span of 8 chunks a lane: 1000 rows are 16000 chunks, 62.5 spans of 256 chunks,
        // so 63 warps; a million rows are capped at one block of 256 threads an SM.
        let span = GatherVariant::named("gather_span8_b1").unwrap();
        assert_eq!(
            gather_threads(span, &p, 132).unwrap(),
            (63 * 32, gather::BLOCK_THREADS)
        );
        let big = GatherParams { n: 1 << 20, ..p };
        assert_eq!(
            gather_threads(span, &big, 132).unwrap(),
            (132 * 256, gather::BLOCK_THREADS)
        );
    }

    #[test]
    fn a_one_pass_variant_launches_every_block_and_a_small_block_variant_its_size() {
        let p = thousand_rows();
        // 1000 rows are 16000 chunks, 15.6 tiles of 4 x 256: 16 blocks, whatever fits at once.
        let tile = GatherVariant::named("gather_tile_x4").unwrap();
        assert!(tile.variant().shape.one_pass());
        assert_eq!(
            gather_threads(tile, &p, 132).unwrap(),
            (16 * 256, gather::BLOCK_THREADS)
        );
        let small = GatherVariant::named("gather_chunk16_nohint_b64").unwrap();
        assert!(!small.variant().shape.one_pass());
        assert_eq!(gather_threads(small, &p, 132).unwrap(), (16000, 64));
        let d = DequantVariant::named("gather_dequant_u8_packed_x2_pass_b64").unwrap();
        let shape = d.variant().shape;
        assert_eq!((shape.block_threads(), shape.one_pass()), (64, true));
        // 1000 rows of 256 elements are 32000 units, 500 tiles of 2 x 32: 500 warps.
        assert_eq!(shape.threads(1000, 256), 500 * 32);
        let grid = dequant_grid(shape, 1000, 256);
        assert!(grid.one_pass);
        assert_eq!(grid.threads.div_ceil(grid.block_threads as u64), 250);
        // A thread per 16-element chunk, whole warps: 1000 rows of 256 are 16000 chunks (500
        // warps, 250 blocks of 64); 3 rows of 96 are 18 chunks, one warp.
        let chunk = DequantVariant::named("gather_dequant_chunk_pass_b64").unwrap();
        let shape = chunk.variant().shape;
        assert_eq!((shape.block_threads(), shape.one_pass()), (64, true));
        assert_eq!(shape.threads(1000, 256), 16_000);
        assert_eq!(shape.threads(3, 96), 32);
        let grid = dequant_grid(shape, 1000, 256);
        assert!(grid.one_pass);
        assert_eq!(grid.threads.div_ceil(grid.block_threads as u64), 250);
        // A thread per 4 elements, whole warps: 1000 rows of 256 are 64000 quads (2000 warps,
        // 250 blocks of 256); 3 rows of 96 are 72 quads, three warps.
        let quad = DequantVariant::named("gather_dequant_quad_pass_b256").unwrap();
        let shape = quad.variant().shape;
        assert_eq!((shape.block_threads(), shape.one_pass()), (256, true));
        assert_eq!(shape.elems_per_thread(), 4);
        assert_eq!(shape.threads(1000, 256), 64_000);
        assert_eq!(shape.threads(3, 96), 96);
        let grid = dequant_grid(shape, 1000, 256);
        assert!(grid.one_pass);
        assert_eq!(grid.threads.div_ceil(grid.block_threads as u64), 250);
        // A warp per 4 rows, 2 warps a block, whatever the width: 1000 rows are 125 blocks of
        // 64; 3 rows of 96 one block, its second warp idle.
        let rows = DequantVariant::named("gather_dequant_rows4_w2").unwrap();
        let shape = rows.variant().shape;
        assert_eq!((shape.block_threads(), shape.one_pass()), (64, true));
        assert_eq!(shape.threads(1000, 256), 8_000);
        assert_eq!(shape.threads(1000, 1024), 8_000);
        assert_eq!(shape.threads(3, 96), 64);
        let grid = dequant_grid(shape, 1001, 256);
        assert!(grid.one_pass);
        assert_eq!(grid.threads.div_ceil(grid.block_threads as u64), 126);
    }

    #[test]
    fn a_rows_tile_gather_gets_a_warp_per_its_rows_in_whole_blocks() {
        // 1000 rows of 256 bytes, 2 a warp, 2 warps a block: 250 blocks of 64, in one pass.
        let p = thousand_rows();
        let v = GatherVariant::named("gather_rows2_w2").unwrap();
        let grid = gather_grid(v, &p, 132).unwrap();
        assert!(grid.one_pass);
        assert_eq!(grid.block_threads, 64);
        assert_eq!(grid.threads, 250 * 64);
        // 1001 rows: one block more, its last three warps' rows past the end.
        let p = GatherParams { n: 1001, ..p };
        assert_eq!(gather_grid(v, &p, 132).unwrap().threads, 251 * 64);
    }

    #[test]
    fn a_words_variant_gets_a_thread_per_word_in_one_pass_below_2_to_the_32() {
        let p = thousand_rows();
        let words8 = GatherVariant::named("gather_words8_pass").unwrap();
        assert!(words8.variant().shape.one_pass());
        // 1000 rows of 256 bytes: 32 words of 8 bytes a row.
        assert_eq!(
            gather_threads(words8, &p, 132).unwrap(),
            (32_000, gather::BLOCK_THREADS)
        );
        let words16 = GatherVariant::named("gather_words16_pass").unwrap();
        let narrow = GatherParams { row_bytes: 48, ..p };
        assert_eq!(
            gather_threads(words16, &narrow, 132).unwrap(),
            (3000, gather::BLOCK_THREADS)
        );
        // 48-byte rows are six words of 8 bytes.
        assert_eq!(gather_threads(words8, &narrow, 132).unwrap().0, 6000);
        // Past 2^32 threads the kernel's 32-bit indices would wrap: refused, though its 16-byte
        // chunks (3 x 2^30) are below the chunk bound.
        let huge = GatherParams { n: 3 << 26, ..p };
        let e = gather_threads(words8, &huge, 132).unwrap_err().to_string();
        assert!(e.contains("split it below 2^32"), "{e}");
    }
}
