//! The one driver of a decode step's configurations, which the demo, the decode-step bench and
//! its test run: every configuration asked for, eager and then replayed from a CUDA graph
//! captured once for it, each measured as its caller says (the demo's timed steps, the bench's
//! criterion samples, the test's checked runs), then one step on the same tokens with every
//! output poisoned first, compared bit for bit with the first configuration's.
use cudarc::driver::CudaGraph;
use fetchahead::Result;

use super::{DecodeStep, Run, Runs, StepConfig, StepOutputs};
use crate::forward::StepTime;

/// One configuration as the sweep runs it: the step, eager or with the graph captured for it.
pub struct Case<'s> {
    step: &'s mut DecodeStep,
    config: StepConfig,
    graph: Option<CudaGraph>,
}

impl Case<'_> {
    pub fn config(&self) -> StepConfig {
        self.config
    }

    /// Whether its steps replay a graph (else they are enqueued eagerly).
    pub fn replayed(&self) -> bool {
        self.graph.is_some()
    }

    /// `eager` or `graph`, as the reports name the execution mode.
    pub fn exec(&self) -> &'static str {
        if self.replayed() { "graph" } else { "eager" }
    }

    /// `eager neither`, `graph both`, ...: how failures and differences name it.
    pub fn name(&self) -> String {
        format!("{} {}", self.exec(), self.config.name())
    }

    /// One step on `tokens`, timed, recorded into `run` with the lookup time of every Engram
    /// layer and of the first, the compute before the first gather, and the bytes the plan
    /// warmed.
    pub fn timed(&mut self, tokens: &[u32], run: &mut Run) -> Result<StepTime> {
        self.step.set_tokens(tokens)?;
        let (all, first) = (self.step.engram_stats(), self.step.first_layer_stats());
        let warmed = self.step.plan().counters().bytes_prefetched;
        let t = self.once()?;
        let ms = |after: u64, before: u64| (after - before) as f64 / 1e6;
        run.record(
            t,
            ms(self.step.engram_stats().lookup_ns, all.lookup_ns),
            ms(self.step.first_layer_stats().lookup_ns, first.lookup_ns),
            self.step.before_first_gather_ms(),
        );
        run.warmed_bytes += self.step.plan().counters().bytes_prefetched - warmed;
        Ok(t)
    }

    /// One step on `tokens` with every output poisoned first: its outputs.
    pub fn checked(&mut self, tokens: &[u32]) -> Result<StepOutputs> {
        self.step.set_tokens(tokens)?;
        self.step.poison()?;
        self.once()?;
        self.step.outputs(self.config)
    }

    fn once(&mut self) -> Result<StepTime> {
        match &self.graph {
            Some(g) => self.step.time_replay(g),
            None => self.step.time(self.config),
        }
    }
}

/// What a sweep found.
#[derive(Debug, Default)]
pub struct Sweep {
    /// Each configuration's run, by (replayed, configuration).
    pub runs: Runs,
    /// The configurations whose checked outputs differ from the first's, each saying where.
    pub differences: Vec<String>,
    /// The configurations that failed, each saying why: a capture (the graphs after it are
    /// skipped), a measured step, or the checked one.
    pub failures: Vec<String>,
}

impl Sweep {
    /// Whether every configuration ran and gave the first one's outputs.
    pub fn passed(&self) -> bool {
        self.differences.is_empty() && self.failures.is_empty()
    }
}

/// Runs each of `configs` on `step`, eager and then replayed: `measure` makes its run (it may run
/// steps of its own: an untimed one first, then the timed ones), then one checked step on
/// `check_tokens` is compared with `reference`, which the first checked step sets when it is
/// `None` (a caller sweeping several steps, the bench's lookup settings, passes the same one to
/// each). A failed capture skips the graphs from there on; a failed measurement skips the
/// configuration's check.
pub fn sweep(
    step: &mut DecodeStep,
    configs: impl IntoIterator<Item = StepConfig>,
    check_tokens: &[u32],
    reference: &mut Option<StepOutputs>,
    mut measure: impl FnMut(&mut Case) -> Result<Run>,
) -> Sweep {
    let mut sweep = Sweep::default();
    let mut graphs_work = true;
    for config in configs {
        for replayed in [false, true] {
            if replayed && !graphs_work {
                continue;
            }
            let graph = if replayed {
                match step.capture(config) {
                    Ok(g) => Some(g),
                    Err(e) => {
                        let name = format!("graph {}", config.name());
                        sweep
                            .failures
                            .push(format!("{name}: capture failed, graphs skipped: {e}"));
                        graphs_work = false;
                        continue;
                    }
                }
            } else {
                None
            };
            let mut case = Case {
                step: &mut *step,
                config,
                graph,
            };
            let name = case.name();
            let run = match measure(&mut case) {
                Ok(run) => run,
                Err(e) => {
                    sweep.failures.push(format!("{name}: a step failed: {e}"));
                    continue;
                }
            };
            sweep.runs.insert((replayed, config), run);
            match case.checked(check_tokens) {
                Err(e) => sweep
                    .failures
                    .push(format!("{name}: the checked step failed: {e}")),
                Ok(out) => match reference {
                    None => *reference = Some(out),
                    Some(want) => {
                        if let Some(why) = want.first_difference(&out) {
                            sweep.differences.push(format!("{name}: {why}"));
                        }
                    }
                },
            }
        }
    }
    sweep
}
