//! Writing generated Engram tables in the layout the store reads: deterministic for a seed, each
//! shard's data section starting on a page boundary.
//!
//! Writing never damages what it did not write: every file goes to a temporary name in the
//! target directory and is renamed into place when complete (never through a symlink); a
//! manifest (`fetchahead-table.json`) records which files a writer made, so that a directory
//! holding anything else is refused unless forced; free space is checked first; a failed write
//! removes its temporary files, and a killed one's are removed by the next writer.
use std::collections::BTreeSet;
use std::io::{BufWriter, Write};
use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use safetensors::Dtype;
use safetensors::tensor::{Metadata, TensorInfo};

use super::file::{TEMP_PREFIX, TempFile, free_bytes, read_small, sync_dir};
use super::layout::{INDEX_FILE, MAX_DIM, MX_BLOCK, PAGE, scale_name, weight_name};
use crate::{Error, Result};

/// The manifest a writer leaves beside the table it wrote.
pub const MANIFEST: &str = "fetchahead-table.json";
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
    /// Replace the table files in the directory whoever wrote them (never following a symlink:
    /// a link is replaced, not what it points at). Files that are no table's are left alone.
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

/// What a writer's manifest says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Manifest {
    /// The writer's name (`make-table`, `demo`).
    pub writer: String,
    /// False while a rewrite is being put in place (a killed rewrite leaves it so).
    pub complete: bool,
    /// The table's spec (`None` for a legacy demo table, which recorded only its seed).
    pub spec: Option<TableSpec>,
    /// The files of the table, by name within its directory.
    pub files: Vec<String>,
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
    /// Files fetchahead did not write, each described (`name (a symlink to ...)`); with the
    /// manifest of the table beside them, if any.
    Foreign {
        files: Vec<String>,
        manifest: Option<Manifest>,
    },
}

impl DirState {
    /// A sentence for an error: what is in the directory.
    pub fn describe(&self) -> String {
        match self {
            DirState::Absent => "nothing (it does not exist)".into(),
            DirState::Empty => "nothing".into(),
            DirState::Ours(m) => format!("a table written by `fetchahead {}`", m.writer),
            DirState::Foreign { files, .. } => {
                const SHOWN: usize = 8;
                let mut list: Vec<&str> = files.iter().take(SHOWN).map(String::as_str).collect();
                let more = files.len().saturating_sub(SHOWN);
                let tail = if more > 0 {
                    format!(" and {more} more")
                } else {
                    String::new()
                };
                list.sort_unstable();
                format!("files fetchahead did not write: {}{tail}", list.join(", "))
            }
        }
    }
}

fn manifest_json(writer: &str, complete: bool, spec: &TableSpec, files: &[String]) -> String {
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
    });
    serde_json::to_string_pretty(&value).unwrap_or_default()
}

fn parse_manifest(bytes: &[u8]) -> Option<Manifest> {
    let v: serde_json::Value = serde_json::from_slice(bytes).ok()?;
    let writer = v.get("writer")?.as_str()?.to_string();
    let complete = v.get("state")?.as_str()? == "complete";
    let files = v
        .get("files")?
        .as_array()?
        .iter()
        .map(|f| f.as_str().map(str::to_string))
        .collect::<Option<Vec<_>>>()?;
    if files
        .iter()
        .any(|f| f.contains('/') || f == ".." || f == "." || f.is_empty())
    {
        return None;
    }
    let t = v.get("table")?;
    let spec = TableSpec {
        rows: t.get("rows")?.as_u64()?,
        layers: t
            .get("layers")?
            .as_array()?
            .iter()
            .map(|l| l.as_u64().and_then(|l| u32::try_from(l).ok()))
            .collect::<Option<Vec<_>>>()?,
        dim: usize::try_from(t.get("dim")?.as_u64()?).ok()?,
        shards: usize::try_from(t.get("shards")?.as_u64()?).ok()?,
        seed: t.get("seed")?.as_u64()?,
    };
    Some(Manifest {
        writer,
        complete,
        spec: Some(spec),
        files,
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

/// What `dir` holds: nothing, a table fetchahead wrote (its manifest), or other files. Leftover
/// temporary files of killed writers count as nothing; those of a running writer are an error.
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
    let manifest = if is_regular(&manifest_path) {
        read_small(&manifest_path, 1 << 20)
            .ok()
            .and_then(|b| parse_manifest(&b))
    } else {
        None
    };
    let manifest = manifest.or_else(|| {
        // An older demo's table: its shard, its seed marker, and perhaps a tune file.
        let legacy = is_regular(&dir.join(LEGACY_DEMO_SEED))
            && is_regular(&dir.join("model.safetensors"))
            && names.iter().all(|n| {
                n == LEGACY_DEMO_SEED
                    || n == "model.safetensors"
                    || TUNE_FILES.contains(&n.as_str())
            });
        legacy.then(|| Manifest {
            writer: "demo".into(),
            complete: false,
            spec: None,
            files: vec!["model.safetensors".into(), LEGACY_DEMO_SEED.into()],
        })
    });
    let listed = |name: &str| {
        name == MANIFEST
            || manifest
                .as_ref()
                .is_some_and(|m| m.files.iter().any(|f| f == name))
    };
    let foreign: Vec<String> = names
        .iter()
        .filter(|n| {
            // Tune's file is its own business (a writer of tables never writes it); a listed
            // file replaced by a link, a directory or a FIFO is not ours any more.
            !TUNE_FILES.contains(&n.as_str()) && (!listed(n) || !is_regular(&dir.join(n)))
        })
        .map(|n| describe_entry(dir, n))
        .collect();
    Ok(match (manifest, foreign.is_empty()) {
        (Some(m), true) => DirState::Ours(m),
        (None, true) => DirState::Empty,
        (manifest, false) => DirState::Foreign {
            files: foreign,
            manifest,
        },
    })
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

/// Writes `spec` into `dir` (`model.safetensors`, or K shards and an index) as `make-table`
/// without `--force`; see [`write_table_with`].
pub fn write_table(
    dir: &Path,
    spec: &TableSpec,
    progress: impl FnMut(u64),
) -> Result<Vec<PathBuf>> {
    write_table_with(dir, spec, &WriteOptions::default(), progress)
}

/// Writes `spec` into `dir` (`model.safetensors`, or K shards and an index, and the manifest);
/// `progress` gets bytes written so far. Returns the table's files (shards, then the index).
///
/// `dir` must be absent, empty, or hold only a table this writer wrote (its manifest says so);
/// anything else is refused, naming what is there, unless `options.force`. The new table
/// replaces the old one whole: files of the old table that the new one lacks (an index, other
/// shards) are removed. Nothing is written unless the filesystem has room for all of it; a
/// failed write removes what it wrote.
pub fn write_table_with(
    dir: &Path,
    spec: &TableSpec,
    options: &WriteOptions,
    mut progress: impl FnMut(u64),
) -> Result<Vec<PathBuf>> {
    spec.check()?;
    let state = dir_state(dir)?;
    let refuse = |why: String| {
        Err(Error::WouldOverwrite {
            path: dir.to_path_buf(),
            why,
        })
    };
    let old = match (&state, options.force) {
        (DirState::Foreign { files: _, manifest }, true) => manifest.clone(),
        (DirState::Foreign { .. }, false) => {
            return refuse(format!(
                "it holds {} (pass --force to replace its table files, or choose another \
                 directory)",
                state.describe()
            ));
        }
        (DirState::Ours(m), force) => {
            if m.writer != options.writer && !force {
                return refuse(format!(
                    "it holds a table written by `fetchahead {}`, not by `fetchahead {}` (pass \
                     --force to replace it, or choose another directory)",
                    m.writer, options.writer
                ));
            }
            Some(m.clone())
        }
        (DirState::Absent | DirState::Empty, _) => None,
    };
    let (shards, weight_map) = plan_shards(spec)?;
    let index_text = (spec.shards > 1)
        .then(|| {
            let index = serde_json::json!({
                "metadata": { "total_size": spec.data_bytes() },
                "weight_map": weight_map,
            });
            serde_json::to_string_pretty(&index).map_err(|e| Error::invalid("index", e.to_string()))
        })
        .transpose()?;
    let mut new_names: Vec<String> = shards.iter().map(|s| s.name.clone()).collect();
    if index_text.is_some() {
        new_names.push(INDEX_FILE.into());
    }
    let final_manifest = manifest_json(&options.writer, true, spec, &new_names);
    // Room for every new file while the old ones still stand.
    let need = shards
        .iter()
        .map(|s| s.len)
        .chain(index_text.iter().map(|t| t.len() as u64))
        .fold(2 * final_manifest.len() as u64, u64::saturating_add);
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
    let outcome = write_and_commit(
        dir,
        spec,
        options,
        &shards,
        index_text.as_deref(),
        &new_names,
        old.as_ref(),
        &state,
        &mut progress,
    );
    if outcome.is_err() && created {
        // Only succeeds when empty: the temporary files are gone by now.
        let _ = std::fs::remove_dir(dir);
    }
    outcome
}

#[allow(clippy::too_many_arguments)]
fn write_and_commit(
    dir: &Path,
    spec: &TableSpec,
    options: &WriteOptions,
    shards: &[ShardPlan],
    index_text: Option<&str>,
    new_names: &[String],
    old: Option<&Manifest>,
    state: &DirState,
    progress: &mut impl FnMut(u64),
) -> Result<Vec<PathBuf>> {
    remove_dead_temps(dir);
    let tensors = spec.tensors();
    let mut written = 0u64;
    let mut chunk = crate::memory::zeroed(CHUNK as u64, "a write buffer")?;
    let mut temps = Vec::with_capacity(shards.len() + 2);
    for shard in shards {
        let mut temp = TempFile::create(&dir.join(&shard.name))?;
        let path = temp.path().to_path_buf();
        let io = |e| Error::io(&path, "write", e);
        let mut w = BufWriter::with_capacity(CHUNK, temp.file());
        w.write_all(&(shard.header.len() as u64).to_le_bytes())
            .map_err(io)?;
        w.write_all(&shard.header).map_err(io)?;
        for &t in &shard.tensors {
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
        drop(w);
        temps.push(temp);
    }
    if let Some(text) = index_text {
        let mut temp = TempFile::create(&dir.join(INDEX_FILE))?;
        let path = temp.path().to_path_buf();
        temp.file()
            .write_all(text.as_bytes())
            .map_err(|e| Error::io(&path, "write", e))?;
        temps.push(temp);
    }
    // Files to remove once the new ones are in: the old table's, and with --force other
    // tables' files that would shadow the new one (an index, other shards).
    let mut stale: BTreeSet<String> = old
        .map(|m| m.files.iter().cloned().collect())
        .unwrap_or_default();
    if options.force
        && let DirState::Foreign { .. } = state
        && let Ok(entries) = std::fs::read_dir(dir)
    {
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            let table_file =
                name.ends_with(".safetensors") || name == INDEX_FILE || name == LEGACY_DEMO_SEED;
            if table_file && temp_pid(&name).is_none() {
                stale.insert(name);
            }
        }
    }
    for n in new_names {
        stale.remove(n);
    }
    // While the files change, the manifest claims old and new alike, so that a writer killed
    // here leaves a directory the next one recognises as its own (and rewrites).
    let mut claimed: Vec<String> = new_names.to_vec();
    claimed.extend(stale.iter().cloned());
    let mut writing = TempFile::create(&dir.join(MANIFEST))?;
    let path = writing.path().to_path_buf();
    writing
        .file()
        .write_all(manifest_json(&options.writer, false, spec, &claimed).as_bytes())
        .map_err(|e| Error::io(&path, "write", e))?;
    let mut done = TempFile::create(&dir.join(MANIFEST))?;
    let path = done.path().to_path_buf();
    done.file()
        .write_all(manifest_json(&options.writer, true, spec, new_names).as_bytes())
        .map_err(|e| Error::io(&path, "write", e))?;
    writing.commit()?;
    for name in &stale {
        let p = dir.join(name);
        match std::fs::remove_file(&p) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                return Err(Error::io(&p, "remove a file of the old table", e));
            }
            _ => {}
        }
    }
    let mut files = Vec::with_capacity(temps.len());
    for temp in temps {
        files.push(temp.commit()?);
    }
    done.commit()?;
    sync_dir(dir);
    Ok(files)
}

/// Removes temporary files that killed writers left in `dir`.
fn remove_dead_temps(dir: &Path) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if let Some(pid) = temp_pid(&name)
            && !alive(pid)
        {
            let _ = std::fs::remove_file(e.path());
        }
    }
}
