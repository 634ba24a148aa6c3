//! The simulated model and step: its layers, windows (collectives) and readers' matrices, DeepSeek-V3's
//! by default, and the schedule of its windows.

use rand::{RngExt, SeedableRng, rngs::SmallRng};

use crate::forward::ForwardShape;
use fetchahead::{Error, Result};

use super::MIB;

/// A weight matrix a reader reads: `rows x k` bf16, `y = x w^T`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Matrix {
    pub name: &'static str,
    pub rows: u32,
    pub k: u32,
}

impl Matrix {
    pub fn bytes(&self) -> u64 {
        self.rows as u64 * self.k as u64 * 2
    }
}

/// Which collective a window is, and so which weights its readers read.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum WindowRole {
    /// An all-gather of the attention's output: the o_proj shard reads next.
    Gather,
    /// The layer's first all-reduce (after attention): the MoE block's entry reads next.
    Attention,
    /// A further all-reduce (after the MoE block): the next layer's attention input reads next.
    Moe,
}

impl WindowRole {
    pub fn is_all_reduce(self) -> bool {
        self != WindowRole::Gather
    }

    /// Mean length relative to an all-gather: an all-reduce (reduce-scatter + all-gather)
    /// moves twice the bytes.
    fn weight(self) -> f64 {
        if self.is_all_reduce() { 2.0 } else { 1.0 }
    }
}

/// One collective of the step and the layer it belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WindowSpec {
    /// 1-based.
    pub layer: u32,
    pub role: WindowRole,
    /// How long the collective polls.
    pub ns: u64,
}

/// The simulated model and step.
#[derive(Clone, Debug, PartialEq)]
pub struct DecodeShape {
    pub layers: u32,
    /// All-reduces in a step: one per layer after attention, the rest spread over the layers.
    pub all_reduces: u32,
    pub all_gathers: u32,
    /// Microseconds the step spends inside collectives, all windows together.
    pub collectives_us: u64,
    /// Whether each collective ends by writing its result, the activations its window's readers
    /// read, into L2, as a real all-reduce or all-gather does. Off, the activations sit wherever
    /// the last reader of their K left them, so that traffic between (a prefetch's) can evict
    /// them.
    pub collective_writes: bool,
    /// Each window's length is its role's mean times a factor drawn uniformly from this range
    /// (then all are scaled to `collectives_us`).
    pub spread: (f64, f64),
    /// Spin compute per layer, microseconds, split evenly before the layer's collectives.
    pub compute_us: u64,
    /// Tokens per step on this rank: the readers' M (1..=16) and the Engram hash's tokens.
    pub tokens: u32,
    /// The Engram layers (1-based, sorted, distinct), each gathering at the end of the layer.
    pub engram_layers: Vec<u32>,
    /// Engram ids per token per layer, and tokens each id hashes.
    pub heads: u32,
    pub ngram: u32,
    pub seed: u64,
    /// What each role's readers read, in order.
    pub after_gather: Vec<Matrix>,
    pub after_attention: Vec<Matrix>,
    pub after_moe: Vec<Matrix>,
}

/// DeepSeek-V3's hidden size.
const HIDDEN: u32 = 7168;

impl DecodeShape {
    /// A DeepSeek-V3-class decode step on one of 8 tensor-parallel ranks: 61 layers; the origin
    /// story's 89 all-reduces and 49 all-gathers, 3.6 ms in all; 8 tokens a step; Engram
    /// layers 2 and 15; each layer 680 us of other compute, so that the step is about the
    /// origin story's 48 ms. Readers (bf16; DeepSeek-V3 ships FP8 weights, the crate's reader
    /// is a bf16 GEMV, so every read is twice the FP8 bytes):
    /// - after an all-gather: the o_proj shard, [7168, 128 heads x 128 / 8] = 28 MiB;
    /// - after a layer's first all-reduce: the MoE router [256, 7168] (3.5 MiB), then the
    ///   shared expert's gate and up shard [2 x 2048 / 8, 7168] (7 MiB);
    /// - after a further all-reduce: the next layer's MLA down-projections, q_a and kv_a
    ///   [1536 + 576, 7168], replicated on every rank (28.9 MiB).
    pub fn deepseek() -> DecodeShape {
        DecodeShape {
            layers: 61,
            all_reduces: 89,
            all_gathers: 49,
            collectives_us: 3600,
            collective_writes: true,
            spread: (0.5, 1.5),
            compute_us: 680,
            tokens: 8,
            engram_layers: vec![2, 15],
            heads: 8,
            ngram: 3,
            seed: 17,
            after_gather: vec![Matrix {
                name: "o_proj / 8",
                rows: HIDDEN,
                k: 128 * 128 / 8,
            }],
            after_attention: vec![
                Matrix {
                    name: "router",
                    rows: 256,
                    k: HIDDEN,
                },
                Matrix {
                    name: "shared gate+up / 8",
                    rows: 2 * 2048 / 8,
                    k: HIDDEN,
                },
            ],
            after_moe: vec![Matrix {
                name: "q_a + kv_a",
                rows: 1536 + 576,
                k: HIDDEN,
            }],
        }
    }

    /// The readers of a window of `role`.
    pub fn readers(&self, role: WindowRole) -> &[Matrix] {
        match role {
            WindowRole::Gather => &self.after_gather,
            WindowRole::Attention => &self.after_attention,
            WindowRole::Moe => &self.after_moe,
        }
    }

    /// The Engram side's shape (the hash and the Engram layers) for [`EngramLayers`].
    pub fn forward_shape(&self) -> ForwardShape {
        ForwardShape {
            layers: self.layers,
            engram_layers: self.engram_layers.clone(),
            compute_us: self.compute_us,
            heads: self.heads,
            ngram: self.ngram,
            seed: self.seed,
        }
    }

    /// Refuses a shape the step cannot run (the Engram layers are checked with the tables).
    pub fn check(&self) -> Result<()> {
        let bad = |why: String| Err(Error::invalid("decode step", why));
        if self.layers == 0 || self.all_reduces < self.layers {
            return bad(format!(
                "{} layers and {} all-reduces: want at least one layer and one all-reduce a layer",
                self.layers, self.all_reduces
            ));
        }
        if self.tokens == 0 || self.tokens > 16 {
            return bad(format!("{} tokens a step, want 1..=16", self.tokens));
        }
        let (lo, hi) = self.spread;
        if !(lo > 0.0 && hi >= lo && hi.is_finite()) {
            return bad(format!("window spread {lo}..{hi}: want 0 < low <= high"));
        }
        if self.collectives_us == 0 {
            return bad("no time in collectives".into());
        }
        for role in [WindowRole::Gather, WindowRole::Attention, WindowRole::Moe] {
            let readers = self.readers(role);
            if readers.is_empty() {
                return bad(format!("no reader after a {role:?} window"));
            }
            if let Some(m) = readers
                .iter()
                .find(|m| m.rows == 0 || m.rows % 16 != 0 || m.k == 0 || m.k % 32 != 0)
            {
                return bad(format!(
                    "{} is [{}, {}]: want rows a positive multiple of 16, k of 32",
                    m.name, m.rows, m.k
                ));
            }
        }
        Ok(())
    }

    /// The step's collectives in order, drawn from the seed: each layer's all-gathers, its
    /// attention all-reduce, then its further all-reduces; the extra all-reduces and the
    /// all-gathers go to layers drawn uniformly; lengths are each role's mean (an all-reduce
    /// twice an all-gather) times a factor drawn from `spread`, scaled so that they add up to
    /// `collectives_us`.
    pub fn schedule(&self) -> Result<Vec<WindowSpec>> {
        self.check()?;
        let mut rng = SmallRng::seed_from_u64(self.seed);
        let layers = self.layers as usize;
        let mut gathers = vec![0u32; layers];
        let mut moe = vec![0u32; layers];
        for _ in 0..self.all_gathers {
            gathers[rng.random_range(0..layers)] += 1;
        }
        for _ in self.layers..self.all_reduces {
            moe[rng.random_range(0..layers)] += 1;
        }
        let mut roles = Vec::new();
        for l in 0..layers {
            let layer = l as u32 + 1;
            let push = |roles: &mut Vec<(u32, WindowRole)>, role, n| {
                roles.extend((0..n).map(|_| (layer, role)));
            };
            push(&mut roles, WindowRole::Gather, gathers[l]);
            push(&mut roles, WindowRole::Attention, 1);
            push(&mut roles, WindowRole::Moe, moe[l]);
        }
        let (lo, hi) = self.spread;
        let lengths: Vec<f64> = roles
            .iter()
            .map(|(_, role)| {
                role.weight()
                    * if hi > lo {
                        rng.random_range(lo..hi)
                    } else {
                        lo
                    }
            })
            .collect();
        let scale = self.collectives_us as f64 * 1e3 / lengths.iter().sum::<f64>();
        Ok(roles
            .iter()
            .zip(&lengths)
            .map(|(&(layer, role), len)| WindowSpec {
                layer,
                role,
                ns: (len * scale).round().max(1.0) as u64,
            })
            .collect())
    }

    /// The lines that state the step's sizes and assumptions (for the bench and the demo).
    pub fn describe(&self, windows: &[WindowSpec]) -> Vec<String> {
        let count = |role| windows.iter().filter(|w| w.role == role).count();
        let total_ns: u64 = windows.iter().map(|w| w.ns).sum();
        let (min, max) = windows
            .iter()
            .fold((u64::MAX, 0), |(a, b), w| (a.min(w.ns), b.max(w.ns)));
        let bytes: u64 = windows
            .iter()
            .map(|w| self.readers(w.role).iter().map(Matrix::bytes).sum::<u64>())
            .sum();
        let readers = |role| {
            self.readers(role)
                .iter()
                .map(|m| {
                    format!(
                        "{} [{} x {}] {:.1} MiB",
                        m.name,
                        m.rows,
                        m.k,
                        m.bytes() as f64 / MIB
                    )
                })
                .collect::<Vec<_>>()
                .join(" then ")
        };
        vec![
            format!(
                "decode step: {} layers, {} all-reduce and {} all-gather windows ({:.2} ms in all, \
                 {:.1}-{:.1} us each, drawn from seed {}), {} us of spin compute a layer, {} \
                 tokens a step (the readers' M), Engram layers {:?} ({} ids a token each)",
                self.layers,
                count(WindowRole::Attention) + count(WindowRole::Moe),
                count(WindowRole::Gather),
                total_ns as f64 / 1e6,
                min as f64 / 1e3,
                max as f64 / 1e3,
                self.seed,
                self.compute_us,
                self.tokens,
                self.engram_layers,
                self.heads
            ),
            format!(
                "readers (bf16 GEMV, weights of DeepSeek-V3 shapes per rank of 8; each window's \
                 weights its own, {:.2} GiB a step, so every read is cold without the plan; the \
                 activations one buffer per K, read by every reader of that K, {}): after an \
                 all-gather: {}; after a layer's first all-reduce: {}; after a further \
                 all-reduce: {}",
                bytes as f64 / (MIB * 1024.0),
                if self.collective_writes {
                    "rewritten by each window's collective as a real one writes its result"
                } else {
                    "left unwritten by the collectives (FETCHAHEAD_BENCH_COLLECTIVE_WRITES=0)"
                },
                readers(WindowRole::Gather),
                readers(WindowRole::Attention),
                readers(WindowRole::Moe)
            ),
        ]
    }
}
