//! Lookup traces from real serving: row ids as little-endian u64 in lookup order (`.u64`, or the
//! same xz-compressed, `.u64.xz`), and the scheduler's steps beside them (`.steps.u32`: per step
//! a little-endian u32 pair, decode tokens then prefill tokens), cut into the batches a store
//! sees: a step's ids are the next `ids_per_token` x (decode + prefill) ids of the trace.
use std::fs::File;
use std::io::{self, BufReader, Read};
use std::ops::Range;
use std::path::Path;

use crate::{Error, Result};

/// One scheduler step: tokens decoded and prompt tokens prefilled.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Step {
    pub decode: u32,
    pub prefill: u32,
}

impl Step {
    pub fn tokens(&self) -> u64 {
        u64::from(self.decode) + u64::from(self.prefill)
    }

    /// A step that prefills any prompt tokens is a prefill step; one that only decodes is not.
    pub fn is_prefill(&self) -> bool {
        self.prefill > 0
    }
}

/// A step's ids, as a range of the trace, and whether it prefills.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StepBatch {
    pub ids: Range<usize>,
    pub prefill: bool,
}

/// Reads every byte of `path`, decompressing it when its name ends in `.xz`.
fn read_all(path: &Path) -> Result<Vec<u8>> {
    let io_err = |op, e| Error::io(path, op, e);
    let file = File::open(path).map_err(|e| io_err("open", e))?;
    let meta = file.metadata().map_err(|e| io_err("stat", e))?;
    if !meta.is_file() {
        return Err(Error::invalid(
            "trace file",
            format!("{}: not a regular file", path.display()),
        ));
    }
    let mut bytes = Vec::new();
    let xz = path.extension().is_some_and(|e| e == "xz");
    if xz {
        // lzma-rs: pure Rust, so the crate still builds for aarch64 without a C cross compiler.
        lzma_rs::xz_decompress(&mut BufReader::new(file), &mut bytes).map_err(|e| {
            Error::invalid(
                "trace file",
                format!("{}: not a valid .xz file ({e})", path.display()),
            )
        })?;
    } else {
        crate::memory::check_fits(meta.len(), "the trace")?;
        BufReader::new(file)
            .read_to_end(&mut bytes)
            .map_err(|e| io_err("read", e))?;
    }
    Ok(bytes)
}

/// The row ids of a `.u64` or `.u64.xz` trace file.
pub fn read_ids(path: &Path) -> Result<Vec<i64>> {
    ids_from_bytes(&read_all(path)?)
        .map_err(|why| Error::invalid("trace file", format!("{}: {why}", path.display())))
}

/// The ids of a trace's bytes: little-endian u64, each below 2^63.
pub fn ids_from_bytes(bytes: &[u8]) -> std::result::Result<Vec<i64>, String> {
    if !bytes.len().is_multiple_of(8) {
        return Err(format!(
            "{} bytes is not a whole number of u64 row ids",
            bytes.len()
        ));
    }
    bytes
        .chunks_exact(8)
        .enumerate()
        .map(|(i, c)| {
            let mut b = [0u8; 8];
            b.copy_from_slice(c);
            i64::try_from(u64::from_le_bytes(b))
                .map_err(|_| format!("id {i} is {} (want below 2^63)", u64::from_le_bytes(b)))
        })
        .collect()
}

/// The steps of a `.steps.u32` file.
pub fn read_steps(path: &Path) -> Result<Vec<Step>> {
    let bytes = read_all(path)?;
    if !bytes.len().is_multiple_of(8) {
        return Err(Error::invalid(
            "steps file",
            format!(
                "{}: {} bytes is not a whole number of (decode, prefill) u32 pairs",
                path.display(),
                bytes.len()
            ),
        ));
    }
    let word = |c: &[u8]| {
        let mut b = [0u8; 4];
        b.copy_from_slice(c);
        u32::from_le_bytes(b)
    };
    Ok(bytes
        .chunks_exact(8)
        .map(|c| Step {
            decode: word(&c[..4]),
            prefill: word(&c[4..]),
        })
        .collect())
}

/// The trace's batches: one per step (which must account for every id, `ids_per_token` a
/// token), or without steps one per `tokens_per_batch` tokens, each counted as prefill.
pub fn step_batches(
    ids: usize,
    steps: Option<&[Step]>,
    ids_per_token: usize,
    tokens_per_batch: usize,
) -> Result<Vec<StepBatch>> {
    if ids_per_token == 0 || tokens_per_batch == 0 {
        return Err(Error::invalid(
            "trace batching",
            format!(
                "{ids_per_token} ids a token, {tokens_per_batch} tokens a batch; want both >= 1"
            ),
        ));
    }
    let Some(steps) = steps else {
        let per = ids_per_token.saturating_mul(tokens_per_batch);
        return Ok((0..ids)
            .step_by(per)
            .map(|at| StepBatch {
                ids: at..(at + per).min(ids),
                prefill: true,
            })
            .collect());
    };
    let mut out = Vec::with_capacity(steps.len());
    let mut at = 0usize;
    for (i, s) in steps.iter().enumerate() {
        let n = usize::try_from(s.tokens())
            .ok()
            .and_then(|t| t.checked_mul(ids_per_token))
            .filter(|&n| at.checked_add(n).is_some_and(|end| end <= ids));
        let Some(n) = n else {
            return Err(Error::invalid(
                "steps file",
                format!(
                    "step {i} ({} decode + {} prefill tokens) runs past the trace's {ids} ids \
                     ({ids_per_token} a token; {at} used by the steps before it)",
                    s.decode, s.prefill
                ),
            ));
        };
        out.push(StepBatch {
            ids: at..at + n,
            prefill: s.is_prefill(),
        });
        at += n;
    }
    if at != ids {
        return Err(Error::invalid(
            "steps file",
            format!(
                "its {} steps account for {at} ids, the trace has {ids} ({ids_per_token} a token)",
                steps.len()
            ),
        ));
    }
    Ok(out)
}

/// The ids of each batch, as the policy replays and Belady take them.
pub fn batch_ids(ids: &[i64], batches: &[StepBatch]) -> Vec<Vec<i64>> {
    batches
        .iter()
        .map(|b| ids.get(b.ids.clone()).unwrap_or(&[]).to_vec())
        .collect()
}

/// The prompt lengths (tokens) of a trace's requests in arrival order, from its documents file
/// (a JSON array of objects with `prompt_tokens`, as `give.docs.json`).
pub fn read_prompts(path: &Path) -> Result<Vec<u64>> {
    Ok(read_doc_fields(path, ["prompt_tokens"])?
        .into_iter()
        .map(|[p]| p)
        .collect())
}

/// The integer fields `names` of every entry of a documents file (a JSON array of objects, in
/// arrival order), or an error naming the entry without one.
pub fn read_doc_fields<const N: usize>(path: &Path, names: [&str; N]) -> Result<Vec<[u64; N]>> {
    let bytes = read_all(path)?;
    let bad = |why: String| Error::invalid("documents file", format!("{}: {why}", path.display()));
    let v: serde_json::Value =
        serde_json::from_slice(&bytes).map_err(|e| bad(format!("not JSON: {e}")))?;
    let docs = v.as_array().ok_or_else(|| bad("not a JSON array".into()))?;
    docs.iter()
        .enumerate()
        .map(|(i, d)| {
            let mut found = [0u64; N];
            for (slot, name) in found.iter_mut().zip(names) {
                *slot = d
                    .get(name)
                    .and_then(serde_json::Value::as_u64)
                    .ok_or_else(|| bad(format!("entry {i} has no integer {name}")))?;
            }
            Ok(found)
        })
        .collect()
}

/// Ids to hand the cache as future references before a step's lookup: the `ids` range of the
/// trace, looked up `steps_ahead` lookups on as [`RowStore::advise_future`] counts them (1: the
/// step about to be looked up, 2: the one after it).
///
/// [`RowStore::advise_future`]: super::RowStore::advise_future
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FutureChunk {
    pub steps_ahead: u32,
    pub ids: Range<usize>,
}

/// What a scheduler knows ahead, step by step: a request's prompt is known when its first
/// chunk runs, so the ids of its later prefill chunks are too. The scheduler is continuous
/// batching with chunked prefill, first come first served: a step's ids are its decode tokens'
/// then its prefill tokens', the prefill tokens taken from the requests in arrival order
/// (`prompts`, tokens each). Each later chunk is handed over once, at most `horizon` steps
/// before it runs (and not before its request's first chunk): entry `t` lists what to hand
/// over before step `t`'s lookup.
pub fn known_future(
    steps: &[Step],
    batches: &[StepBatch],
    prompts: &[u64],
    ids_per_token: usize,
    horizon: u32,
) -> Result<Vec<Vec<FutureChunk>>> {
    // Each request's chunks: (step, ids), in step order.
    let mut chunks: Vec<Vec<(usize, Range<usize>)>> = vec![Vec::new(); prompts.len()];
    let (mut request, mut left) = (0usize, prompts.first().copied().unwrap_or(0));
    for (t, (s, b)) in steps.iter().zip(batches).enumerate() {
        let mut at = b.ids.start + s.decode as usize * ids_per_token;
        let mut prefill = u64::from(s.prefill);
        while prefill > 0 {
            while left == 0 {
                request += 1;
                let Some(&p) = prompts.get(request) else {
                    return Err(Error::invalid(
                        "documents file",
                        format!(
                            "its {} prompts end before step {t}'s prefill tokens",
                            prompts.len()
                        ),
                    ));
                };
                left = p;
            }
            let n = prefill.min(left);
            let len = n as usize * ids_per_token;
            chunks[request].push((t, at..at + len));
            at += len;
            (prefill, left) = (prefill - n, left - n);
        }
    }
    let mut out: Vec<Vec<FutureChunk>> = vec![Vec::new(); steps.len()];
    for c in &chunks {
        let Some(&(first, _)) = c.first() else {
            continue;
        };
        for (u, ids) in c.iter().skip(1) {
            let t = u.saturating_sub(horizon as usize).max(first);
            out[t].push(FutureChunk {
                steps_ahead: (u - t + 1) as u32,
                ids: ids.clone(),
            });
        }
    }
    Ok(out)
}

/// Writes `ids` as a `.u64` trace (for tests and tools).
pub fn write_ids(path: &Path, ids: &[i64]) -> io::Result<()> {
    let bytes: Vec<u8> = ids.iter().flat_map(|&i| (i as u64).to_le_bytes()).collect();
    std::fs::write(path, bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_to_ids() {
        let b: Vec<u8> = [1u64, 2, 1 << 40]
            .iter()
            .flat_map(|x| x.to_le_bytes())
            .collect();
        assert_eq!(ids_from_bytes(&b).unwrap(), vec![1, 2, 1 << 40]);
        assert!(ids_from_bytes(&b[..7]).is_err());
        assert!(ids_from_bytes(&u64::MAX.to_le_bytes()).is_err());
    }

    #[test]
    fn steps_cut_the_trace() {
        let steps = [
            Step {
                decode: 0,
                prefill: 2,
            },
            Step {
                decode: 1,
                prefill: 0,
            },
        ];
        let b = step_batches(48, Some(&steps), 16, 1).unwrap();
        assert_eq!(
            b,
            vec![
                StepBatch {
                    ids: 0..32,
                    prefill: true
                },
                StepBatch {
                    ids: 32..48,
                    prefill: false
                }
            ]
        );
        assert!(step_batches(47, Some(&steps), 16, 1).is_err());
        assert!(step_batches(64, Some(&steps), 16, 1).is_err());
        let plain = step_batches(40, None, 16, 2).unwrap();
        assert_eq!(plain.len(), 2);
        assert_eq!(
            plain.iter().map(|b| b.ids.len()).collect::<Vec<_>>(),
            [32, 8]
        );
    }

    #[test]
    fn a_prompts_later_chunks_are_known_from_its_first() {
        // Prompts of 3 and 2 tokens, 1 id a token. Step 0 prefills 2 tokens of request 0; step 1
        // decodes 1 and prefills request 0's last token and request 1's first; step 2 decodes
        // 1 and prefills request 1's last token.
        let steps = [
            Step {
                decode: 0,
                prefill: 2,
            },
            Step {
                decode: 1,
                prefill: 2,
            },
            Step {
                decode: 1,
                prefill: 1,
            },
        ];
        let b = step_batches(7, Some(&steps), 1, 1).unwrap();
        let f = known_future(&steps, &b, &[3, 2], 1, 8).unwrap();
        // Before step 0: request 0's chunk in step 1 (id 3, after step 1's decode id 2), the
        // lookup after the next.
        assert_eq!(
            f[0],
            vec![FutureChunk {
                steps_ahead: 2,
                ids: 3..4
            }]
        );
        // Before step 1: request 1's chunk in step 2 (id 6); its first chunk is id 4.
        assert_eq!(
            f[1],
            vec![FutureChunk {
                steps_ahead: 2,
                ids: 6..7
            }]
        );
        assert!(f[2].is_empty());
        // A horizon of 0 steps still hands nothing over before the request starts.
        let f = known_future(&steps, &b, &[3, 2], 1, 0).unwrap();
        assert_eq!(f[1][0].steps_ahead, 1);
        // Too few prompts for the prefill tokens is an error.
        assert!(known_future(&steps, &b, &[3], 1, 8).is_err());
    }
}
