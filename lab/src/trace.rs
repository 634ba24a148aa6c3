//! Decode steps recorded on the device timeline: each configuration asked for run eagerly and
//! replayed from a graph captured with the timeline on, each step its own process in the trace
//! ("eager floor_plan step 1", "replayed floor_plan step 1"), so that Perfetto shows them side
//! by side. Used by `fetchahead-lab trace`, the demo (`--timeline`) and the decode-step bench
//! (`FETCHAHEAD_BENCH_TIMELINE`).
use std::sync::Arc;

use crate::decode_step::{DecodeShape, DecodeStep, StepConfig};
use crate::forward::LayerTable;
use fetchahead::Result;
use fetchahead::error::CudaCall;
use fetchahead::prefetch::lookup::MemoryRows;
use fetchahead::timeline::Trace;

/// The configurations a trace records by default: rows resident, the L2 plan off and on, and the
/// readers warmed by hand on the same kind of branch (the plan's comparison).
pub const TRACED: [StepConfig; 3] = [
    StepConfig::Floor,
    StepConfig::FloorPlan,
    StepConfig::FloorHand,
];

/// The DeepSeek-scale step cut to its first `layers` layers (at least 2): the same readers,
/// window lengths and compute a layer, the collectives scaled with the layers, one Engram layer
/// (layer 2). Short enough that every block of a step fits the default ring.
pub fn short_shape(layers: u32) -> DecodeShape {
    let full = DecodeShape::deepseek();
    let layers = layers.clamp(2, full.layers);
    let scale = |n: u32| (n as u64 * layers as u64).div_ceil(full.layers as u64) as u32;
    let (all_reduces, all_gathers) = (scale(full.all_reduces), scale(full.all_gathers));
    let windows = (full.all_reduces + full.all_gathers) as u64;
    DecodeShape {
        layers,
        all_reduces: all_reduces.max(layers),
        all_gathers,
        collectives_us: full.collectives_us * (all_reduces + all_gathers) as u64 / windows,
        engram_layers: vec![2],
        ..full
    }
}

/// One generated in-memory table per Engram layer of `shape` (the traced configurations keep
/// their rows resident on the device, so no lookup reads them during a step).
pub fn memory_tables(shape: &DecodeShape, rows: u64) -> Result<Vec<Arc<dyn LayerTable>>> {
    (0..shape.engram_layers.len() as u64)
        .map(|seed| {
            Ok(
                Arc::new(MemoryRows::generate(rows, 256, shape.seed + seed)?)
                    as Arc<dyn LayerTable>,
            )
        })
        .collect()
}

/// Records `steps` steps of each of `configs` eagerly, then as many replays of a graph of each
/// captured with the timeline on. Warms the plan first (those steps are not recorded). The
/// timeline, if off, is turned on with a ring of `capacity` records (kept by the kernels) and
/// off again after.
pub fn trace_decode_step(
    step: &mut DecodeStep,
    configs: &[StepConfig],
    steps: usize,
    capacity: u64,
) -> Result<Trace> {
    let kernels = step.kernels().clone();
    let was_on = kernels.timeline_enabled();
    if !was_on {
        kernels.enable_timeline(capacity)?;
    }
    let traced = (|| {
        step.warm_plan()?;
        kernels.take_timeline()?;
        let mut trace = Trace::new();
        for &config in configs {
            for i in 1..=steps {
                step.enqueue(config)?;
                let capture = kernels.take_timeline()?;
                trace.add_step(format!("eager {} step {i}", config.id()), capture);
            }
            let graph = step.capture(config)?;
            for i in 1..=steps {
                graph.launch().call("cuGraphLaunch")?;
                let capture = kernels.take_timeline()?;
                trace.add_step(format!("replayed {} step {i}", config.id()), capture);
            }
        }
        Ok(trace)
    })();
    if !was_on {
        kernels.disable_timeline();
    }
    traced
}
