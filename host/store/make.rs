//! Writing generated Engram tables in the layout the store reads: deterministic for a seed, each
//! shard's data section starting on a page boundary.
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use safetensors::Dtype;
use safetensors::tensor::{Metadata, TensorInfo};

use super::layout::{INDEX_FILE, MAX_DIM, MX_BLOCK, PAGE, scale_name, weight_name};
use crate::{Error, Result};

/// Bytes generated per seeded chunk: each chunk has its own generator, so the bytes of a table
/// do not depend on how it is written.
const CHUNK: usize = 1 << 20;

#[derive(Clone, Debug)]
pub struct TableSpec {
    pub rows: u64,
    pub layers: Vec<u32>,
    pub dim: usize,
    pub shards: usize,
    pub seed: u64,
}

impl TableSpec {
    /// Every tensor as (name, dtype, [rows, cols]), in the order they are written.
    fn tensors(&self) -> Vec<(String, Dtype, [usize; 2])> {
        let mut t = Vec::with_capacity(2 * self.layers.len());
        for &l in &self.layers {
            t.push((
                weight_name(l),
                Dtype::F8_E4M3,
                [self.rows as usize, self.dim],
            ));
            t.push((
                scale_name(l),
                Dtype::F8_E8M0,
                [self.rows as usize, self.dim / MX_BLOCK],
            ));
        }
        t
    }

    /// Bytes of every tensor together.
    pub fn data_bytes(&self) -> u64 {
        self.layers.len() as u64 * self.rows * (self.dim + self.dim / MX_BLOCK) as u64
    }

    fn check(&self) -> Result<()> {
        let tensors = 2 * self.layers.len();
        let why = if self.rows == 0 {
            Some("rows must be positive".to_string())
        } else if self.layers.is_empty() {
            Some("no layers".to_string())
        } else if self.dim == 0 || !self.dim.is_multiple_of(MX_BLOCK) || self.dim > MAX_DIM {
            Some(format!(
                "dim {} is not a multiple of {MX_BLOCK} up to {MAX_DIM}",
                self.dim
            ))
        } else if self.shards == 0 || self.shards > tensors {
            Some(format!(
                "{} shards for {tensors} tensors: a tensor lives whole in one shard",
                self.shards
            ))
        } else {
            let mut layers = self.layers.clone();
            layers.sort_unstable();
            layers.dedup();
            (layers.len() != self.layers.len()).then(|| "a layer is listed twice".to_string())
        };
        match why {
            Some(why) => Err(Error::invalid("table spec", why)),
            None => Ok(()),
        }
    }
}

/// The byte of a generated tensor at chunk `chunk`: FP8 weights never NaN (0x7f/0xff), E8M0
/// scales within 2^-9..2^6 so that dequantized values stay finite.
fn fill_chunk(spec: &TableSpec, tensor: usize, dtype: Dtype, chunk: u64, out: &mut [u8]) {
    let stream = spec.seed
        ^ (tensor as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15)
        ^ chunk.wrapping_mul(0xbf58_476d_1ce4_e5b9);
    let mut rng = SmallRng::seed_from_u64(stream);
    rng.fill_bytes(out);
    match dtype {
        Dtype::F8_E4M3 => out
            .iter_mut()
            .filter(|b| **b & 0x7f == 0x7f)
            .for_each(|b| *b ^= 1),
        _ => out.iter_mut().for_each(|b| *b = 118 + (*b & 15)),
    }
}

/// Writes `spec` into `dir` (`model.safetensors`, or K shards and an index); `progress` gets
/// bytes written so far. Returns the files written.
pub fn write_table(
    dir: &Path,
    spec: &TableSpec,
    mut progress: impl FnMut(u64),
) -> Result<Vec<PathBuf>> {
    spec.check()?;
    std::fs::create_dir_all(dir).map_err(|e| Error::io(dir, "create_dir_all", e))?;
    let tensors = spec.tensors();
    // Weights before scales in every shard, so that weight rows stay page-aligned.
    let per = tensors.len().div_ceil(spec.shards);
    let mut groups: Vec<Vec<usize>> = (0..tensors.len())
        .collect::<Vec<_>>()
        .chunks(per)
        .map(<[usize]>::to_vec)
        .collect();
    while groups.len() < spec.shards {
        // Too few tensors for even chunks: split the largest group.
        let Some((g, _)) = groups.iter().enumerate().max_by_key(|(_, g)| g.len()) else {
            break;
        };
        let half = groups[g].len() / 2;
        let tail = groups[g].split_off(half);
        groups.insert(g + 1, tail);
    }
    for g in &mut groups {
        g.sort_by_key(|&t| (tensors[t].1 != Dtype::F8_E4M3, t));
    }
    let names: Vec<String> = if spec.shards == 1 {
        vec!["model.safetensors".into()]
    } else {
        (1..=spec.shards)
            .map(|i| format!("model-{i:05}-of-{:05}.safetensors", spec.shards))
            .collect()
    };
    let mut written = 0u64;
    let mut weight_map = serde_json::Map::new();
    let mut files = Vec::with_capacity(names.len());
    let mut chunk = vec![0u8; CHUNK];
    for (name, group) in names.iter().zip(&groups) {
        let mut infos = Vec::with_capacity(group.len());
        let mut offset = 0usize;
        for &t in group {
            let (tname, dtype, shape) = &tensors[t];
            let bytes = shape[0] * shape[1] * dtype.bitsize() / 8;
            infos.push((
                tname.clone(),
                TensorInfo {
                    dtype: *dtype,
                    shape: shape.to_vec(),
                    data_offsets: (offset, offset + bytes),
                },
            ));
            offset += bytes;
            weight_map.insert(tname.clone(), serde_json::Value::String(name.clone()));
        }
        let metadata =
            Metadata::new(None, infos).map_err(|e| Error::invalid("table spec", e.to_string()))?;
        let mut header = serde_json::to_vec(&metadata)
            .map_err(|e| Error::invalid("table spec", e.to_string()))?;
        // Spaces after the JSON (allowed by the format) put the data on a page boundary.
        let padded = (8 + header.len() as u64).next_multiple_of(PAGE) - 8;
        header.resize(padded as usize, b' ');
        let path = dir.join(name);
        let file = File::create(&path).map_err(|e| Error::io(&path, "create", e))?;
        let mut w = BufWriter::with_capacity(CHUNK, file);
        let io = |e| Error::io(&path, "write", e);
        w.write_all(&padded.to_le_bytes()).map_err(io)?;
        w.write_all(&header).map_err(io)?;
        for &t in group {
            let (_, dtype, shape) = &tensors[t];
            let mut left = shape[0] * shape[1] * dtype.bitsize() / 8;
            let mut c = 0u64;
            while left > 0 {
                let n = left.min(CHUNK);
                fill_chunk(spec, t, *dtype, c, &mut chunk[..n]);
                w.write_all(&chunk[..n]).map_err(io)?;
                left -= n;
                c += 1;
                written += n as u64;
                progress(written);
            }
        }
        w.flush().map_err(io)?;
        files.push(path);
    }
    if spec.shards > 1 {
        let index = serde_json::json!({
            "metadata": { "total_size": spec.data_bytes() },
            "weight_map": weight_map,
        });
        let path = dir.join(INDEX_FILE);
        let text = serde_json::to_string_pretty(&index)
            .map_err(|e| Error::invalid("index", e.to_string()))?;
        std::fs::write(&path, text).map_err(|e| Error::io(&path, "write", e))?;
        files.push(path);
    }
    Ok(files)
}
