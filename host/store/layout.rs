//! Where each Engram layer's rows live: safetensors shards, found through
//! `model.safetensors.index.json` or a single `.safetensors` file, checked before any row is read.
use std::collections::BTreeMap;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use safetensors::Dtype;
use safetensors::tensor::TensorInfo;

use super::file::{open_regular, read_small};
use crate::{Error, Result};

/// Bytes of one page: the unit of O_DIRECT reads.
pub const PAGE: u64 = 4096;
/// Elements sharing one E8M0 scale.
pub const MX_BLOCK: usize = fetchahead_gpu::params::MX_BLOCK as usize;
/// The widest row the read plan handles (a row plus its page padding fits one read slot).
pub const MAX_DIM: usize = 8192;
/// The most rows a table may have: row ids are `i64`.
pub const MAX_ROWS: u64 = i64::MAX as u64;

/// The row width every table must have, whichever kind (shards, an in-memory table) and entry
/// point (Rust, C, Python, the CLI): a multiple of 32 from 32 to [`MAX_DIM`]. Err says why not.
pub fn check_dim(dim: u64) -> std::result::Result<(), String> {
    if dim == 0 || !dim.is_multiple_of(MX_BLOCK as u64) || dim > MAX_DIM as u64 {
        return Err(format!(
            "{dim}; want a multiple of {MX_BLOCK} from {MX_BLOCK} to {MAX_DIM}"
        ));
    }
    Ok(())
}

/// The rows every table must have: 1 to [`MAX_ROWS`]. Err says why not.
pub fn check_rows(rows: u64) -> std::result::Result<(), String> {
    if rows == 0 || rows > MAX_ROWS {
        return Err(format!("{rows}; want 1 to {MAX_ROWS} rows"));
    }
    Ok(())
}

/// The index file of a sharded model directory.
pub const INDEX_FILE: &str = "model.safetensors.index.json";
/// safetensors refuses headers over 100 MB; so do we, before allocating.
const MAX_HEADER: u64 = 100_000_000;
/// An index file larger than this is not an index.
const MAX_INDEX: u64 = 100_000_000;

pub fn weight_name(layer: u32) -> String {
    format!("layers.{layer}.engram.embed.weight")
}

pub fn scale_name(layer: u32) -> String {
    format!("layers.{layer}.engram.embed.scale")
}

/// One tensor's bytes in one shard.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorSpan {
    pub name: String,
    /// Index into [`TableLayout::files`].
    pub file: usize,
    pub dtype: Dtype,
    /// Absolute byte offset of row 0 in the file.
    pub offset: u64,
    pub rows: u64,
    pub row_bytes: u64,
}

impl TensorSpan {
    /// Absolute file offset of `row`'s first byte.
    pub fn row_offset(&self, row: u64) -> u64 {
        self.offset + row * self.row_bytes
    }

    /// Bytes from row 0 to the end of the tensor.
    pub fn len(&self) -> u64 {
        self.rows * self.row_bytes
    }

    pub fn is_empty(&self) -> bool {
        self.rows == 0
    }

    /// Of the rows in one period of the page grid, how many cross a page boundary.
    pub fn straddling_rows_per_period(&self) -> (u64, u64) {
        let period = PAGE / gcd(self.row_bytes, PAGE);
        let straddle = (0..period)
            .filter(|r| (self.offset + r * self.row_bytes) % PAGE + self.row_bytes > PAGE)
            .count() as u64;
        (straddle, period)
    }
}

fn gcd(a: u64, b: u64) -> u64 {
    if b == 0 { a.max(1) } else { gcd(b, a % b) }
}

/// One Engram layer: FP8-E4M3 rows and their E8M0 scales.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LayerLayout {
    pub layer: u32,
    pub weight: TensorSpan,
    pub scale: TensorSpan,
}

/// One shard file and what its header says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ShardFile {
    pub path: PathBuf,
    pub len: u64,
    /// Offset of the data section (8 + header length).
    pub data_start: u64,
}

/// Every Engram layer of a table, validated against the files' lengths.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TableLayout {
    pub files: Vec<ShardFile>,
    /// Sorted by layer.
    pub layers: Vec<LayerLayout>,
    pub dim: usize,
}

impl TableLayout {
    /// Opens a model directory (with an index or one `.safetensors` file) or one file.
    pub fn open(path: &Path) -> Result<Self> {
        let meta = std::fs::metadata(path).map_err(|e| Error::io(path, "stat", e))?;
        if !meta.is_dir() {
            // A FIFO or device is refused by the shard's own open.
            super::make::check_file_committed(path)?;
            return Self::from_files(&[path.to_path_buf()], None);
        }
        super::make::clean_stale_temps(path);
        // A table fetchahead wrote opens as its manifest says (its one shard, or its index),
        // whatever else the directory holds; one whose rewrite did not finish is refused.
        let committed = super::make::committed_files(path)?;
        let index = path.join(INDEX_FILE);
        let listed_shards: Vec<PathBuf> = committed
            .iter()
            .flatten()
            .filter(|f| f.ends_with(".safetensors"))
            .map(|f| path.join(f))
            .collect();
        let listed_index = committed.iter().flatten().any(|f| f == INDEX_FILE);
        if committed.is_some() && !listed_index && listed_shards.len() == 1 {
            return Self::from_files(&listed_shards, None);
        }
        if listed_index || (committed.is_none() && std::fs::symlink_metadata(&index).is_ok()) {
            let bytes = read_small(&index, MAX_INDEX)?;
            let weight_map = parse_index(&bytes).map_err(|why| Error::TableIndex {
                file: index.clone(),
                why,
            })?;
            let mut files: Vec<PathBuf> = Vec::new();
            let mut owner = BTreeMap::new();
            for (tensor, file) in weight_map {
                let layer = engram_layer_checked(&tensor).map_err(|why| Error::BadTensor {
                    file: index.clone(),
                    tensor: tensor.clone(),
                    why,
                })?;
                if layer.is_none() {
                    continue;
                }
                let full = path.join(&file);
                let i = match files.iter().position(|f| *f == full) {
                    Some(i) => i,
                    None => {
                        files.push(full);
                        files.len() - 1
                    }
                };
                owner.insert(tensor, i);
            }
            return Self::from_files(&files, Some(&owner));
        }
        let mut shards = Vec::new();
        for entry in std::fs::read_dir(path).map_err(|e| Error::io(path, "read_dir", e))? {
            let entry = entry.map_err(|e| Error::io(path, "read_dir", e))?;
            let p = entry.path();
            // A writer's temporary files (a rewrite in progress, or a killed one's) are not shards.
            let temp = entry
                .file_name()
                .to_string_lossy()
                .starts_with(super::file::TEMP_PREFIX);
            if !temp && p.extension().is_some_and(|x| x == "safetensors") {
                shards.push(p);
            }
        }
        match shards.len() {
            1 => Self::from_files(&shards, None),
            n => Err(Error::TableHeader {
                file: path.to_path_buf(),
                why: format!("no {INDEX_FILE} and {n} .safetensors files (need one, or an index)"),
            }),
        }
    }

    /// `owner`: tensor name → file index, from an index file; without it every tensor of every
    /// file counts.
    fn from_files(paths: &[PathBuf], owner: Option<&BTreeMap<String, usize>>) -> Result<Self> {
        let layout = Self::from_files_unchecked(paths, owner)?;
        // Serving only the rows every layer has would leave the longer layers' last rows
        // unreachable without a word: refuse, naming each layer's rows.
        let rows: Vec<(u32, u64)> = layout
            .layers
            .iter()
            .map(|l| (l.layer, l.weight.rows))
            .collect();
        if rows.windows(2).any(|w| w[0].1 != w[1].1) {
            return Err(Error::LayerRowsDiffer { rows });
        }
        Ok(layout)
    }

    fn from_files_unchecked(
        paths: &[PathBuf],
        owner: Option<&BTreeMap<String, usize>>,
    ) -> Result<Self> {
        let mut files = Vec::with_capacity(paths.len());
        let mut headers = Vec::with_capacity(paths.len());
        for path in paths {
            let (shard, metadata) = read_header(path)?;
            files.push(shard);
            headers.push(metadata);
        }
        // Which file each Engram tensor lives in.
        let mut location: BTreeMap<String, usize> = BTreeMap::new();
        match owner {
            Some(owner) => location.extend(owner.iter().map(|(t, &f)| (t.clone(), f))),
            None => {
                for (i, metadata) in headers.iter().enumerate() {
                    for name in metadata.names() {
                        let layer = engram_layer_checked(name).map_err(|why| Error::BadTensor {
                            file: paths[i].clone(),
                            tensor: name.clone(),
                            why,
                        })?;
                        if layer.is_some() {
                            location.insert(name.clone(), i);
                        }
                    }
                }
            }
        }
        let mut layer_ids: Vec<u32> = location.keys().filter_map(|t| engram_layer(t)).collect();
        layer_ids.sort_unstable();
        layer_ids.dedup();
        if layer_ids.is_empty() {
            let file = paths.first().cloned().unwrap_or_default();
            return Err(Error::MissingTensor {
                file,
                tensor: "layers.{L}.engram.embed.weight (no Engram layer found)".into(),
            });
        }
        let mut layers = Vec::with_capacity(layer_ids.len());
        let mut dim = None;
        for layer in layer_ids {
            let weight = span(&files, &headers, &location, &weight_name(layer), paths)?;
            let scale = span(&files, &headers, &location, &scale_name(layer), paths)?;
            let wfile = files[weight.file].path.clone();
            let sfile = files[scale.file].path.clone();
            if weight.dtype != Dtype::F8_E4M3 {
                return Err(bad(
                    &wfile,
                    &weight.name,
                    format!("dtype {:?}, want F8_E4M3", weight.dtype),
                ));
            }
            if !matches!(scale.dtype, Dtype::F8_E8M0 | Dtype::U8) {
                return Err(bad(
                    &sfile,
                    &scale.name,
                    format!("dtype {:?}, want F8_E8M0 or U8", scale.dtype),
                ));
            }
            let d = weight.row_bytes as usize;
            if let Err(why) = check_dim(d as u64) {
                return Err(bad(&wfile, &weight.name, format!("row width {why}")));
            }
            if scale.row_bytes as usize != d / MX_BLOCK || scale.rows != weight.rows {
                return Err(bad(
                    &sfile,
                    &scale.name,
                    format!(
                        "shape [{}, {}], want [{}, {}] to match {}",
                        scale.rows,
                        scale.row_bytes,
                        weight.rows,
                        d / MX_BLOCK,
                        weight.name
                    ),
                ));
            }
            if *dim.get_or_insert(d) != d {
                return Err(bad(
                    &wfile,
                    &weight.name,
                    format!("row width {d}, other layers have {}", dim.unwrap_or(0)),
                ));
            }
            layers.push(LayerLayout {
                layer,
                weight,
                scale,
            });
        }
        Ok(TableLayout {
            files,
            layers,
            dim: dim.unwrap_or(0),
        })
    }

    pub fn layer(&self, layer: u32) -> Option<&LayerLayout> {
        self.layers.iter().find(|l| l.layer == layer)
    }

    pub fn path(&self, file: usize) -> &Path {
        self.files
            .get(file)
            .map_or(Path::new(""), |f| f.path.as_path())
    }

    /// The table's rows (every layer has them: [`open`](Self::open) refuses layers that
    /// disagree).
    pub fn rows(&self) -> u64 {
        self.layers.iter().map(|l| l.weight.rows).min().unwrap_or(0)
    }
}

fn bad(file: &Path, tensor: &str, why: String) -> Error {
    Error::BadTensor {
        file: file.to_path_buf(),
        tensor: tensor.to_string(),
        why,
    }
}

/// A tensor's span, checked to be two-dimensional and inside its file.
fn span(
    files: &[ShardFile],
    headers: &[Header],
    location: &BTreeMap<String, usize>,
    name: &str,
    paths: &[PathBuf],
) -> Result<TensorSpan> {
    let Some(&file) = location.get(name) else {
        let listed = paths.first().cloned().unwrap_or_default();
        return Err(Error::MissingTensor {
            file: listed,
            tensor: name.to_string(),
        });
    };
    let (shard, metadata) = (&files[file], &headers[file]);
    let Some(info) = metadata.info(name) else {
        return Err(Error::MissingTensor {
            file: shard.path.clone(),
            tensor: name.to_string(),
        });
    };
    let [rows, cols] = info.shape[..] else {
        return Err(bad(
            &shard.path,
            name,
            format!("shape {:?}, want [rows, dim]", info.shape),
        ));
    };
    let (start, end) = info.data_offsets;
    let end_abs = shard.data_start.saturating_add(end as u64);
    if end_abs > shard.len {
        return Err(Error::TruncatedShard {
            file: shard.path.clone(),
            tensor: name.to_string(),
            len: shard.len,
            end: end_abs,
        });
    }
    // safetensors checks rows * cols * bits, which says nothing about cols alone when rows is 0.
    let Some(row_bits) = cols.checked_mul(info.dtype.bitsize()) else {
        return Err(bad(
            &shard.path,
            name,
            format!("{cols} columns overflow a row's size"),
        ));
    };
    Ok(TensorSpan {
        name: name.to_string(),
        file,
        dtype: info.dtype,
        offset: shard.data_start + start as u64,
        rows: rows as u64,
        row_bytes: (row_bits / 8) as u64,
    })
}

/// Reads and checks one shard's header: length prefix, JSON, and each tensor's offsets against
/// its dtype and shape and the other tensors' (see [`parse_header`]).
pub fn read_header(path: &Path) -> Result<(ShardFile, Header)> {
    let file = open_regular(path, 0)?;
    let len = file
        .metadata()
        .map_err(|e| Error::io(path, "stat", e))?
        .len();
    let header_err = |why: String| Error::TableHeader {
        file: path.to_path_buf(),
        why,
    };
    let mut prefix = [0u8; 8];
    if len < 8 {
        return Err(header_err(format!(
            "file is {len} bytes, shorter than the 8-byte length prefix"
        )));
    }
    file.read_exact_at(&mut prefix, 0)
        .map_err(|e| Error::io(path, "read", e))?;
    let n = u64::from_le_bytes(prefix);
    if n > MAX_HEADER || n > len - 8 {
        return Err(header_err(format!(
            "header length {n} does not fit the {len}-byte file"
        )));
    }
    let mut header = crate::memory::zeroed(n, "a safetensors header")?;
    file.read_exact_at(&mut header, 8)
        .map_err(|e| Error::io(path, "read", e))?;
    let metadata = parse_header(&header).map_err(header_err)?;
    Ok((
        ShardFile {
            path: path.to_path_buf(),
            len,
            data_start: 8 + n,
        },
        metadata,
    ))
}

/// A shard's tensors as its header lists them.
#[derive(Clone, Debug, Default)]
pub struct Header {
    tensors: BTreeMap<String, TensorInfo>,
}

impl Header {
    pub fn info(&self, name: &str) -> Option<&TensorInfo> {
        self.tensors.get(name)
    }

    pub fn names(&self) -> impl Iterator<Item = &String> {
        self.tensors.keys()
    }
}

/// Parses a safetensors JSON header (without its length prefix). Each tensor is checked on its
/// own, so that an error names the tensor at fault: its dtype and shape must give exactly the
/// bytes of its `data_offsets`, and no two tensors may share bytes. Gaps between tensors are
/// allowed (the store reads only the Engram tensors; a tensor missing from the header is then
/// reported by name where it is looked for, not as its neighbour's bad offset).
pub fn parse_header(header: &[u8]) -> std::result::Result<Header, String> {
    let map: serde_json::Map<String, serde_json::Value> =
        serde_json::from_slice(header).map_err(|e| format!("not a JSON object of tensors: {e}"))?;
    let mut tensors = BTreeMap::new();
    for (name, value) in map {
        if name == "__metadata__" {
            continue;
        }
        let info: TensorInfo =
            serde_json::from_value(value).map_err(|e| format!("tensor {name}: {e}"))?;
        let (start, end) = info.data_offsets;
        if end < start {
            return Err(format!(
                "tensor {name}: data_offsets [{start}, {end}] end before they start"
            ));
        }
        let bits = info
            .shape
            .iter()
            .try_fold(info.dtype.bitsize(), |acc, &d| acc.checked_mul(d));
        let want = match bits {
            Some(b) if b % 8 == 0 => b / 8,
            Some(_) => {
                return Err(format!(
                    "tensor {name}: shape {:?} of {:?} is not a whole number of bytes",
                    info.shape, info.dtype
                ));
            }
            None => {
                return Err(format!(
                    "tensor {name}: shape {:?} of {:?} overflows a size",
                    info.shape, info.dtype
                ));
            }
        };
        if end - start != want {
            return Err(format!(
                "tensor {name}: shape {:?} of {:?} is {want} bytes, but its data_offsets \
                 [{start}, {end}] span {}",
                info.shape,
                info.dtype,
                end - start
            ));
        }
        tensors.insert(name, info);
    }
    let mut spans: Vec<(&String, (usize, usize))> = tensors
        .iter()
        .filter(|(_, i)| i.data_offsets.1 > i.data_offsets.0)
        .map(|(n, i)| (n, i.data_offsets))
        .collect();
    spans.sort_by_key(|&(_, o)| o);
    for w in spans.windows(2) {
        let ((a, (a0, a1)), (b, (b0, b1))) = (w[0], w[1]);
        if a1 > b0 {
            return Err(format!(
                "tensor {b}: data_offsets [{b0}, {b1}] overlap tensor {a}'s [{a0}, {a1}]"
            ));
        }
    }
    Ok(Header { tensors })
}

/// Parses `model.safetensors.index.json` into tensor name → file name.
pub fn parse_index(bytes: &[u8]) -> std::result::Result<BTreeMap<String, String>, String> {
    let value: serde_json::Value = serde_json::from_slice(bytes).map_err(|e| e.to_string())?;
    let map = value
        .get("weight_map")
        .and_then(|m| m.as_object())
        .ok_or("no `weight_map` object")?;
    let mut out = BTreeMap::new();
    for (tensor, file) in map {
        let file = file
            .as_str()
            .ok_or_else(|| format!("weight_map[{tensor}] is not a file name"))?;
        if file.contains('\0') {
            return Err(format!(
                "weight_map[{tensor:?}] = {file:?} holds a NUL byte, which no file name can"
            ));
        }
        if file.contains('/') || file.contains("..") {
            return Err(format!(
                "weight_map[{tensor}] = {file:?} leaves the model directory"
            ));
        }
        out.insert(tensor.clone(), file.to_string());
    }
    Ok(out)
}

pub(crate) fn is_engram_tensor(name: &str) -> bool {
    engram_layer(name).is_some()
}

/// `layers.{L}.engram.embed.{weight,scale}` → L.
fn engram_layer(name: &str) -> Option<u32> {
    engram_layer_checked(name).ok().flatten()
}

/// [`engram_layer`], or why a name shaped as an Engram tensor's has no layer number: only the
/// plain decimal form names a layer (`layers.01` and `layers.+1` are not `layers.1`, which a
/// lookup of layer 1 would ask for).
fn engram_layer_checked(name: &str) -> std::result::Result<Option<u32>, String> {
    let Some((layer, tail)) = name
        .strip_prefix("layers.")
        .and_then(|rest| rest.split_once('.'))
    else {
        return Ok(None);
    };
    if !matches!(tail, "engram.embed.weight" | "engram.embed.scale") {
        return Ok(None);
    }
    match layer.parse::<u32>() {
        Ok(l) if l.to_string() == layer => Ok(Some(l)),
        Ok(l) => Err(format!(
            "layer `{layer}` is not written as a plain decimal number (layer {l} is named \
             layers.{l}.{tail})"
        )),
        Err(_) => Err(format!(
            "layer `{layer}` is not a layer number (0 to {})",
            u32::MAX
        )),
    }
}
