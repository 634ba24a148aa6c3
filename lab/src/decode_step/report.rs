//! A configuration's timed steps and the step table of an execution mode.

use crate::forward::{GatherPath, StepTime};

use super::{MIB, StepConfig};

/// The `q` quantile (0..=1, nearest rank) of `v`, NaN when empty.
pub fn percentile(v: &mut [f64], q: f64) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(f64::total_cmp);
    v[((v.len() - 1) as f64 * q.clamp(0.0, 1.0)).round() as usize]
}

/// One configuration's timed steps.
#[derive(Clone, Debug, Default)]
pub struct Run {
    /// GPU milliseconds of each step.
    pub steps: Vec<f64>,
    pub enqueue_ms: f64,
    pub overruns: usize,
    /// Milliseconds inside the step's Engram lookups (all layers), summed over the steps.
    pub lookup_ms: f64,
    /// Steps whose first Engram layer's lookup took no longer than the step's work before its
    /// gather (the prefetcher's condition), their GPU and lookup milliseconds.
    pub held: usize,
    pub held_gpu_ms: f64,
    pub held_lookup_ms: f64,
    /// Bytes the plan warmed over the steps (eager; a graph counts at its capture).
    pub warmed_bytes: u64,
}

impl Run {
    /// Adds a step: its time, its lookups' milliseconds (all layers, the first layer) and the
    /// work before the first gather.
    pub fn record(&mut self, t: StepTime, lookup_ms: f64, first_ms: f64, before_ms: f64) {
        self.steps.push(t.gpu_ms);
        self.enqueue_ms += t.enqueue_ms;
        self.overruns += usize::from(t.lead_in_overrun);
        self.lookup_ms += lookup_ms;
        if first_ms > 0.0 && first_ms <= before_ms {
            self.held += 1;
            self.held_gpu_ms += t.gpu_ms;
            self.held_lookup_ms += lookup_ms;
        }
    }

    pub fn mean(&self) -> f64 {
        self.steps.iter().sum::<f64>() / self.steps.len().max(1) as f64
    }

    /// The standard error of the mean.
    pub fn sem(&self) -> f64 {
        let n = self.steps.len();
        if n < 2 {
            return f64::NAN;
        }
        let m = self.mean();
        let var = self.steps.iter().map(|x| (x - m).powi(2)).sum::<f64>() / (n - 1) as f64;
        (var / n as f64).sqrt()
    }

    /// (p10, p90) of the step times.
    pub fn spread(&self) -> (f64, f64) {
        let mut v = self.steps.clone();
        (percentile(&mut v, 0.1), percentile(&mut v, 0.9))
    }

    /// Mean milliseconds of a step's lookups.
    pub fn lookup(&self) -> f64 {
        self.lookup_ms / self.steps.len().max(1) as f64
    }
}

/// The runs of one lookup setting, by (graph replayed, configuration).
pub type Runs = std::collections::BTreeMap<(bool, StepConfig), Run>;

/// The step table of one execution mode: every configuration's mean step, what it saves
/// against neither feature, and its Engram stall against its floor; then the goal's lines.
pub fn report(label: &str, graph: bool, runs: &Runs) -> Vec<String> {
    let mode = if graph { "graph" } else { "eager" };
    let get = |c: StepConfig| runs.get(&(graph, c)).filter(|r| !r.steps.is_empty());
    let Some(neither) = get(StepConfig::Neither) else {
        return vec![format!("{label} {mode}: no steps of neither feature")];
    };
    let base = neither.mean();
    let mut lines = vec![
        format!("{label} lookups, {mode}:"),
        format!(
            "  {:<24} {:>9} {:>17} {:>17} {:>26} {:>8}",
            "configuration",
            "step ms",
            "p10-p90 ms",
            "saves (share)",
            "Engram stall (of lookups)",
            "enqueue"
        ),
    ];
    for c in StepConfig::ALL {
        let Some(r) = get(c) else { continue };
        let (p10, p90) = r.spread();
        let saved = match c.gather() {
            GatherPath::Resident => "-".to_string(),
            _ => {
                let saved = base - r.mean();
                format!("{saved:.3} ({:.2}%)", 100.0 * saved / base)
            }
        };
        let stall = match (c.gather(), get(c.floor())) {
            (GatherPath::Resident, _) | (_, None) => "-".to_string(),
            (_, Some(floor)) => {
                let stall = r.mean() - floor.mean();
                format!(
                    "{stall:.3} ms ({:.1}% of {:.3})",
                    100.0 * stall / r.lookup().max(1e-9),
                    r.lookup()
                )
            }
        };
        lines.push(format!(
            "  {:<24} {:>9.3} {:>17} {:>17} {:>26} {:>8.3}{}",
            c.name(),
            r.mean(),
            format!("{p10:.3}-{p90:.3}"),
            saved,
            stall,
            r.enqueue_ms / r.steps.len() as f64,
            if r.overruns > 0 {
                format!(" (lead-in ran out in {} of {})", r.overruns, r.steps.len())
            } else {
                String::new()
            }
        ));
    }
    if let (Some(both), Some(floor)) = (get(StepConfig::Both), get(StepConfig::FloorPlan)) {
        let stall = both.mean() - floor.mean();
        let share = 100.0 * stall / both.lookup().max(1e-9);
        let held = if both.held > 0 {
            let n = both.held as f64;
            let held_stall = both.held_gpu_ms / n - floor.mean();
            format!(
                "; the {} of {} steps whose first lookup fit before its gather: {:.1}%",
                both.held,
                both.steps.len(),
                100.0 * held_stall / (both.held_lookup_ms / n).max(1e-9)
            )
        } else {
            format!(
                "; no step's first lookup fit before its gather (of {})",
                both.steps.len()
            )
        };
        lines.push(format!(
            "  goal, both on: Engram stall {stall:.3} ms = {share:.1}% of the step's {:.3} ms of \
             lookups (<= 2%: {}){held}",
            both.lookup(),
            if share <= 2.0 { "met" } else { "NOT met" }
        ));
    }
    for (with, without, what) in [
        (
            StepConfig::FloorPlan,
            StepConfig::Floor,
            "L2 plan with rows resident",
        ),
        (
            StepConfig::Plan,
            StepConfig::Neither,
            "L2 plan with synchronous Engram lookups",
        ),
        (
            StepConfig::Both,
            StepConfig::Prefetcher,
            "L2 plan with the Engram prefetcher",
        ),
        (
            StepConfig::FloorHand,
            StepConfig::Floor,
            "readers warmed by hand on a side branch, rows resident",
        ),
    ] {
        if let (Some(a), Some(b)) = (get(with), get(without)) {
            let saved = b.mean() - a.mean();
            let noise = 3.0 * (a.sem().powi(2) + b.sem().powi(2)).sqrt();
            let warmed = if with == StepConfig::FloorHand {
                "every reader's weights, by its own GEMV".to_string()
            } else if graph {
                "its graph warms what its capture did".to_string()
            } else {
                format!(
                    "warmed {:.1} MiB a step",
                    a.warmed_bytes as f64 / MIB / a.steps.len() as f64
                )
            };
            lines.push(format!(
                "  {what}: saves {saved:.3} ms = {:.2}% of the step (3 standard \
                 errors of the difference: {noise:.3} ms: {}); {warmed}",
                100.0 * saved / b.mean(),
                if saved > noise {
                    "measurable"
                } else {
                    "NOT measurable"
                },
            ));
        }
    }
    lines
}

/// The share of its ideal the L2 plan's saving should reach, in either execution mode.
pub const PLAN_GOAL: f64 = 0.8;
