//! Tables for the row store's tests, and an independent reference read of their bytes.
#![allow(dead_code)]
use std::path::{Path, PathBuf};

use fetchahead::store::make::{TableSpec, write_table};
use fetchahead::store::{ReadPath, RowStore, StoreOptions};
use rand::rngs::SmallRng;
use rand::{RngExt, SeedableRng};
use safetensors::SafeTensors;

pub mod cli;
pub mod harness;

pub const DIM: usize = 256;

pub fn make(dir: &Path, rows: u64, layers: &[u32], shards: usize, seed: u64) -> Vec<PathBuf> {
    let spec = TableSpec {
        rows,
        layers: layers.to_vec(),
        dim: DIM,
        shards,
        seed,
    };
    write_table(dir, &spec, |_| {}).expect("write table")
}

/// The concrete paths this machine offers (io_uring only when the kernel has it).
pub fn paths(store: &RowStore) -> Vec<ReadPath> {
    let mut paths = vec![
        ReadPath::Auto,
        ReadPath::Preadv,
        ReadPath::Mmap,
        ReadPath::Buffered,
    ];
    match store.uring() {
        Ok(()) => paths.push(ReadPath::Uring),
        Err(why) => eprintln!("SKIP uring path: {why}"),
    }
    paths
}

pub fn open(dir: &Path, options: StoreOptions) -> RowStore {
    let store = RowStore::open(dir, options).expect("open store");
    if let Err(why) = store.direct_io() {
        eprintln!(
            "NOTE: O_DIRECT unsupported here ({why}); uring and preadv read through the page cache"
        );
    }
    store
}

/// Every tensor of every `.safetensors` file in `dir` (or the file `dir`), parsed by the
/// `safetensors` crate from the whole file: the reference the store is checked against.
pub struct Reference {
    tensors: Vec<(String, Vec<u8>, usize)>,
}

impl Reference {
    pub fn load(dir: &Path) -> Self {
        let files: Vec<PathBuf> = if dir.is_file() {
            vec![dir.to_path_buf()]
        } else {
            std::fs::read_dir(dir)
                .unwrap()
                .map(|e| e.unwrap().path())
                .filter(|p| p.extension().is_some_and(|x| x == "safetensors"))
                .collect()
        };
        let mut tensors = Vec::new();
        for f in files {
            let bytes = std::fs::read(&f).unwrap();
            let st = SafeTensors::deserialize(&bytes).unwrap();
            for (name, view) in st.tensors() {
                let row = view.data().len() / view.shape()[0].max(1);
                tensors.push((name, view.data().to_vec(), row));
            }
        }
        Reference { tensors }
    }

    pub fn row(&self, tensor: &str, row: i64) -> &[u8] {
        let (_, data, rb) = self
            .tensors
            .iter()
            .find(|(n, _, _)| n == tensor)
            .expect("tensor");
        &data[row as usize * rb..(row as usize + 1) * rb]
    }

    /// The expected outputs of a lookup of `ids` in `layer`.
    pub fn expect(&self, layer: u32, ids: &[i64]) -> (Vec<u8>, Vec<u8>) {
        let (mut w, mut s) = (Vec::new(), Vec::new());
        for &id in ids {
            w.extend_from_slice(self.row(&format!("layers.{layer}.engram.embed.weight"), id));
            s.extend_from_slice(self.row(&format!("layers.{layer}.engram.embed.scale"), id));
        }
        (w, s)
    }
}

/// Random ids in `rows`, with duplicates, plus the range's first and last row.
pub fn random_ids(rows: std::ops::Range<u64>, n: usize, seed: u64) -> Vec<i64> {
    let mut rng = SmallRng::seed_from_u64(seed);
    let mut ids: Vec<i64> = (0..n)
        .map(|_| rng.random_range(rows.clone()) as i64)
        .collect();
    if n >= 4 {
        ids[0] = rows.start as i64;
        ids[1] = rows.end as i64 - 1;
        ids[2] = ids[3];
    }
    ids
}

/// Lookup outputs, poisoned so that an unwritten byte shows.
pub fn outputs(store: &RowStore, n: usize) -> (Vec<u8>, Vec<u8>) {
    (
        vec![0xa5; n * store.dim()],
        vec![0xa5; n * store.dim() / 32],
    )
}
