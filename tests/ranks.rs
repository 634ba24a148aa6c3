//! Tensor-parallel ranks as separate processes: each opens its own row range of one sharded
//! table, refuses the other rank's ids with an error that names them, and the union of both
//! ranks' rows equals what a single rank owning every row returns.
//!
//! The test re-runs its own executable once per rank (the child branch reads `RANK_ENV`).
use std::path::{Path, PathBuf};
use std::process::Command;

use fetchahead::Error;
use fetchahead::store::make::{TableSpec, write_table};
use fetchahead::store::{RowStore, StoreOptions};
use rand::{RngExt, SeedableRng, rngs::SmallRng};

const RANK_ENV: &str = "FETCHAHEAD_TEST_RANK";
const ROWS: u64 = 6000;
const RANKS: u64 = 2;
const LAYER: u32 = 14;

fn owned(rank: u64) -> std::ops::Range<u64> {
    let per = ROWS / RANKS;
    rank * per..(rank + 1) * per
}

fn ids_file(dir: &Path) -> PathBuf {
    dir.join("ids.bin")
}

fn rows_file(dir: &Path, rank: u64) -> PathBuf {
    dir.join(format!("rank{rank}.bin"))
}

/// The child: look up this rank's share of the ids, write the rows, and check that one id of
/// the other rank is refused with the error naming it.
fn run_rank(dir: &Path, rank: u64) {
    let range = owned(rank);
    let options = StoreOptions {
        row_start: range.start,
        num_rows: Some(range.end - range.start),
        ..Default::default()
    };
    let store = RowStore::open(dir, options).expect("opening this rank's rows");
    assert_eq!(store.row_range(), range);
    let bytes = std::fs::read(ids_file(dir)).unwrap();
    let all: Vec<i64> = bytes
        .chunks_exact(8)
        .map(|b| i64::from_le_bytes(b.try_into().unwrap()))
        .collect();
    let mine: Vec<i64> = all
        .iter()
        .copied()
        .filter(|&id| range.contains(&(id as u64)))
        .collect();
    let dim = store.dim();
    let mut weights = vec![0u8; mine.len() * dim];
    let mut scales = vec![0u8; mine.len() * dim / 32];
    store
        .lookup(LAYER, &mine, &mut weights, &mut scales)
        .expect("lookup of owned ids");
    weights.extend_from_slice(&scales);
    std::fs::write(rows_file(dir, rank), weights).unwrap();

    let foreign = all
        .iter()
        .copied()
        .find(|&id| !range.contains(&(id as u64)))
        .unwrap();
    let mut w = vec![0u8; 2 * dim];
    let mut s = vec![0u8; 2 * dim / 32];
    match store.lookup(LAYER, &[mine[0], foreign], &mut w, &mut s) {
        Err(
            e @ Error::RowsOutOfRange {
                count: 1,
                first_index: 1,
                ..
            },
        ) => {
            assert!(e.to_string().contains(&foreign.to_string()), "{e}");
        }
        other => panic!("rank {rank}: the other rank's id {foreign} gave {other:?}"),
    }
}

#[test]
fn two_rank_processes_split_the_rows_and_their_union_is_the_single_rank_result() {
    if let Ok(rank) = std::env::var(RANK_ENV) {
        let dir = PathBuf::from(std::env::var("FETCHAHEAD_TEST_DIR").unwrap());
        run_rank(&dir, rank.parse().unwrap());
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let spec = TableSpec {
        rows: ROWS,
        layers: vec![1, LAYER],
        dim: 256,
        shards: 3,
        seed: 11,
    };
    write_table(dir.path(), &spec, |_| {}).unwrap();
    let mut rng = SmallRng::seed_from_u64(rand::rng().random());
    let ids: Vec<i64> = (0..2000)
        .map(|_| rng.random_range(0..ROWS as i64))
        .collect();
    let bytes: Vec<u8> = ids.iter().flat_map(|id| id.to_le_bytes()).collect();
    std::fs::write(ids_file(dir.path()), bytes).unwrap();

    let me = std::env::current_exe().unwrap();
    let children: Vec<_> = (0..RANKS)
        .map(|rank| {
            Command::new(&me)
                .args([
                    "--exact",
                    "two_rank_processes_split_the_rows_and_their_union_is_the_single_rank_result",
                    "--nocapture",
                ])
                .env(RANK_ENV, rank.to_string())
                .env("FETCHAHEAD_TEST_DIR", dir.path())
                .spawn()
                .unwrap()
        })
        .collect();
    for (rank, mut child) in children.into_iter().enumerate() {
        assert!(child.wait().unwrap().success(), "rank {rank} failed");
    }

    // The single rank that owns every row.
    let whole = RowStore::open(dir.path(), StoreOptions::default()).unwrap();
    let dim = whole.dim();
    let mut want_w = vec![0u8; ids.len() * dim];
    let mut want_s = vec![0u8; ids.len() * dim / 32];
    whole.lookup(LAYER, &ids, &mut want_w, &mut want_s).unwrap();

    // Reassemble in the order of `ids` from the ranks' outputs (each in its own id order).
    let mut next = [0usize; RANKS as usize];
    let outputs: Vec<Vec<u8>> = (0..RANKS)
        .map(|r| std::fs::read(rows_file(dir.path(), r)).unwrap())
        .collect();
    let counts: Vec<usize> = (0..RANKS)
        .map(|r| {
            ids.iter()
                .filter(|&&id| owned(r).contains(&(id as u64)))
                .count()
        })
        .collect();
    for (i, &id) in ids.iter().enumerate() {
        let r = (id as u64 / (ROWS / RANKS)) as usize;
        let k = next[r];
        next[r] += 1;
        let out = &outputs[r];
        let w = &out[k * dim..(k + 1) * dim];
        let s_base = counts[r] * dim + k * dim / 32;
        let s = &out[s_base..s_base + dim / 32];
        assert_eq!(w, &want_w[i * dim..(i + 1) * dim], "weights of id {id}");
        assert_eq!(
            s,
            &want_s[i * dim / 32..(i + 1) * dim / 32],
            "scales of id {id}"
        );
    }
}
