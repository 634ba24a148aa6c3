//! The device timeline: kernels launched with it on record one finished block each (start <=
//! end, on an SM of this device, the launch's label and kernel), launches with it off record
//! nothing, and a graph captured with it on records every replay. Without a GPU the runner
//! reports the GPU tests as ignored; with FETCHAHEAD_REQUIRE_GPU=1 they fail.
mod common;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use cudarc::driver::{CudaStream, DevicePtr, sys};
use fetchahead::device_abi::l2_prefetch::BULK_VARIANT;
use fetchahead::device_abi::params::{PrefetchParams, Segment, TimelineParams};
use fetchahead::device_abi::timeline::TimelineRecord;
use fetchahead::device_abi::{collective, gather, l2_prefetch, spin};
use fetchahead::kernels::gpu::Gpu;
use fetchahead::kernels::id_check::IdCheck;
use fetchahead::l2_plan::SegmentTable;
use fetchahead::tables::table::{Placement, RowTable};
use fetchahead::timeline::{Capture, DEFAULT_CAPACITY};
use fetchahead::{Error, GatherVariant, Result};
use fetchahead_lab::LabKernels;
use fetchahead_lab::trace::short_shape;

const ROW_BYTES: u32 = 256;
const ROWS: u64 = 4096;
/// Gathered rows: 16 chunks a row, one thread a chunk, 256 threads a block: 63 blocks.
const GATHERED: u64 = 1000;
const PREFETCH_BLOCKS: u32 = 6;
const COLLECTIVE_BLOCKS: u32 = 3;

fn cuda(call: &'static str) -> impl Fn(cudarc::driver::DriverError) -> Error {
    move |source| Error::Cuda { call, source }
}

fn id_of(name: &str) -> u32 {
    fetchahead::device_abi::all_kernels()
        .position(|e| e.name == name)
        .expect("a kernel of all_kernels()") as u32
}

/// Each kernel's records, by kernel id.
fn by_kernel(capture: &Capture) -> BTreeMap<u32, Vec<TimelineRecord>> {
    let mut map: BTreeMap<u32, Vec<TimelineRecord>> = BTreeMap::new();
    for r in &capture.records {
        map.entry(r.kernel).or_default().push(*r);
    }
    map
}

/// A gather, a bulk L2 prefetch, a collective and a spin on `stream`, with the labels 1-4;
/// returns the gather's output and the blocks each launch has.
struct Launches {
    table: RowTable,
    bytes: Vec<u8>,
    ids: Vec<i64>,
    prefetch: SegmentTable,
    check: IdCheck,
    _buffer: cudarc::driver::CudaSlice<u8>,
}

impl Launches {
    fn new(stream: &Arc<CudaStream>) -> Result<Launches> {
        let bytes: Vec<u8> = (0..ROWS * ROW_BYTES as u64)
            .map(|i| ((i * 2654435761) >> 7) as u8)
            .collect();
        let table = RowTable::from_bytes(stream, &bytes, ROW_BYTES, Placement::Device)?;
        let ids: Vec<i64> = (0..GATHERED as i64)
            .map(|i| (i * 37) % ROWS as i64)
            .collect();
        let buffer = stream
            .alloc_zeros::<u8>(8 << 20)
            .map_err(cuda("cuMemAlloc"))?;
        let base = buffer.device_ptr(stream).0;
        let segments: Vec<Segment> = (0..8)
            .map(|i| Segment {
                address: base + i * (1 << 20),
                bytes: 1 << 20,
            })
            .collect();
        let prefetch = SegmentTable::upload(stream, &segments)?;
        let check = IdCheck::new(stream)?;
        Ok(Launches {
            table,
            bytes,
            ids,
            prefetch,
            check,
            _buffer: buffer,
        })
    }

    /// Launches all four; returns the gather's output.
    fn run(&mut self, kernels: &LabKernels, stream: &Arc<CudaStream>) -> Result<Vec<u8>> {
        let variant = GatherVariant::named("gather_chunk16").expect("the plain gather");
        let ids = stream.clone_htod(&self.ids).map_err(cuda("cuMemcpyHtoD"))?;
        let mut out = stream
            .alloc_zeros::<u8>(GATHERED as usize * ROW_BYTES as usize)
            .map_err(cuda("cuMemAlloc"))?;
        let s = stream.cu_stream();
        kernels.set_timeline_label(1);
        self.table
            .gather(kernels, stream, variant, &ids, &mut out, &self.check)?;
        kernels.set_timeline_label(2);
        let p = PrefetchParams {
            segments: self.prefetch.address(),
            n: self.prefetch.len() as u64,
            chunk: l2_prefetch::DEFAULT_CHUNK,
            once_jobs: 0,
            partitions: 0,
            claims: 0,
            timeline: TimelineParams::OFF,
        };
        // SAFETY: the table holds checked segments inside `_buffer`, alive past the sync; the
        // collective polls no flag; the spin touches no memory.
        unsafe {
            kernels.launch_l2_prefetch(s, BULK_VARIANT, p, PREFETCH_BLOCKS, 64)?;
            kernels.set_timeline_label(3);
            kernels.launch_collective(s, COLLECTIVE_BLOCKS, 2_000, 0)?;
            kernels.set_timeline_label(4);
            kernels.launch_spin(s, 1_000)?;
        }
        kernels.set_timeline_label(fetchahead::device_abi::timeline::NO_LABEL);
        stream.synchronize().map_err(cuda("cuStreamSynchronize"))?;
        stream.clone_dtoh(&out).map_err(cuda("cuMemcpyDtoH"))
    }

    fn expected(&self) -> Vec<u8> {
        let row = ROW_BYTES as usize;
        self.ids
            .iter()
            .flat_map(|&id| self.bytes[id as usize * row..(id as usize + 1) * row].to_vec())
            .collect()
    }
}

/// Blocks of the gather: one thread a 16-byte chunk, in blocks of the variant's size.
fn gather_blocks() -> u32 {
    let shape = GatherVariant::named("gather_chunk16")
        .expect("the plain gather")
        .variant()
        .shape;
    assert!(matches!(
        shape,
        gather::Shape::ChunkPerThread { unroll: 1, .. }
    ));
    (GATHERED * (ROW_BYTES / 16) as u64).div_ceil(shape.block_threads() as u64) as u32
}

fn each_instrumented_kernel_records_each_of_its_blocks() -> Result<()> {
    let Some(gpu) = Gpu::for_test("each_instrumented_kernel_records_each_of_its_blocks")? else {
        return Ok(());
    };
    let kernels = LabKernels::load(&gpu)?;
    let stream = gpu.ctx.new_stream().map_err(cuda("cuStreamCreate"))?;
    let mut launches = Launches::new(&stream)?;
    assert!(!kernels.timeline_enabled(), "off by default");
    assert!(
        kernels.take_timeline().is_err(),
        "never enabled: nothing to read"
    );
    assert!(kernels.enable_timeline(3).is_err(), "not a power of two");
    kernels.enable_timeline(DEFAULT_CAPACITY)?;
    assert!(
        kernels.enable_timeline(DEFAULT_CAPACITY * 2).is_err(),
        "another capacity"
    );
    let out = launches.run(&kernels, &stream)?;
    assert_eq!(out, launches.expected(), "the gather's rows, timeline on");
    let capture = kernels.take_timeline()?;
    assert_eq!((capture.lost, capture.unfinished), (0, 0));
    let sms = gpu.multiprocessors;
    let want = [
        (id_of("gather_chunk16"), 1, gather_blocks()),
        (id_of(l2_prefetch::BULK_VARIANT.name()), 2, PREFETCH_BLOCKS),
        (id_of(collective::KERNEL), 3, COLLECTIVE_BLOCKS),
        (id_of(spin::KERNEL), 4, sms),
    ];
    let got = by_kernel(&capture);
    assert_eq!(
        got.len(),
        want.len(),
        "one kernel a launch: {:?}",
        got.keys()
    );
    for (kernel, label, blocks) in want {
        let records = got.get(&kernel).map_or(&[][..], Vec::as_slice);
        let name = fetchahead::timeline::trace::kernel_name(kernel);
        assert_eq!(records.len(), blocks as usize, "{name}: one record a block");
        let distinct: BTreeSet<u32> = records.iter().map(|r| r.block).collect();
        assert_eq!(distinct, (0..blocks).collect(), "{name}: every block once");
        for r in records {
            assert!(r.start_ns > 0 && r.end_ns >= r.start_ns, "{name}: {r:?}");
            assert!(r.sm < sms, "{name}: SM {} of {sms}", r.sm);
            assert_eq!(r.label, label, "{name}");
        }
    }
    // The collective's blocks poll for 2 us each.
    for r in &got[&id_of(collective::KERNEL)] {
        assert!(r.end_ns - r.start_ns >= 2_000, "{r:?}");
    }

    // Off again: the ring stays, nothing is written to it.
    kernels.disable_timeline();
    let out = launches.run(&kernels, &stream)?;
    assert_eq!(out, launches.expected(), "the gather's rows, timeline off");
    let capture = kernels.take_timeline()?;
    assert_eq!(
        (capture.records.len(), capture.lost, capture.unfinished),
        (0, 0, 0)
    );
    Ok(())
}

fn a_graph_captured_with_the_timeline_records_every_replay() -> Result<()> {
    let Some(gpu) = Gpu::for_test("a_graph_captured_with_the_timeline_records_every_replay")?
    else {
        return Ok(());
    };
    let kernels = LabKernels::load(&gpu)?;
    let stream = gpu.ctx.new_stream().map_err(cuda("cuStreamCreate"))?;
    let mut launches = Launches::new(&stream)?;
    kernels.enable_timeline(1 << 12)?;
    let mode = sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL;
    stream
        .begin_capture(mode)
        .map_err(cuda("cuStreamBeginCapture"))?;
    kernels.set_timeline_label(8);
    // SAFETY: polls no flag.
    let launched = unsafe { kernels.launch_collective(stream.cu_stream(), 2, 1_000, 0) };
    let graph = stream
        .end_capture(sys::CUgraphInstantiate_flags(0))
        .map_err(cuda("cuStreamEndCapture"))?;
    launched?;
    let graph = graph.ok_or_else(|| Error::invalid("graph", "nothing captured"))?;
    // The timeline off after the capture: the graph's nodes still carry the ring.
    kernels.disable_timeline();
    assert!(
        kernels.take_timeline()?.records.is_empty(),
        "a capture runs nothing"
    );
    for _ in 0..3 {
        graph.launch().map_err(cuda("cuGraphLaunch"))?;
    }
    let capture = kernels.take_timeline()?;
    assert_eq!(capture.records.len(), 6, "2 blocks x 3 replays");
    assert!(
        capture
            .records
            .iter()
            .all(|r| r.label == 8 && r.end_ns >= r.start_ns)
    );
    drop(graph);
    // And the eager launches after it record nothing.
    launches.run(&kernels, &stream)?;
    assert!(kernels.take_timeline()?.records.is_empty());
    Ok(())
}

/// `fetchahead-lab trace`'s step: a valid schedule for any layer count asked for.
fn the_trace_command_runs_a_short_valid_step() {
    for layers in [0, 2, 4, 10, 61, 100] {
        let shape = short_shape(layers);
        let windows = shape
            .schedule()
            .unwrap_or_else(|e| panic!("{layers} layers: {e}"));
        assert_eq!(shape.layers, layers.clamp(2, 61));
        assert_eq!(
            windows.len() as u32,
            shape.all_reduces + shape.all_gathers,
            "{layers} layers"
        );
        assert_eq!(shape.engram_layers, [2]);
    }
    assert!(short_shape(4).collectives_us < short_shape(61).collectives_us);
}

common::harness::tests! {
    cpu: [the_trace_command_runs_a_short_valid_step],
    gpu: [
        each_instrumented_kernel_records_each_of_its_blocks,
        a_graph_captured_with_the_timeline_records_every_replay,
    ],
}
