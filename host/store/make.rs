//! Writing generated Engram tables in the layout the store reads: deterministic for a seed, each
//! shard's data section starting on a page boundary.
//!
//! Writing never damages what it did not write: one writer at a time holds the directory
//! (`flock` on `.fetchahead-tmp-lock`); every file goes to a temporary name in the target
//! directory and is renamed into place when complete (never through a symlink); a manifest
//! (`fetchahead-table.json`) records what a writer made (per file its size, inode, modification
//! time and a hash of its header), so that a later writer replaces or removes only files it can
//! prove it wrote, and only table files; anything else is refused unless forced, and even forced
//! only the new table's own names are replaced. Free space is checked first; a failed write
//! removes its temporary files, and a killed one's are removed by the next writer or reader.
//! While a rewrite's files change the manifest says `writing`, and readers refuse the table.
use std::fs::{File, OpenOptions};
use std::io::{BufWriter, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, FileTypeExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use safetensors::Dtype;
use safetensors::tensor::{Metadata, TensorInfo};

use super::file::{
    TEMP_PREFIX, TempFile, free_bytes, kind_of, open_regular, read_small, read_small_optional,
    sync_dir,
};
use super::layout::{
    INDEX_FILE, MAX_DIM, MX_BLOCK, PAGE, is_engram_tensor, scale_name, weight_name,
};
use crate::{Error, Result};

/// The manifest a writer leaves beside the table it wrote.
pub const MANIFEST: &str = "fetchahead-table.json";
/// The lock file a writer holds (`flock`) while it writes a table; it holds the writer's pid. Its
/// name starts as the temporary files' do, so that readers and tools skip it alike.
pub const LOCK_FILE: &str = ".fetchahead-tmp-lock";
/// The marker older demos wrote beside their table (its seed); such a directory is the demo's.
pub const LEGACY_DEMO_SEED: &str = "fetchahead-demo-seed";
/// Files beside a table that a writer leaves alone and counts as its own (`fetchahead tune`'s).
const TUNE_FILES: [&str; 2] = ["fetchahead-tune.json", "model.safetensors.tune.json"];

/// Bytes generated per seeded chunk: each chunk has its own generator, so the bytes of a table
/// do not depend on how it is written.
const CHUNK: usize = 1 << 20;

#[derive(Clone, Debug, PartialEq, Eq)]
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

    /// Bytes of every tensor together (saturating: an absurd spec is refused when written).
    pub fn data_bytes(&self) -> u64 {
        (self.layers.len() as u64)
            .saturating_mul(self.rows)
            .saturating_mul((self.dim + self.dim / MX_BLOCK) as u64)
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

/// Who writes a table and whether it may replace what it did not write.
#[derive(Clone, Debug)]
pub struct WriteOptions {
    /// The writer's name, recorded in the manifest (`make-table`, `demo`): a writer replaces
    /// without `force` only a table it wrote itself.
    pub writer: String,
    /// Replace the files the new table writes (its shards, index and manifest) whoever wrote
    /// them (never following a symlink: a link is replaced, not what it points at); each is
    /// logged before it is replaced. Files of the directory that the new table does not write
    /// are left alone unless they are the old table's own, proven by its manifest.
    pub force: bool,
}

impl Default for WriteOptions {
    fn default() -> Self {
        WriteOptions {
            writer: "make-table".into(),
            force: false,
        }
    }
}

/// What fetchahead wrote under one name, recorded in the manifest: a later writer replaces or
/// removes the file only while all of it still holds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WrittenFile {
    /// The file's name within the table directory.
    pub name: String,
    pub size: u64,
    pub inode: u64,
    /// Modification time, nanoseconds since the epoch.
    pub mtime_ns: i64,
    /// Bytes hashed from the file's start: a shard's length prefix and header, all of an index.
    pub head_len: u64,
    /// FNV-1a (64-bit) of those bytes.
    pub head_hash: u64,
}

/// What a writer's manifest says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Manifest {
    /// The writer's name (`make-table`, `demo`).
    pub writer: String,
    /// False while a rewrite is being put in place (a killed rewrite leaves it so); readers
    /// refuse such a table.
    pub complete: bool,
    /// The table's spec (`None` for a legacy demo table, which recorded only its seed).
    pub spec: Option<TableSpec>,
    /// The files of the table, by name within its directory: only table files (`*.safetensors`
    /// and the index) count; any other name a hand-edited manifest lists is dropped.
    pub files: Vec<String>,
    /// What was written under each name (a rewrite in progress records the old files and the
    /// new); empty in manifests of older versions, whose files are proven against their spec.
    pub written: Vec<WrittenFile>,
}

/// What a directory holds, as a writer sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DirState {
    /// No such directory.
    Absent,
    /// Nothing but leftovers of killed writes.
    Empty,
    /// A table written by fetchahead, and nothing else.
    Ours(Manifest),
    /// Files fetchahead did not write (or that changed since), each described (`name (a
    /// symlink to ...)`); with the manifest of the table beside them, if any.
    Foreign {
        files: Vec<String>,
        manifest: Option<Manifest>,
    },
    /// A manifest that does not parse as fetchahead's (why), beside these other files.
    BadManifest { why: String, files: Vec<String> },
}

/// `files` for a message: sorted, the first few, and how many more.
fn list_files(files: &[String]) -> String {
    const SHOWN: usize = 8;
    let mut list: Vec<&str> = files.iter().take(SHOWN).map(String::as_str).collect();
    let more = files.len().saturating_sub(SHOWN);
    list.sort_unstable();
    let tail = if more > 0 {
        format!(" and {more} more")
    } else {
        String::new()
    };
    format!("{}{tail}", list.join(", "))
}

impl DirState {
    /// A sentence for an error: what is in the directory.
    pub fn describe(&self) -> String {
        match self {
            DirState::Absent => "nothing (it does not exist)".into(),
            DirState::Empty => "nothing".into(),
            DirState::Ours(m) => format!("a table written by `fetchahead {}`", m.writer),
            DirState::Foreign { files, .. } => {
                format!("files fetchahead did not write: {}", list_files(files))
            }
            DirState::BadManifest { why, files } => {
                let beside = if files.is_empty() {
                    String::new()
                } else {
                    format!(", beside {}", list_files(files))
                };
                format!(
                    "a {MANIFEST} that is not a manifest fetchahead wrote ({why}): fetchahead \
                     cannot tell which files are its own{beside}"
                )
            }
        }
    }
}

fn written_json(w: &WrittenFile) -> serde_json::Value {
    serde_json::json!({
        "name": w.name,
        "size": w.size,
        "inode": w.inode,
        "mtime_ns": w.mtime_ns,
        "head_len": w.head_len,
        "head_fnv1a64": format!("{:016x}", w.head_hash),
    })
}

fn manifest_json(
    writer: &str,
    complete: bool,
    spec: &TableSpec,
    files: &[String],
    written: &[WrittenFile],
) -> String {
    let value = serde_json::json!({
        "written_by": format!("fetchahead {writer}"),
        "writer": writer,
        "state": if complete { "complete" } else { "writing" },
        "table": {
            "rows": spec.rows,
            "layers": spec.layers,
            "dim": spec.dim,
            "shards": spec.shards,
            "seed": spec.seed,
        },
        "files": files,
        "written": written.iter().map(written_json).collect::<Vec<_>>(),
    });
    serde_json::to_string_pretty(&value).unwrap_or_default()
}

/// A name a writer may replace or remove: a table file directly inside the directory.
fn is_table_name(name: &str) -> bool {
    !name.is_empty()
        && !name.starts_with('.')
        && !name.contains(['/', '\0'])
        && (name.ends_with(".safetensors") || name == INDEX_FILE)
}

fn parse_written(v: &serde_json::Value) -> std::result::Result<WrittenFile, String> {
    let field = |k: &str| {
        v.get(k)
            .ok_or_else(|| format!("a `written` entry lacks `{k}`"))
    };
    let num = |k: &str| {
        field(k)?
            .as_u64()
            .ok_or_else(|| format!("`written`.{k} is not a count"))
    };
    Ok(WrittenFile {
        name: field("name")?
            .as_str()
            .ok_or("`written`.name is not a string")?
            .to_string(),
        size: num("size")?,
        inode: num("inode")?,
        mtime_ns: field("mtime_ns")?
            .as_i64()
            .ok_or("`written`.mtime_ns is not a time")?,
        head_len: num("head_len")?,
        head_hash: field("head_fnv1a64")?
            .as_str()
            .and_then(|h| u64::from_str_radix(h, 16).ok())
            .ok_or("`written`.head_fnv1a64 is not a hex hash")?,
    })
}

/// Parses a manifest, or says why it is not one fetchahead wrote. Names that are not table files
/// (`notes.txt`, `../x`) are dropped: a writer never replaces or removes them.
fn parse_manifest(bytes: &[u8]) -> std::result::Result<Manifest, String> {
    let v: serde_json::Value =
        serde_json::from_slice(bytes).map_err(|e| format!("not JSON: {e}"))?;
    let text = |k: &str| {
        v.get(k)
            .and_then(|x| x.as_str())
            .ok_or_else(|| format!("no `{k}` string"))
    };
    let writer = text("writer")?.to_string();
    let complete = match text("state")? {
        "complete" => true,
        "writing" => false,
        other => return Err(format!("state {other:?} is neither complete nor writing")),
    };
    let files = v
        .get("files")
        .and_then(|f| f.as_array())
        .ok_or("no `files` list")?
        .iter()
        .map(|f| f.as_str().map(str::to_string))
        .collect::<Option<Vec<_>>>()
        .ok_or("a `files` entry is not a string")?
        .into_iter()
        .filter(|f| is_table_name(f))
        .collect();
    let written = match v.get("written") {
        None => Vec::new(),
        Some(w) => w
            .as_array()
            .ok_or("`written` is not a list")?
            .iter()
            .map(parse_written)
            .collect::<std::result::Result<Vec<_>, _>>()?
            .into_iter()
            .filter(|w| is_table_name(&w.name))
            .collect(),
    };
    let bad_table = || "no valid `table` (rows, layers, dim, shards, seed)".to_string();
    let t = v.get("table").ok_or_else(bad_table)?;
    let count = |k: &str| t.get(k).and_then(|x| x.as_u64()).ok_or_else(bad_table);
    let spec = TableSpec {
        rows: count("rows")?,
        layers: t
            .get("layers")
            .and_then(|l| l.as_array())
            .ok_or_else(bad_table)?
            .iter()
            .map(|l| l.as_u64().and_then(|l| u32::try_from(l).ok()))
            .collect::<Option<Vec<_>>>()
            .ok_or_else(bad_table)?,
        dim: usize::try_from(count("dim")?).map_err(|_| bad_table())?,
        shards: usize::try_from(count("shards")?).map_err(|_| bad_table())?,
        seed: count("seed")?,
    };
    Ok(Manifest {
        writer,
        complete,
        spec: Some(spec),
        files,
        written,
    })
}

/// `name (what it is)` for a message.
fn describe_entry(dir: &Path, name: &str) -> String {
    let path = dir.join(name);
    match std::fs::symlink_metadata(&path) {
        Ok(m) if m.file_type().is_symlink() => match std::fs::read_link(&path) {
            Ok(to) => format!("{name} (a symlink to {})", to.display()),
            Err(_) => format!("{name} (a symlink)"),
        },
        Ok(m) if m.is_file() => format!("{name} ({} bytes)", m.len()),
        Ok(m) if m.is_dir() => format!("{name} (a directory)"),
        Ok(m) if m.file_type().is_fifo() => format!("{name} (a FIFO)"),
        Ok(_) => format!("{name} (not a regular file)"),
        Err(_) => name.to_string(),
    }
}

fn is_regular(path: &Path) -> bool {
    std::fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_file())
}

/// FNV-1a, 64-bit: tells a header fetchahead wrote from another one (not a defence against a
/// forger, who could as well edit the manifest).
fn fnv1a64(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

fn mtime_ns(meta: &std::fs::Metadata) -> i64 {
    meta.mtime()
        .saturating_mul(1_000_000_000)
        .saturating_add(meta.mtime_nsec())
}

/// Headers longer than this are not ours (ours are a few KiB).
const MAX_HEAD: u64 = 16 << 20;

/// The first `len` bytes of the regular file `path` (never through a symlink).
fn read_head(path: &Path, len: u64) -> std::result::Result<Vec<u8>, String> {
    if len > MAX_HEAD {
        return Err(format!(
            "a header of {len} bytes is not one fetchahead writes"
        ));
    }
    let file = open_regular(path, libc::O_NOFOLLOW).map_err(|e| e.to_string())?;
    let mut head = vec![0u8; len as usize];
    file.read_exact_at(&mut head, 0)
        .map_err(|e| format!("reading its header: {e}"))?;
    Ok(head)
}

/// The record of the regular file `dir/name` as it is now, hashing its first `head_len` bytes.
fn record_of(dir: &Path, name: &str, head_len: u64) -> std::result::Result<WrittenFile, String> {
    let path = dir.join(name);
    let meta = std::fs::symlink_metadata(&path).map_err(|e| e.to_string())?;
    if !meta.file_type().is_file() {
        return Err(format!("it is {}", kind_of(meta.file_type())));
    }
    let head = read_head(&path, head_len.min(meta.len()))?;
    Ok(WrittenFile {
        name: name.to_string(),
        size: meta.len(),
        inode: meta.ino(),
        mtime_ns: mtime_ns(&meta),
        head_len,
        head_hash: fnv1a64(&head),
    })
}

/// How a manifest proves that the file under one of its names is the one its writer wrote.
enum Proof {
    /// What was recorded when it was written.
    Recorded(WrittenFile),
    /// An older manifest recorded only names: the file must be exactly as its spec generates it
    /// (its length, and its length prefix and header, or all of an index).
    Generated { len: u64, head: Vec<u8> },
    /// An older demo's shard (no manifest): a safetensors file of Engram tensors only.
    LegacyShard,
    /// An older demo's seed marker.
    LegacySeed,
}

impl Proof {
    /// Bytes hashed from the file's start when the file is recorded.
    fn head_len(&self, dir: &Path, name: &str) -> u64 {
        match self {
            Proof::Recorded(w) => w.head_len,
            Proof::Generated { head, .. } => head.len() as u64,
            Proof::LegacySeed => std::fs::symlink_metadata(dir.join(name)).map_or(0, |m| m.len()),
            Proof::LegacyShard => {
                let mut prefix = [0u8; 8];
                let n = open_regular(&dir.join(name), libc::O_NOFOLLOW)
                    .ok()
                    .and_then(|f| f.read_exact_at(&mut prefix, 0).ok())
                    .map_or(0, |()| u64::from_le_bytes(prefix));
                8u64.saturating_add(n)
            }
        }
    }

    /// Why `dir/name` is not the file this proves (`None`: it is).
    fn refutes(&self, dir: &Path, name: &str) -> Option<String> {
        let path = dir.join(name);
        let meta = match std::fs::symlink_metadata(&path) {
            Ok(m) => m,
            Err(e) => return Some(format!("it cannot be examined ({e})")),
        };
        if !meta.file_type().is_file() {
            return Some(format!("it is now {}", kind_of(meta.file_type())));
        }
        match self {
            Proof::Recorded(w) => {
                let mut changed = Vec::new();
                if meta.len() != w.size {
                    changed.push(format!("its size {} -> {} bytes", w.size, meta.len()));
                }
                if meta.ino() != w.inode {
                    changed.push(format!("its inode {} -> {}", w.inode, meta.ino()));
                }
                if mtime_ns(&meta) != w.mtime_ns {
                    changed.push("its modification time".to_string());
                }
                match read_head(&path, w.head_len) {
                    Ok(head) if fnv1a64(&head) == w.head_hash => {}
                    Ok(_) => changed.push("its safetensors header".to_string()),
                    Err(why) => changed.push(format!("its header ({why})")),
                }
                (!changed.is_empty())
                    .then(|| format!("changed since written: {}", changed.join(", ")))
            }
            Proof::Generated { len, head } => {
                if meta.len() != *len {
                    return Some(format!(
                        "it is {} bytes, not the {len} its manifest's table has",
                        meta.len()
                    ));
                }
                match read_head(&path, head.len() as u64) {
                    Ok(h) if h == *head => None,
                    Ok(_) => Some("its header is not the one its manifest's table has".into()),
                    Err(why) => Some(why),
                }
            }
            Proof::LegacySeed => {
                (meta.len() > 64).then(|| format!("{} bytes is no seed marker", meta.len()))
            }
            Proof::LegacyShard => match super::layout::read_header(&path) {
                Ok((_, header)) => header
                    .names()
                    .find(|n| !is_engram_tensor(n))
                    .map(|n| format!("it holds tensor {n}, which no demo table has")),
                Err(e) => Some(e.to_string()),
            },
        }
    }
}

/// The index a writer leaves beside K > 1 shards.
fn index_text(
    spec: &TableSpec,
    weight_map: serde_json::Map<String, serde_json::Value>,
) -> Result<String> {
    let index = serde_json::json!({
        "metadata": { "total_size": spec.data_bytes() },
        "weight_map": weight_map,
    });
    serde_json::to_string_pretty(&index).map_err(|e| Error::invalid("index", e.to_string()))
}

/// Each name the manifest claims, with its proofs (a rewrite in progress may have two).
fn proofs(m: &Manifest) -> Vec<(String, Proof)> {
    if !m.written.is_empty() {
        return m
            .written
            .iter()
            .map(|w| (w.name.clone(), Proof::Recorded(w.clone())))
            .collect();
    }
    let Some(spec) = &m.spec else {
        return m
            .files
            .iter()
            .filter_map(|f| match f.as_str() {
                "model.safetensors" => Some((f.clone(), Proof::LegacyShard)),
                LEGACY_DEMO_SEED => Some((f.clone(), Proof::LegacySeed)),
                _ => None,
            })
            .collect();
    };
    let Ok((shards, weight_map)) = spec.check().and_then(|()| plan_shards(spec)) else {
        return Vec::new();
    };
    let mut out: Vec<(String, Proof)> = shards
        .into_iter()
        .map(|s| {
            let mut head = (s.header.len() as u64).to_le_bytes().to_vec();
            head.extend_from_slice(&s.header);
            (s.name, Proof::Generated { len: s.len, head })
        })
        .collect();
    if spec.shards > 1
        && let Ok(text) = index_text(spec, weight_map)
    {
        out.push((
            INDEX_FILE.into(),
            Proof::Generated {
                len: text.len() as u64,
                head: text.into_bytes(),
            },
        ));
    }
    out.retain(|(name, _)| m.files.contains(name));
    out
}

/// Why `dir/name` is none of the files `proofs` claim under that name (`None`: it is one).
fn unproven(dir: &Path, name: &str, proofs: &[(String, Proof)]) -> Option<String> {
    let mut why = None;
    for (_, p) in proofs.iter().filter(|(n, _)| n == name) {
        match p.refutes(dir, name) {
            None => return None,
            Some(w) => why = why.or(Some(w)),
        }
    }
    Some(why.unwrap_or_else(|| "not listed".into()))
}

/// The pid in a temporary file's name, when it is one of ours.
fn temp_pid(name: &str) -> Option<u32> {
    let rest = name.strip_prefix(TEMP_PREFIX)?;
    rest.split_once('-')?.0.parse().ok()
}

fn alive(pid: u32) -> bool {
    if pid == std::process::id() {
        return true;
    }
    let Ok(pid) = libc::pid_t::try_from(pid) else {
        return false;
    };
    // SAFETY: signal 0 only checks that the process exists; it sends nothing.
    let rc = unsafe { libc::kill(pid, 0) };
    rc == 0 || std::io::Error::last_os_error().raw_os_error() == Some(libc::EPERM)
}

/// What `dir` holds: nothing, a table fetchahead wrote (its manifest, every file of it proven),
/// or other files. Leftover temporary files of killed writers count as nothing; those of a
/// running writer are an error.
pub fn dir_state(dir: &Path) -> Result<DirState> {
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(DirState::Absent),
        Err(e) => return Err(Error::io(dir, "read_dir", e)),
    };
    let mut names = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|e| Error::io(dir, "read_dir", e))?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if name == LOCK_FILE {
            continue;
        }
        if let Some(pid) = temp_pid(&name) {
            if pid != std::process::id() && alive(pid) {
                return Err(Error::WouldOverwrite {
                    path: dir.to_path_buf(),
                    why: format!("another fetchahead (pid {pid}) is writing there ({name})"),
                });
            }
            continue;
        }
        names.push(name);
    }
    if names.is_empty() {
        return Ok(DirState::Empty);
    }
    let manifest_path = dir.join(MANIFEST);
    let mut bad_manifest = None;
    let mut manifest = None;
    if is_regular(&manifest_path) {
        match read_small(&manifest_path, 1 << 20).map_err(|e| e.to_string()) {
            Ok(bytes) => match parse_manifest(&bytes) {
                Ok(m) => manifest = Some(m),
                Err(why) => bad_manifest = Some(why),
            },
            Err(why) => bad_manifest = Some(why),
        }
    } else if !names.iter().any(|n| n == MANIFEST) {
        // An older demo's table: its shard, its seed marker, and perhaps a tune file.
        let legacy = is_regular(&dir.join(LEGACY_DEMO_SEED))
            && is_regular(&dir.join("model.safetensors"))
            && names.iter().all(|n| {
                n == LEGACY_DEMO_SEED
                    || n == "model.safetensors"
                    || TUNE_FILES.contains(&n.as_str())
            });
        manifest = legacy.then(|| Manifest {
            writer: "demo".into(),
            complete: false,
            spec: None,
            files: vec!["model.safetensors".into(), LEGACY_DEMO_SEED.into()],
            written: Vec::new(),
        });
    }
    let claimed = manifest.as_ref().map(proofs).unwrap_or_default();
    let foreign: Vec<String> = names
        .iter()
        .filter(|n| {
            // Tune's file is its own business (a writer of tables never writes it).
            let ours = (n.as_str() == MANIFEST && (manifest.is_some() || bad_manifest.is_some()))
                || TUNE_FILES.contains(&n.as_str());
            !ours
        })
        .filter_map(|n| {
            let listed = claimed.iter().any(|(c, _)| c == n);
            match unproven(dir, n, &claimed) {
                None => None,
                Some(why) if listed => Some(format!(
                    "{}: listed in {MANIFEST} but not the file fetchahead wrote ({why})",
                    describe_entry(dir, n)
                )),
                Some(_) => Some(describe_entry(dir, n)),
            }
        })
        .collect();
    Ok(match (bad_manifest, manifest, foreign.is_empty()) {
        (Some(why), _, _) => DirState::BadManifest {
            why,
            files: foreign,
        },
        (None, Some(m), true) => DirState::Ours(m),
        (None, None, true) => DirState::Empty,
        (None, manifest, false) => DirState::Foreign {
            files: foreign,
            manifest,
        },
    })
}

/// A writer's hold on a table directory: an exclusive `flock` on `DIR/.fetchahead-tmp-lock`,
/// which names the holder's pid. Dropping it removes the file, then releases the lock.
struct DirLock {
    path: PathBuf,
    _file: File,
}

impl DirLock {
    /// The lock, or `Err(holder's pid)` when another writer holds it.
    fn try_acquire(dir: &Path) -> std::io::Result<std::result::Result<DirLock, Option<u32>>> {
        let path = dir.join(LOCK_FILE);
        for _ in 0..16 {
            let mut file = OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(false)
                .mode(0o644)
                .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC | libc::O_NONBLOCK)
                .open(&path)?;
            let meta = file.metadata()?;
            if !meta.file_type().is_file() {
                return Err(std::io::Error::other(format!(
                    "{LOCK_FILE} is {}",
                    kind_of(meta.file_type())
                )));
            }
            // SAFETY: flock on a descriptor this function owns; it takes no pointers.
            if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
                let e = std::io::Error::last_os_error();
                if e.raw_os_error() == Some(libc::EWOULDBLOCK) {
                    return Ok(Err(holder_pid(&file)));
                }
                return Err(e);
            }
            // A writer that finished removed the file after we opened it: a lock on that
            // unlinked file would exclude nobody, so lock the one now at the path.
            match std::fs::symlink_metadata(&path) {
                Ok(now) if now.ino() == meta.ino() && now.dev() == meta.dev() => {}
                _ => continue,
            }
            file.set_len(0)?;
            file.write_all_at(format!("{}\n", std::process::id()).as_bytes(), 0)?;
            file.flush()?;
            return Ok(Ok(DirLock { path, _file: file }));
        }
        Err(std::io::Error::other(format!(
            "{LOCK_FILE} kept being replaced while locking it"
        )))
    }

    /// The lock for a writer: another writer holding it is an error naming its pid.
    fn for_writing(dir: &Path) -> Result<DirLock> {
        match Self::try_acquire(dir) {
            Ok(Ok(lock)) => Ok(lock),
            Ok(Err(pid)) => Err(Error::WouldOverwrite {
                path: dir.to_path_buf(),
                why: format!(
                    "another fetchahead writer ({}) is writing this table (it holds \
                     {LOCK_FILE}); wait for it to finish, or stop it and write again",
                    pid.map_or_else(|| "pid unknown".to_string(), |p| format!("pid {p}"))
                ),
            }),
            Err(e) => Err(Error::io(dir, "write (creating its lock file)", e)),
        }
    }
}

/// The pid a lock holder wrote into its lock file (it writes it just after locking: wait a
/// little for it).
fn holder_pid(file: &File) -> Option<u32> {
    for _ in 0..20 {
        let mut buf = [0u8; 32];
        let n = file.read_at(&mut buf, 0).unwrap_or(0);
        let text = String::from_utf8_lossy(&buf[..n]);
        if let Ok(pid) = text.trim().parse() {
            return Some(pid);
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    None
}

impl Drop for DirLock {
    fn drop(&mut self) {
        // Removed while still locked: a writer that opened it meanwhile sees it replaced.
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Removes temporary files that killed writers left in `dir` (the caller holds the lock, so no
/// writer is using them), saying so.
fn remove_dead_temps(dir: &Path) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if let Some(pid) = temp_pid(&name)
            && !alive(pid)
        {
            let bytes = e.metadata().map_or(0, |m| m.len());
            if std::fs::remove_file(e.path()).is_ok() {
                log::warn!(
                    "{}: removed {name} ({bytes} bytes), a temporary file of a fetchahead writer \
                     (pid {pid}) that is no longer running",
                    dir.display()
                );
            }
        }
    }
}

/// Removes what killed writers left in `dir` when a reader opens it: only where no writer holds
/// the directory and the reader may write there (else nothing happens).
pub(crate) fn clean_stale_temps(dir: &Path) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    let stale = entries
        .flatten()
        .any(|e| temp_pid(&e.file_name().to_string_lossy()).is_some_and(|pid| !alive(pid)));
    if stale && let Ok(Ok(lock)) = DirLock::try_acquire(dir) {
        remove_dead_temps(dir);
        drop(lock);
    }
}

/// The command that writes `m`'s table again, for a message.
fn rewrite_command(dir: &Path, m: &Manifest) -> String {
    match (&m.spec, m.writer.as_str()) {
        (Some(s), "make-table") => format!(
            "fetchahead make-table {} --rows {} --layers {} --dim {} --shards {} --seed {}",
            dir.display(),
            s.rows,
            s.layers
                .iter()
                .map(u32::to_string)
                .collect::<Vec<_>>()
                .join(","),
            s.dim,
            s.shards,
            s.seed
        ),
        (_, writer) => format!("fetchahead {writer} with the same options"),
    }
}

/// What a reader may open in `dir`, by its manifest: `None` without one (a table fetchahead did
/// not write), the table's files when complete. A table whose rewrite did not finish, or whose
/// manifest is not fetchahead's, is refused, saying what to do.
pub(crate) fn committed_files(dir: &Path) -> Result<Option<Vec<String>>> {
    let path = dir.join(MANIFEST);
    let Some(bytes) = read_small_optional(&path, 1 << 20)? else {
        return Ok(None);
    };
    let m = parse_manifest(&bytes).map_err(|why| {
        Error::invalid(
            "table",
            format!(
                "{}: {MANIFEST} is not a manifest fetchahead wrote ({why}), so whether its \
                 table is whole is unknown: write the table again, or remove {MANIFEST} if you \
                 know its files are whole",
                dir.display()
            ),
        )
    })?;
    if !m.complete {
        return Err(unfinished(dir, &m));
    }
    Ok(Some(m.files))
}

fn unfinished(dir: &Path, m: &Manifest) -> Error {
    Error::invalid(
        "table",
        format!(
            "{}: a rewrite of this table by `fetchahead {}` did not finish ({MANIFEST} says \
             \"writing\"), so its files may mix the old table and the new; write it again to \
             finish it: {}",
            dir.display(),
            m.writer,
            rewrite_command(dir, m)
        ),
    )
}

/// For a reader opening one file of a table directory: refused when that directory's manifest
/// says a rewrite of it did not finish.
pub(crate) fn check_file_committed(file: &Path) -> Result<()> {
    let (Some(dir), Some(name)) = (file.parent(), file.file_name()) else {
        return Ok(());
    };
    let name = name.to_string_lossy();
    let dir = if dir.as_os_str().is_empty() {
        Path::new(".")
    } else {
        dir
    };
    let Ok(Some(bytes)) = read_small_optional(&dir.join(MANIFEST), 1 << 20) else {
        return Ok(());
    };
    match parse_manifest(&bytes) {
        Ok(m)
            if !m.complete
                && (m.files.iter().any(|f| *f == name)
                    || m.written.iter().any(|w| w.name == name)) =>
        {
            Err(unfinished(dir, &m))
        }
        _ => Ok(()),
    }
}

/// The shards' layout: which tensors each holds, its header and its length.
struct ShardPlan {
    name: String,
    tensors: Vec<usize>,
    header: Vec<u8>,
    len: u64,
}

fn plan_shards(
    spec: &TableSpec,
) -> Result<(Vec<ShardPlan>, serde_json::Map<String, serde_json::Value>)> {
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
    let too_large = || {
        Error::invalid(
            "table spec",
            format!(
                "{} rows of dim {} overflow a file's size",
                spec.rows, spec.dim
            ),
        )
    };
    let mut weight_map = serde_json::Map::new();
    let mut shards = Vec::with_capacity(names.len());
    for (name, group) in names.into_iter().zip(groups) {
        let mut infos = Vec::with_capacity(group.len());
        let mut offset = 0usize;
        for &t in &group {
            let (tname, dtype, shape) = &tensors[t];
            let bytes = shape[0]
                .checked_mul(shape[1])
                .and_then(|b| b.checked_mul(dtype.bitsize()))
                .map(|b| b / 8)
                .ok_or_else(too_large)?;
            let end = offset.checked_add(bytes).ok_or_else(too_large)?;
            infos.push((
                tname.clone(),
                TensorInfo {
                    dtype: *dtype,
                    shape: shape.to_vec(),
                    data_offsets: (offset, end),
                },
            ));
            offset = end;
            weight_map.insert(tname.clone(), serde_json::Value::String(name.clone()));
        }
        let metadata =
            Metadata::new(None, infos).map_err(|e| Error::invalid("table spec", e.to_string()))?;
        let mut header = serde_json::to_vec(&metadata)
            .map_err(|e| Error::invalid("table spec", e.to_string()))?;
        // Spaces after the JSON (allowed by the format) put the data on a page boundary.
        let padded = (8 + header.len() as u64).next_multiple_of(PAGE) - 8;
        header.resize(padded as usize, b' ');
        let len = (8 + padded)
            .checked_add(offset as u64)
            .ok_or_else(too_large)?;
        shards.push(ShardPlan {
            name,
            tensors: group,
            header,
            len,
        });
    }
    Ok((shards, weight_map))
}

/// Where a write is: for a progress display, or a test that kills the writer at each step.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum WriteStep {
    /// The directory is locked and what it holds checked; nothing is written yet.
    Checked,
    /// Bytes of table data written so far (to temporary files).
    Data(u64),
    /// One change of the commit is made and durable: the manifest marked writing, a file of the
    /// old table removed, a new file renamed into place, the manifest marked complete (each
    /// named).
    Committed(String),
}

/// Writes `spec` into `dir` (`model.safetensors`, or K shards and an index) as `make-table`
/// without `--force`; see [`write_table_with`].
pub fn write_table(
    dir: &Path,
    spec: &TableSpec,
    progress: impl FnMut(u64),
) -> Result<Vec<PathBuf>> {
    write_table_with(dir, spec, &WriteOptions::default(), progress)
}

/// [`write_table_with_steps`], with `progress` getting bytes written so far.
pub fn write_table_with(
    dir: &Path,
    spec: &TableSpec,
    options: &WriteOptions,
    mut progress: impl FnMut(u64),
) -> Result<Vec<PathBuf>> {
    write_table_with_steps(dir, spec, options, |step| {
        if let WriteStep::Data(n) = step {
            progress(n);
        }
    })
}

/// Writes `spec` into `dir` (`model.safetensors`, or K shards and an index, and the manifest);
/// `step` hears each step of the write. Returns the table's files (shards, then the index).
///
/// One writer at a time: the writer holds a lock on `dir` (`flock`), and a second one fails at
/// once naming the first one's pid. `dir` must be absent, empty, or hold only a table this
/// writer wrote, each of whose files is still the one written (size, inode, modification time
/// and header, as its manifest recorded them); anything else is refused, naming what is there
/// and what changed, unless `options.force`. The new table replaces the old one whole: files of
/// the old table that the new one lacks (an index, other shards) are removed, and nothing else
/// ever is. Nothing is written unless the filesystem has room for all of it; a failed write
/// removes what it wrote. While the files change the manifest says `writing`, and readers
/// refuse the table until a write completes.
pub fn write_table_with_steps(
    dir: &Path,
    spec: &TableSpec,
    options: &WriteOptions,
    mut step: impl FnMut(WriteStep),
) -> Result<Vec<PathBuf>> {
    spec.check()?;
    let (shards, weight_map) = plan_shards(spec)?;
    let index = (spec.shards > 1)
        .then(|| index_text(spec, weight_map))
        .transpose()?;
    let mut new_names: Vec<String> = shards.iter().map(|s| s.name.clone()).collect();
    if index.is_some() {
        new_names.push(INDEX_FILE.into());
    }
    // Room for every new file while the old ones still stand (two manifests of a few KiB).
    let need = shards
        .iter()
        .map(|s| s.len)
        .chain(index.iter().map(|t| t.len() as u64))
        .fold(
            2 * (4096 + 512 * new_names.len() as u64),
            u64::saturating_add,
        );
    let available = free_bytes(dir)?;
    if need > available {
        return Err(Error::NoSpace {
            dir: dir.to_path_buf(),
            need,
            available,
        });
    }
    let created = !dir.exists();
    std::fs::create_dir_all(dir).map_err(|e| Error::io(dir, "create_dir_all", e))?;
    let plan = WritePlan {
        dir,
        spec,
        options,
        shards: &shards,
        index: index.as_deref(),
        new_names: &new_names,
    };
    let outcome = DirLock::for_writing(dir).and_then(|lock| {
        let written = plan.write(&mut step);
        drop(lock);
        written
    });
    if outcome.is_err() && created {
        // Only succeeds when empty: the temporary files and the lock are gone by now.
        let _ = std::fs::remove_dir(dir);
    }
    outcome
}

/// One write of a table, planned: run with the directory locked.
struct WritePlan<'a> {
    dir: &'a Path,
    spec: &'a TableSpec,
    options: &'a WriteOptions,
    shards: &'a [ShardPlan],
    index: Option<&'a str>,
    new_names: &'a [String],
}

impl WritePlan<'_> {
    /// The old table's files this writer may replace or remove, each as it is now: whatever of
    /// the old manifest's files is still the file written; and whether the manifest there is
    /// fetchahead's. Refuses what `options` does not allow.
    fn check_dir(&self) -> Result<(Vec<WrittenFile>, bool)> {
        let dir = self.dir;
        let state = dir_state(dir)?;
        let refuse = |why: String| {
            Err(Error::WouldOverwrite {
                path: dir.to_path_buf(),
                why,
            })
        };
        let force = self.options.force;
        let old = match &state {
            DirState::Foreign { .. } | DirState::BadManifest { .. } if !force => {
                return refuse(format!(
                    "it holds {} (pass --force to replace only the files the new table writes \
                     and the old table's own, or choose another directory)",
                    state.describe()
                ));
            }
            DirState::Foreign { manifest, .. } => manifest.clone(),
            DirState::BadManifest { .. } => None,
            DirState::Ours(m) => {
                if m.writer != self.options.writer && !force {
                    return refuse(format!(
                        "it holds a table written by `fetchahead {}`, not by `fetchahead {}` \
                         (pass --force to replace it, or choose another directory)",
                        m.writer, self.options.writer
                    ));
                }
                Some(m.clone())
            }
            DirState::Absent | DirState::Empty => None,
        };
        let manifest_ours = !matches!(state, DirState::BadManifest { .. });
        let Some(old) = old else {
            return Ok((Vec::new(), manifest_ours));
        };
        let claimed = proofs(&old);
        let mut owned: Vec<WrittenFile> = Vec::new();
        for (name, proof) in &claimed {
            if owned.iter().any(|w| w.name == *name) || proof.refutes(dir, name).is_some() {
                continue;
            }
            if let Ok(w) = record_of(dir, name, proof.head_len(dir, name)) {
                owned.push(w);
            }
        }
        Ok((owned, manifest_ours))
    }

    fn write(&self, step: &mut impl FnMut(WriteStep)) -> Result<Vec<PathBuf>> {
        let dir = self.dir;
        remove_dead_temps(dir);
        let (owned, manifest_ours) = self.check_dir()?;
        step(WriteStep::Checked);
        // Files to remove once the new ones are in: the old table's own that the new one lacks.
        let stale: Vec<&WrittenFile> = owned
            .iter()
            .filter(|w| !self.new_names.contains(&w.name))
            .collect();
        self.say_replaced(&owned, manifest_ours, &stale);
        let (temps, records) = self.write_temps(step)?;
        let (writing, done) = self.write_manifests(&owned, &records)?;
        writing.commit()?;
        sync_dir(dir);
        step(WriteStep::Committed(format!("{MANIFEST} (writing)")));
        self.remove_stale(&stale, step)?;
        let files = self.commit_temps(temps, step)?;
        done.commit()?;
        sync_dir(dir);
        step(WriteStep::Committed(format!("{MANIFEST} (complete)")));
        Ok(files)
    }

    /// Says what the write replaces that fetchahead did not write (with --force: a warning
    /// each, first), and the old table's files it will remove.
    fn say_replaced(&self, owned: &[WrittenFile], manifest_ours: bool, stale: &[&WrittenFile]) {
        let dir = self.dir;
        for name in self.new_names.iter().chain([&MANIFEST.to_string()]) {
            let present = std::fs::symlink_metadata(dir.join(name)).is_ok();
            let proven =
                owned.iter().any(|w| w.name == *name) || (name == MANIFEST && manifest_ours);
            if present && !proven {
                log::warn!(
                    "{}: --force: replacing {}, which fetchahead did not write",
                    dir.display(),
                    describe_entry(dir, name)
                );
            }
        }
        for w in stale {
            log::info!(
                "{}: removing {} ({} bytes) of the old table",
                dir.display(),
                w.name,
                w.size
            );
        }
    }

    /// Writes the new files (the shards, then the index) under temporary names, synced, with
    /// what the manifest records of each; `step` hears the table's data bytes written so far.
    fn write_temps(
        &self,
        step: &mut impl FnMut(WriteStep),
    ) -> Result<(Vec<TempFile>, Vec<WrittenFile>)> {
        let dir = self.dir;
        let tensors = self.spec.tensors();
        let mut written = 0u64;
        let mut chunk = crate::memory::zeroed(CHUNK as u64, "a write buffer")?;
        let mut temps = Vec::with_capacity(self.shards.len() + 1);
        let mut records = Vec::with_capacity(self.shards.len() + 1);
        for shard in self.shards {
            let (temp, record) =
                self.write_shard(shard, &tensors, &mut chunk, &mut written, step)?;
            records.push(record);
            temps.push(temp);
        }
        if let Some(text) = self.index {
            let mut temp = TempFile::create(&dir.join(INDEX_FILE))?;
            let target = temp.target().to_path_buf();
            temp.file()
                .write_all(text.as_bytes())
                .map_err(|e| Error::io(&target, "write", e))?;
            records.push(record_temp(&mut temp, INDEX_FILE, text.as_bytes())?);
            temps.push(temp);
        }
        Ok((temps, records))
    }

    /// Writes `shard` (its header's length, its header, its tensors' bytes, chunk by chunk
    /// through `chunk`) to a temporary file, synced; `written` counts the table's data bytes.
    fn write_shard(
        &self,
        shard: &ShardPlan,
        tensors: &[(String, Dtype, [usize; 2])],
        chunk: &mut [u8],
        written: &mut u64,
        step: &mut impl FnMut(WriteStep),
    ) -> Result<(TempFile, WrittenFile)> {
        let mut temp = TempFile::create(&self.dir.join(&shard.name))?;
        let target = temp.target().to_path_buf();
        let io = |e| Error::io(&target, "write", e);
        let mut w = BufWriter::with_capacity(CHUNK, temp.file());
        let prefix = (shard.header.len() as u64).to_le_bytes();
        w.write_all(&prefix).map_err(io)?;
        w.write_all(&shard.header).map_err(io)?;
        for &t in &shard.tensors {
            let (_, dtype, shape) = &tensors[t];
            let mut left = shape[0] * shape[1] * dtype.bitsize() / 8;
            let mut c = 0u64;
            while left > 0 {
                let n = left.min(CHUNK);
                fill_chunk(self.spec, t, *dtype, c, &mut chunk[..n]);
                w.write_all(&chunk[..n]).map_err(io)?;
                left -= n;
                c += 1;
                *written += n as u64;
                step(WriteStep::Data(*written));
            }
        }
        w.flush().map_err(io)?;
        drop(w);
        let mut head = prefix.to_vec();
        head.extend_from_slice(&shard.header);
        let record = record_temp(&mut temp, &shard.name, &head)?;
        Ok((temp, record))
    }

    /// The manifest's two states under temporary names: `writing`, which records old and new
    /// files alike, and `complete`, the new ones (`records`) alone.
    fn write_manifests(
        &self,
        owned: &[WrittenFile],
        records: &[WrittenFile],
    ) -> Result<(TempFile, TempFile)> {
        let dir = self.dir;
        let writer = &self.options.writer;
        // While the files change, the manifest records old and new alike, so that a writer
        // killed here leaves a table that readers refuse and the next writer proves its own.
        let mut both = records.to_vec();
        both.extend(owned.iter().cloned());
        let mut writing = TempFile::create(&dir.join(MANIFEST))?;
        write_manifest(
            &mut writing,
            &manifest_json(writer, false, self.spec, self.new_names, &both),
        )?;
        let mut done = TempFile::create(&dir.join(MANIFEST))?;
        write_manifest(
            &mut done,
            &manifest_json(writer, true, self.spec, self.new_names, records),
        )?;
        Ok((writing, done))
    }

    /// Removes the old table's files the new one lacks, each proven unchanged again first (one
    /// that changed is left, with a warning); only table files and an older demo's seed marker.
    fn remove_stale(&self, stale: &[&WrittenFile], step: &mut impl FnMut(WriteStep)) -> Result<()> {
        let dir = self.dir;
        for &w in stale {
            // Only table files (and an older demo's seed marker) are ever removed.
            if !is_table_name(&w.name) && w.name != LEGACY_DEMO_SEED {
                continue;
            }
            // Proven again now: the lock keeps writers out, not a user's copy.
            if let Some(why) = Proof::Recorded(w.clone()).refutes(dir, &w.name) {
                log::warn!(
                    "{}: leaving {}: it changed while the table was written ({why})",
                    dir.display(),
                    w.name
                );
                continue;
            }
            let p = dir.join(&w.name);
            match std::fs::remove_file(&p) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                    return Err(Error::io(&p, "remove a file of the old table", e));
                }
                _ => {}
            }
            sync_dir(dir);
            step(WriteStep::Committed(w.name.clone()));
        }
        Ok(())
    }

    /// Renames each new file into place, durably, in order; their paths.
    fn commit_temps(
        &self,
        temps: Vec<TempFile>,
        step: &mut impl FnMut(WriteStep),
    ) -> Result<Vec<PathBuf>> {
        let mut files = Vec::with_capacity(temps.len());
        for temp in temps {
            let path = temp.commit()?;
            sync_dir(self.dir);
            step(WriteStep::Committed(
                path.file_name()
                    .map_or_else(String::new, |n| n.to_string_lossy().into_owned()),
            ));
            files.push(path);
        }
        Ok(files)
    }
}

fn write_manifest(temp: &mut TempFile, text: &str) -> Result<()> {
    let target = temp.target().to_path_buf();
    temp.file()
        .write_all(text.as_bytes())
        .map_err(|e| Error::io(&target, "write", e))
}

/// What the manifest records of `temp`, synced, as it will be under `name` once renamed (a
/// rename keeps the inode and the modification time); `head`: its first bytes.
fn record_temp(temp: &mut TempFile, name: &str, head: &[u8]) -> Result<WrittenFile> {
    let target = temp.target().to_path_buf();
    temp.file()
        .sync_all()
        .map_err(|e| Error::io(&target, "fsync", e))?;
    let meta = temp
        .file()
        .metadata()
        .map_err(|e| Error::io(&target, "fstat", e))?;
    Ok(WrittenFile {
        name: name.to_string(),
        size: meta.len(),
        inode: meta.ino(),
        mtime_ns: mtime_ns(&meta),
        head_len: head.len() as u64,
        head_hash: fnv1a64(head),
    })
}
