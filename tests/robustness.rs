//! Issue 12, as a careless or hostile user would try it: writers never damage what they did not
//! write, the C library never aborts its host, no SIGBUS through the defaults, no hang on a FIFO,
//! no silently wrong table, and every message names what is actually at fault.
//!
//! Tests that could kill the process on a regression (an abort, SIGBUS, SIGKILL) run their body
//! in a child process: this test binary re-executed with `FETCHAHEAD_TEST_CHILD` naming the test.
mod common;

use std::collections::BTreeSet;
use std::ffi::{CStr, CString, c_char};
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::ptr;
use std::sync::mpsc;
use std::time::Duration;

use common::cli::{mkfifo, run_cli};
use common::{DIM, make, outputs};
use fetchahead::Error;
use fetchahead::ffi::*;
use fetchahead::store::layout::TableLayout;
use fetchahead::store::make::{
    DirState, MANIFEST, TableSpec, WriteOptions, dir_state, write_table, write_table_with,
};
use fetchahead::store::tune::{TunedRange, tune_file};
use fetchahead::store::{ReadPath, RowStore, StoreOptions, Tuning};
use safetensors::tensor::TensorView;
use safetensors::{Dtype, serialize_to_file};

const CHILD_ENV: &str = "FETCHAHEAD_TEST_CHILD";

/// Runs `body` in a child process (this test, re-executed) and fails unless the child exits
/// normally with success: a signal (abort, SIGBUS) or a failed assertion there fails the test.
fn in_child(test: &str, body: impl FnOnce()) {
    if std::env::var(CHILD_ENV).as_deref() == Ok(test) {
        body();
        return;
    }
    let exe = std::env::current_exe().expect("the test binary");
    let out = Command::new(exe)
        .args([test, "--exact", "--nocapture", "--test-threads=1"])
        .env(CHILD_ENV, test)
        .output()
        .expect("run the child");
    let stderr = String::from_utf8_lossy(&out.stderr);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{test}: the child {} (signal {:?})\nstdout:\n{stdout}\nstderr:\n{stderr}",
        out.status,
        out.status.signal()
    );
    // The child ran exactly this test (a renamed test would otherwise pass with nothing run).
    assert!(
        stdout.contains("1 passed"),
        "{test}: the child ran nothing:\n{stdout}"
    );
}

fn last_error() -> String {
    let mut buf = [0 as c_char; 1024];
    // SAFETY: `buf` is writable for its length.
    unsafe { fetchahead_last_error(buf.as_mut_ptr(), buf.len()) };
    // SAFETY: fetchahead_last_error NUL-terminates what it writes.
    unsafe { CStr::from_ptr(buf.as_ptr()) }
        .to_string_lossy()
        .into_owned()
}

fn table_lookup_error(table: *const TableHandle) -> String {
    let mut buf = [0 as c_char; 1024];
    // SAFETY: `buf` is writable for its length; `table` is open.
    unsafe { fetchahead_table_lookup_error(table, buf.as_mut_ptr(), buf.len()) };
    // SAFETY: NUL-terminated.
    unsafe { CStr::from_ptr(buf.as_ptr()) }
        .to_string_lossy()
        .into_owned()
}

fn open_store(path: &Path, layer: u32) -> (i32, *mut TableHandle) {
    let c = CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
    let mut table = ptr::null_mut();
    // SAFETY: `c` is NUL-terminated and `table` writable.
    let rc = unsafe { fetchahead_open_store(c.as_ptr(), layer, 0, 0, &mut table) };
    (rc, table)
}

fn names(dir: &Path) -> BTreeSet<String> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect()
}

fn set(items: &[&str]) -> BTreeSet<String> {
    items.iter().map(|s| s.to_string()).collect()
}

fn spec(rows: u64, shards: usize) -> TableSpec {
    TableSpec {
        rows,
        layers: vec![1, 14],
        dim: DIM,
        shards,
        seed: 1,
    }
}

/// A user's precious file, and a directory that links to it as its shard.
fn linked_dir(root: &Path) -> (PathBuf, PathBuf, Vec<u8>) {
    let precious = root.join("precious");
    std::fs::create_dir(&precious).unwrap();
    let real = precious.join("real.safetensors");
    let bytes: Vec<u8> = (0..100_000u32).map(|i| (i * 7 % 251) as u8).collect();
    std::fs::write(&real, &bytes).unwrap();
    let dir = root.join("m");
    std::fs::create_dir(&dir).unwrap();
    std::os::unix::fs::symlink(
        "../precious/real.safetensors",
        dir.join("model.safetensors"),
    )
    .unwrap();
    (dir, real, bytes)
}

// ---- case 1: data loss ------------------------------------------------------------------

#[test]
fn make_table_never_writes_through_a_symlink_or_over_foreign_files() {
    let tmp = tempfile::tempdir().unwrap();
    let (dir, real, bytes) = linked_dir(tmp.path());
    let err = write_table(&dir, &spec(4096, 1), |_| {}).unwrap_err();
    let msg = err.to_string();
    assert!(
        matches!(err, Error::WouldOverwrite { .. })
            && msg.contains("model.safetensors (a symlink to ../precious/real.safetensors)")
            && msg.contains("--force"),
        "{msg}"
    );
    assert_eq!(
        std::fs::read(&real).unwrap(),
        bytes,
        "the link's target changed"
    );
    assert!(
        std::fs::symlink_metadata(dir.join("model.safetensors"))
            .unwrap()
            .file_type()
            .is_symlink()
    );
    assert_eq!(
        names(&dir),
        set(&["model.safetensors"]),
        "nothing else written"
    );

    // A user's other files: refused too, named.
    let other = tmp.path().join("other");
    std::fs::create_dir(&other).unwrap();
    std::fs::write(other.join("notes.txt"), b"mine").unwrap();
    let msg = write_table(&other, &spec(4096, 1), |_| {})
        .unwrap_err()
        .to_string();
    assert!(msg.contains("notes.txt (4 bytes)"), "{msg}");
    assert_eq!(names(&other), set(&["notes.txt"]));

    // --force replaces the link itself, never what it points at, and leaves other files alone.
    std::fs::write(dir.join("notes.txt"), b"mine").unwrap();
    let forced = WriteOptions {
        force: true,
        ..WriteOptions::default()
    };
    write_table_with(&dir, &spec(4096, 1), &forced, |_| {}).unwrap();
    assert_eq!(
        std::fs::read(&real).unwrap(),
        bytes,
        "the link's target changed"
    );
    let shard = std::fs::symlink_metadata(dir.join("model.safetensors")).unwrap();
    assert!(
        shard.file_type().is_file(),
        "the link was replaced by the table's shard"
    );
    assert_eq!(std::fs::read(dir.join("notes.txt")).unwrap(), b"mine");
    assert_eq!(TableLayout::open(&dir).unwrap().rows(), 4096);
}

#[test]
fn a_table_of_another_writer_is_refused_without_force() {
    let tmp = tempfile::tempdir().unwrap();
    write_table(tmp.path(), &spec(4096, 1), |_| {}).unwrap();
    let before = std::fs::read(tmp.path().join("model.safetensors")).unwrap();
    let demo = WriteOptions {
        writer: "demo".into(),
        force: false,
    };
    let msg = write_table_with(tmp.path(), &spec(2048, 1), &demo, |_| {})
        .unwrap_err()
        .to_string();
    assert!(
        msg.contains("fetchahead make-table") && msg.contains("--force"),
        "{msg}"
    );
    assert_eq!(
        std::fs::read(tmp.path().join("model.safetensors")).unwrap(),
        before
    );
}

// ---- case 2: a rewrite replaces the whole table ----------------------------------------

#[test]
fn a_second_make_table_leaves_only_the_new_table() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("s");
    write_table(&dir, &spec(4096, 2), |_| {}).unwrap();
    assert_eq!(
        names(&dir),
        set(&[
            "model-00001-of-00002.safetensors",
            "model-00002-of-00002.safetensors",
            "model.safetensors.index.json",
            MANIFEST
        ])
    );
    write_table(&dir, &spec(8192, 1), |_| {}).unwrap();
    assert_eq!(names(&dir), set(&["model.safetensors", MANIFEST]));
    assert_eq!(TableLayout::open(&dir).unwrap().rows(), 8192);
    // And back to shards: the single file goes.
    write_table(&dir, &spec(1024, 3), |_| {}).unwrap();
    assert!(!dir.join("model.safetensors").exists());
    assert_eq!(names(&dir).len(), 5, "{:?}", names(&dir));
    assert_eq!(TableLayout::open(&dir).unwrap().rows(), 1024);
    match dir_state(&dir).unwrap() {
        DirState::Ours(m) => {
            assert!(m.complete);
            assert_eq!(m.writer, "make-table");
            assert_eq!(m.spec, Some(spec(1024, 3)));
        }
        other => panic!("{other:?}"),
    }
}

// ---- case 6: disk filled, partial files ---------------------------------------------------

#[test]
fn a_table_larger_than_the_free_space_is_refused_before_writing() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("x");
    let err = write_table(&dir, &spec(1_000_000_000_000_000, 1), |_| {}).unwrap_err();
    match &err {
        Error::NoSpace {
            need, available, ..
        } => assert!(need > available, "{err}"),
        other => panic!("{other:?}"),
    }
    assert!(!dir.exists(), "nothing is created");
}

/// A write that fails half-way (here: a file-size limit, EFBIG) removes what it wrote and leaves
/// the table that was there whole.
#[test]
fn a_failed_write_leaves_nothing_behind() {
    in_child("a_failed_write_leaves_nothing_behind", || {
        let tmp = tempfile::tempdir().unwrap();
        let fresh = tmp.path().join("fresh");
        let old = tmp.path().join("old");
        write_table(&old, &spec(1024, 2), |_| {}).unwrap();
        let before: Vec<(String, Vec<u8>)> = names(&old)
            .into_iter()
            .map(|n| (n.clone(), std::fs::read(old.join(&n)).unwrap()))
            .collect();
        // SAFETY: plain syscalls on this (child) process: no write may grow a file past 1 MiB,
        // and a write that tries fails with EFBIG instead of raising SIGXFSZ.
        unsafe {
            libc::signal(libc::SIGXFSZ, libc::SIG_IGN);
            let limit = libc::rlimit {
                rlim_cur: 1 << 20,
                rlim_max: libc::RLIM_INFINITY,
            };
            assert_eq!(libc::setrlimit(libc::RLIMIT_FSIZE, &limit), 0);
        }
        let err = write_table(&fresh, &spec(8192, 1), |_| {}).unwrap_err();
        assert!(matches!(err, Error::Io { .. }), "{err}");
        assert!(
            !fresh.exists(),
            "left {:?}",
            fresh.exists().then(|| names(&fresh))
        );
        let err = write_table(&old, &spec(8192, 1), |_| {}).unwrap_err();
        assert!(matches!(err, Error::Io { .. }), "{err}");
        let after: Vec<(String, Vec<u8>)> = names(&old)
            .into_iter()
            .map(|n| (n.clone(), std::fs::read(old.join(&n)).unwrap()))
            .collect();
        assert!(before == after, "the old table changed: {:?}", names(&old));
        assert_eq!(TableLayout::open(&old).unwrap().rows(), 1024);
    });
}

/// A writer killed mid-write leaves only temporary files, which the next write removes.
#[test]
fn a_killed_write_leaves_only_temporary_files_that_the_next_removes() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("k");
    if std::env::var(CHILD_ENV).as_deref()
        == Ok("a_killed_write_leaves_only_temporary_files_that_the_next_removes")
    {
        let target = PathBuf::from(std::env::var("FETCHAHEAD_TEST_DIR").unwrap());
        write_table(&target, &spec(8192, 2), |done| {
            if done > 1 << 20 {
                // SAFETY: kills this child process, as a user's kill -9 would.
                unsafe { libc::kill(libc::getpid(), libc::SIGKILL) };
            }
        })
        .unwrap();
        return;
    }
    let kill_a_write_into = |dir: &Path| {
        let exe = std::env::current_exe().unwrap();
        let name = "a_killed_write_leaves_only_temporary_files_that_the_next_removes";
        let status = Command::new(exe)
            .args([name, "--exact", "--nocapture"])
            .env(CHILD_ENV, name)
            .env("FETCHAHEAD_TEST_DIR", dir)
            .status()
            .unwrap();
        assert_eq!(status.signal(), Some(libc::SIGKILL), "{status}");
    };
    // Into a fresh directory: only temporary files, no table.
    kill_a_write_into(&dir);
    let left = names(&dir);
    assert!(
        !left.is_empty() && left.iter().all(|n| n.starts_with(".fetchahead-tmp-")),
        "a killed write left {left:?}"
    );
    assert!(TableLayout::open(&dir).is_err(), "no table is there");
    assert_eq!(dir_state(&dir).unwrap(), DirState::Empty);
    write_table(&dir, &spec(1024, 1), |_| {}).unwrap();
    assert_eq!(names(&dir), set(&["model.safetensors", MANIFEST]));
    // Over a table: the old one stays whole and opens; the next write removes the leftovers.
    kill_a_write_into(&dir);
    assert!(names(&dir).len() > 2);
    assert_eq!(TableLayout::open(&dir).unwrap().rows(), 1024);
    assert!(matches!(dir_state(&dir).unwrap(), DirState::Ours(m) if m.complete));
    write_table(&dir, &spec(2048, 1), |_| {}).unwrap();
    assert_eq!(names(&dir), set(&["model.safetensors", MANIFEST]));
    assert_eq!(TableLayout::open(&dir).unwrap().rows(), 2048);
}

/// On a tiny tmpfs (mounted here when allowed): refused for want of space, nothing left.
#[test]
fn out_of_space_on_a_tiny_tmpfs_leaves_nothing_behind() {
    let tmp = tempfile::tempdir().unwrap();
    let mnt = tmp.path().join("tiny");
    std::fs::create_dir(&mnt).unwrap();
    let mounted = Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=1m", "tmpfs"])
        .arg(&mnt)
        .output();
    match mounted {
        Ok(out) if out.status.success() => {}
        Ok(out) => {
            eprintln!(
                "SKIP out_of_space_on_a_tiny_tmpfs_leaves_nothing_behind: mount -t tmpfs not \
                 allowed here ({})",
                String::from_utf8_lossy(&out.stderr).trim()
            );
            return;
        }
        Err(e) => {
            eprintln!("SKIP out_of_space_on_a_tiny_tmpfs_leaves_nothing_behind: no mount ({e})");
            return;
        }
    }
    let dir = mnt.join("t");
    let outcome = write_table(&dir, &spec(8192, 1), |_| {});
    let left: Vec<_> = walk(&mnt);
    let _ = Command::new("umount").arg(&mnt).status();
    let err = outcome.unwrap_err();
    assert!(matches!(err, Error::NoSpace { .. }), "{err}");
    assert!(left.is_empty(), "left {left:?}");
}

fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        out.push(e.path());
        if e.file_type().unwrap().is_dir() {
            out.extend(walk(&e.path()));
        }
    }
    out
}

// ---- case 3: the C library never aborts its host -------------------------------------------

/// A safetensors file whose header claims `rows` rows of dim 32, made sparse to that length.
fn sparse_table(path: &Path, rows: u64) -> bool {
    let (w, s) = (rows * 32, rows);
    let header = format!(
        r#"{{"layers.1.engram.embed.weight":{{"dtype":"F8_E4M3","shape":[{rows},32],"data_offsets":[0,{w}]}},"layers.1.engram.embed.scale":{{"dtype":"F8_E8M0","shape":[{rows},1],"data_offsets":[{w},{}]}}}}"#,
        w + s
    );
    let mut bytes = (header.len() as u64).to_le_bytes().to_vec();
    bytes.extend_from_slice(header.as_bytes());
    std::fs::write(path, &bytes).unwrap();
    let f = std::fs::OpenOptions::new().write(true).open(path).unwrap();
    match f.set_len(bytes.len() as u64 + w + s) {
        Ok(()) => true,
        Err(e) => {
            eprintln!(
                "SKIP the sparse-file case: a {} B sparse file is refused here ({e})",
                w + s
            );
            false
        }
    }
}

#[test]
fn absurd_sizes_through_the_c_abi_are_errors() {
    in_child("absurd_sizes_through_the_c_abi_are_errors", || {
        let mut table = ptr::null_mut();
        // SAFETY: `table` is writable.
        let rc = unsafe { fetchahead_open_memory_table(1_000_000_000_000, 256, 1, &mut table) };
        assert_eq!(rc, FETCHAHEAD_ERR_INVALID, "{}", last_error());
        assert!(table.is_null());
        assert!(last_error().contains("memory"), "{}", last_error());

        // Scales of more rows than this machine has bytes of memory (2^36 at least).
        let available = fetchahead::memory::available_bytes().unwrap_or(1 << 36);
        let rows = (available.saturating_mul(2))
            .next_power_of_two()
            .max(1 << 36);
        let tmp = tempfile::tempdir().unwrap();
        let file = tmp.path().join("sparse.safetensors");
        if sparse_table(&file, rows) {
            let (rc, table) = open_store(&file, 1);
            assert_eq!(rc, FETCHAHEAD_ERR_INVALID, "{}", last_error());
            assert!(table.is_null());
            let msg = last_error();
            assert!(
                msg.contains("resident scales") && msg.contains("memory"),
                "{msg}"
            );
        }
    });
}

// ---- case 4: no SIGBUS through the defaults ------------------------------------------------

#[test]
fn tune_never_makes_mmap_autos_choice() {
    let tmp = tempfile::tempdir().unwrap();
    make(tmp.path(), 20000, &[1], 1, 2);
    let store = RowStore::open(tmp.path(), StoreOptions::default()).unwrap();
    let mut measured = Vec::new();
    let tuning = fetchahead::store::tune::measure(&store, 1, 3, |s| measured.push(s.path)).unwrap();
    assert!(measured.contains(&ReadPath::Mmap), "mmap is still measured");
    assert!(
        tuning.ranges.iter().all(|r| r.path != ReadPath::Mmap),
        "{tuning:?}"
    );
    // A tune file of older days that names mmap: Auto ignores it.
    let mmap_everywhere = Tuning {
        ranges: vec![TunedRange {
            max_batch: u64::MAX,
            path: ReadPath::Mmap,
            p50_us: 1.0,
        }],
    };
    for n in [1, 72, 4096, 1 << 20] {
        assert_ne!(mmap_everywhere.choose(n, true), ReadPath::Mmap);
        assert_ne!(mmap_everywhere.choose(n, false), ReadPath::Mmap);
    }
}

#[test]
fn truncation_during_lookups_under_auto_after_tune_never_kills_the_process() {
    in_child(
        "truncation_during_lookups_under_auto_after_tune_never_kills_the_process",
        || {
            let tmp = tempfile::tempdir().unwrap();
            let files = make(tmp.path(), 8192, &[1], 1, 5);
            // What `tune` could write before: mmap for every batch size.
            Tuning {
                ranges: vec![TunedRange {
                    max_batch: u64::MAX,
                    path: ReadPath::Mmap,
                    p50_us: 1.0,
                }],
            }
            .save(&tune_file(tmp.path()))
            .unwrap();
            let store = RowStore::open(tmp.path(), StoreOptions::default()).unwrap();
            assert_eq!(store.read_path(), ReadPath::Auto);
            assert_ne!(store.auto_path(4096), ReadPath::Mmap);
            let len = std::fs::metadata(&files[0]).unwrap().len();
            let ids: Vec<i64> = (0..8192).rev().collect();
            let (mut w, mut s) = outputs(&store, ids.len());
            let shard = std::fs::OpenOptions::new()
                .write(true)
                .open(&files[0])
                .unwrap();
            let (mut ok, mut failed) = (0, 0);
            std::thread::scope(|scope| {
                let cut = scope.spawn(|| {
                    for i in 0..200u64 {
                        shard.set_len(len / 2 + (i % 7) * 4096).unwrap();
                        std::thread::sleep(Duration::from_micros(200));
                    }
                });
                while !cut.is_finished() {
                    store.evict_page_cache().unwrap();
                    match store.lookup(1, &ids, &mut w, &mut s) {
                        Ok(()) => ok += 1,
                        // Any error is fine (the rows past the cut are gone); a signal is not.
                        Err(_) => failed += 1,
                    }
                }
            });
            assert!(
                failed > 0,
                "the truncation was never seen ({ok} lookups passed)"
            );
        },
    );
}

// ---- case 5: a FIFO never hangs --------------------------------------------------------

/// `open` returns within a second with an error naming `fifo` as a FIFO.
fn refused_quickly(what: &str, fifo: &Path, open: impl FnOnce() -> String + Send + 'static) {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(open());
    });
    let msg = rx
        .recv_timeout(Duration::from_secs(1))
        .unwrap_or_else(|_| panic!("{what}: still blocked after a second on {}", fifo.display()));
    assert!(
        msg.contains("FIFO") && msg.contains(&*fifo.file_name().unwrap().to_string_lossy()),
        "{what}: {msg}"
    );
}

#[test]
fn a_fifo_is_refused_within_a_second() {
    let tmp = tempfile::tempdir().unwrap();
    // In place of the only shard.
    let shard_dir = tmp.path().join("shard");
    std::fs::create_dir(&shard_dir).unwrap();
    let fifo = shard_dir.join("model.safetensors");
    mkfifo(&fifo);
    let d = shard_dir.clone();
    refused_quickly("TableLayout::open", &fifo, move || {
        TableLayout::open(&d).unwrap_err().to_string()
    });
    let f = fifo.clone();
    refused_quickly("RowStore::open of the file", &fifo, move || {
        RowStore::open(&f, StoreOptions::default())
            .err()
            .unwrap()
            .to_string()
    });
    let d = shard_dir.clone();
    refused_quickly("fetchahead_open_store", &fifo, move || {
        let (rc, _) = open_store(&d, 1);
        assert_eq!(rc, FETCHAHEAD_ERR_INVALID);
        last_error()
    });
    // In place of the index.
    let index_dir = tmp.path().join("index");
    make(&index_dir, 1000, &[1, 14], 2, 1);
    let index = index_dir.join("model.safetensors.index.json");
    std::fs::remove_file(&index).unwrap();
    mkfifo(&index);
    let d = index_dir.clone();
    refused_quickly("the index", &index, move || {
        RowStore::open(&d, StoreOptions::default())
            .err()
            .unwrap()
            .to_string()
    });
    // In place of the tune file.
    let tune_dir = tmp.path().join("tune");
    make(&tune_dir, 1000, &[1], 1, 1);
    let tune = tune_file(&tune_dir);
    mkfifo(&tune);
    let d = tune_dir.clone();
    refused_quickly("the tune file", &tune, move || {
        RowStore::open(&d, StoreOptions::default())
            .err()
            .unwrap()
            .to_string()
    });
    let t = tune.clone();
    refused_quickly("Tuning::load", &tune, move || {
        Tuning::load(&t).unwrap_err().to_string()
    });
    // And tune never writes over it.
    let err = Tuning::default().save(&tune).unwrap_err().to_string();
    assert!(err.contains("FIFO") && err.contains("--force"), "{err}");
}

#[test]
fn tune_never_replaces_a_file_it_did_not_write() {
    let tmp = tempfile::tempdir().unwrap();
    let (dir, real, bytes) = linked_dir(tmp.path());
    std::fs::remove_file(dir.join("model.safetensors")).unwrap();
    let tune = dir.join("fetchahead-tune.json");
    std::os::unix::fs::symlink("../precious/real.safetensors", &tune).unwrap();
    let err = Tuning::default().save(&tune).unwrap_err();
    assert!(matches!(err, Error::WouldOverwrite { .. }), "{err}");
    assert_eq!(std::fs::read(&real).unwrap(), bytes);
    Tuning::default().save_with(&tune, true).unwrap();
    assert_eq!(
        std::fs::read(&real).unwrap(),
        bytes,
        "written through the link"
    );
    assert!(std::fs::symlink_metadata(&tune).unwrap().is_file());
    // A tune file of its own it replaces without asking.
    Tuning::default().save(&tune).unwrap();
}

// ---- case 7: layers of different rows ------------------------------------------------------

fn write_tensors(path: &Path, tensors: Vec<(&str, Dtype, Vec<usize>)>) {
    let data: Vec<Vec<u8>> = tensors
        .iter()
        .map(|(_, d, s)| vec![1u8; s.iter().product::<usize>() * d.bitsize() / 8])
        .collect();
    let views: Vec<_> = tensors
        .iter()
        .zip(&data)
        .map(|((n, d, s), bytes)| (*n, TensorView::new(*d, s.clone(), bytes).unwrap()))
        .collect();
    serialize_to_file(views, None, path).unwrap();
}

#[test]
fn layers_of_different_rows_are_refused_naming_each() {
    let tmp = tempfile::tempdir().unwrap();
    let file = tmp.path().join("t.safetensors");
    write_tensors(
        &file,
        vec![
            (
                "layers.1.engram.embed.weight",
                Dtype::F8_E4M3,
                vec![4096, 64],
            ),
            ("layers.1.engram.embed.scale", Dtype::F8_E8M0, vec![4096, 2]),
            (
                "layers.14.engram.embed.weight",
                Dtype::F8_E4M3,
                vec![2048, 64],
            ),
            (
                "layers.14.engram.embed.scale",
                Dtype::F8_E8M0,
                vec![2048, 2],
            ),
        ],
    );
    let err = TableLayout::open(&file).unwrap_err();
    assert!(matches!(&err, Error::LayerRowsDiffer { rows } if rows == &[(1, 4096), (14, 2048)]));
    let msg = err.to_string();
    assert!(
        msg.contains("layer 1: 4096 rows") && msg.contains("layer 14: 2048 rows"),
        "{msg}"
    );
    let (rc, _) = open_store(&file, 1);
    assert_eq!(rc, FETCHAHEAD_ERR_INVALID);
    assert!(
        last_error().contains("layer 14: 2048 rows"),
        "{}",
        last_error()
    );
}

// ---- case 8: messages that name what is at fault ---------------------------------------

/// Rewrites `file`'s header with `edit` applied to its JSON text.
fn edit_header(file: &Path, edit: impl Fn(String) -> String) {
    let bytes = std::fs::read(file).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let json = String::from_utf8(bytes[8..8 + n].to_vec()).unwrap();
    let edited = edit(json).into_bytes();
    let mut out = (edited.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(&edited);
    out.extend_from_slice(&bytes[8 + n..]);
    std::fs::write(file, out).unwrap();
}

#[test]
fn a_tensor_whose_shape_and_offsets_disagree_is_named() {
    let tmp = tempfile::tempdir().unwrap();
    let files = make(tmp.path(), 1000, &[1, 14], 1, 1);
    edit_header(&files[0], |j| j.replace("[1000,8]", "[1000,9]"));
    let msg = TableLayout::open(tmp.path()).unwrap_err().to_string();
    assert!(
        msg.contains("tensor layers.") && msg.contains("engram.embed.scale"),
        "{msg}"
    );
    assert!(
        !msg.contains("invalid shape, data type, or offset for tensor"),
        "{msg}"
    );
}

#[test]
fn a_missing_scale_is_named_not_its_neighbour() {
    let tmp = tempfile::tempdir().unwrap();
    let files = make(tmp.path(), 1000, &[1, 14], 1, 1);
    // Drop layer 1's scale from the header (its bytes stay, a gap before layer 14's).
    edit_header(&files[0], |j| {
        let v: serde_json::Value = serde_json::from_str(&j).unwrap();
        let mut m = v.as_object().unwrap().clone();
        m.remove("layers.1.engram.embed.scale").unwrap();
        serde_json::to_string(&m).unwrap()
    });
    match TableLayout::open(tmp.path()) {
        Err(Error::MissingTensor { tensor, file }) => {
            assert_eq!(tensor, "layers.1.engram.embed.scale");
            assert_eq!(file, files[0]);
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_short_read_says_where_the_file_ends() {
    let tmp = tempfile::tempdir().unwrap();
    let files = make(tmp.path(), 8192, &[1], 1, 2);
    let store = RowStore::open(tmp.path(), StoreOptions::default()).unwrap();
    let span = store.layout().layer(1).unwrap().weight.clone();
    // Cut the file well before the pages of row 8000.
    let cut = span.row_offset(4096);
    std::fs::OpenOptions::new()
        .write(true)
        .open(&files[0])
        .unwrap()
        .set_len(cut)
        .unwrap();
    store.evict_page_cache().unwrap();
    for path in [ReadPath::Preadv, ReadPath::Buffered] {
        let (mut w, mut s) = outputs(&store, 1);
        let msg = store
            .lookup_with(path, 1, &[8000], &mut w, &mut s)
            .unwrap_err()
            .to_string();
        assert!(
            msg.contains(&format!("the file is {cut} bytes now")),
            "{path}: {msg}"
        );
        assert!(!msg.contains("ended at"), "{path}: {msg}");
    }
}

#[test]
fn failed_lookups_through_the_c_abi_leave_their_own_message() {
    let mut table = ptr::null_mut();
    // SAFETY: `table` is writable.
    let rc = unsafe { fetchahead_open_memory_table(100, DIM as u32, 1, &mut table) };
    assert_eq!(rc, FETCHAHEAD_OK);
    let ids = [1i64, 2];
    let (mut w, mut s) = (vec![0u8; 2 * DIM], vec![0u8; 2 * DIM / 32]);
    let mut work = Work {
        table,
        ids: ids.as_ptr(),
        weights: w.as_mut_ptr(),
        scales: s.as_mut_ptr(),
        count: 2,
        status: -1,
    };
    // A failure first, whose message must not survive the next one.
    let bad = [500i64, 1];
    work.ids = bad.as_ptr();
    // SAFETY: `work` names an open table and buffers of 2 rows.
    unsafe { fetchahead_lookup(ptr::from_mut(&mut work).cast()) };
    assert_eq!(work.status, FETCHAHEAD_ERR_LOOKUP);
    assert!(last_error().contains("500"), "{}", last_error());
    assert!(table_lookup_error(table).contains("500"));
    // Null ids: a message of its own, on this thread and on the table.
    work.ids = ptr::null();
    work.status = -1;
    // SAFETY: a null `ids` is what is refused.
    unsafe { fetchahead_lookup(ptr::from_mut(&mut work).cast()) };
    assert_eq!(work.status, FETCHAHEAD_ERR_INVALID);
    assert!(last_error().contains("ids null"), "{}", last_error());
    assert!(
        table_lookup_error(table).contains("ids null"),
        "{}",
        table_lookup_error(table)
    );
    // A null table.
    work.ids = ids.as_ptr();
    work.table = ptr::null();
    work.status = -1;
    // SAFETY: a null table is what is refused.
    unsafe { fetchahead_lookup(ptr::from_mut(&mut work).cast()) };
    assert_eq!(work.status, FETCHAHEAD_ERR_INVALID);
    assert!(last_error().contains("work.table"), "{}", last_error());
    // A null work.
    // SAFETY: null is refused.
    unsafe { fetchahead_lookup(ptr::null_mut()) };
    assert!(last_error().contains("work"), "{}", last_error());
    // SAFETY: open, closed once.
    unsafe { fetchahead_table_close(table) };
}

// ---- the command line, end to end ------------------------------------------------------

/// The product's `fetchahead` binary, found at run time (`common::cli::binary`).
fn cli() -> Option<PathBuf> {
    common::cli::binary("fetchahead")
}

#[test]
fn the_cli_refuses_a_fifo_within_a_second() {
    let Some(bin) = cli() else { return };
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("fifo");
    std::fs::create_dir(&dir).unwrap();
    mkfifo(&dir.join("model.safetensors"));
    let d = dir.to_str().unwrap();
    for args in [&["inspect", d][..], &["tune", d], &["bench-io", d]] {
        let (code, err) = run_cli(&bin, args, &[], Duration::from_secs(1));
        assert_ne!(code, 0, "{args:?}");
        assert!(
            err.contains("FIFO") || err.contains("did not write"),
            "{args:?}: {err}"
        );
    }
}

#[test]
fn the_cli_rejects_what_a_user_gets_wrong() {
    let Some(bin) = cli() else { return };
    let tmp = tempfile::tempdir().unwrap();
    let table = tmp.path().join("t");
    make(&table, 4096, &[1], 1, 1);
    let t = table.to_str().unwrap();
    let d = tmp.path().join("d");
    let d = d.to_str().unwrap();
    let long = Duration::from_secs(60);
    for (args, want) in [
        (&["bench-io", t, "--iters", "0,0,0"][..], "--iters"),
        (&["bench-io", t, "--iters", "5,2"], "--iters"),
        (
            &["bench-io", t, "--baseline-reads", "0"],
            "--baseline-reads",
        ),
        (&["make-table", d, "--rows", "1000000000000000"], "free"),
    ] {
        let (code, err) = run_cli(&bin, args, &[], long);
        assert_ne!(code, 0, "{args:?}");
        assert!(err.contains(want), "{args:?}: {err}");
    }
    assert!(!Path::new(d).exists(), "a refused command wrote {d}");
    if fetchahead::kernels::gpu::Gpu::open(0).is_err() {
        let (code, err) = run_cli(&bin, &["check"], &[("FETCHAHEAD_REQUIRE_GPU", "1")], long);
        assert_ne!(
            code, 0,
            "check without a GPU under FETCHAHEAD_REQUIRE_GPU=1: {err}"
        );
    }
}

// ---- issue 21: options, messages and limits (items 4, 9-17) --------------------------------

/// Item 4: every option has one set of bounds, whichever way it arrives, and the error names it.
#[test]
fn issue21_item4_options_are_bounded_whichever_way_they_arrive() {
    let tmp = tempfile::tempdir().unwrap();
    let table = tmp.path().join("t");
    make(&table, 4096, &[1], 1, 1);
    let start = std::time::Instant::now();
    for (options, name) in [
        (
            StoreOptions {
                preadv_threads: 10_000,
                ..StoreOptions::default()
            },
            "preadv_threads",
        ),
        (
            StoreOptions {
                preadv_threads: 0,
                ..StoreOptions::default()
            },
            "preadv_threads",
        ),
        (
            StoreOptions {
                uring_depth: 0,
                ..StoreOptions::default()
            },
            "uring_depth",
        ),
        (
            StoreOptions {
                uring_depth: u32::MAX,
                ..StoreOptions::default()
            },
            "uring_depth",
        ),
        (
            StoreOptions {
                uring_rings: 1000,
                ..StoreOptions::default()
            },
            "uring_rings",
        ),
    ] {
        let e = match RowStore::open(&table, options.clone()) {
            Ok(_) => panic!("{options:?} opened"),
            Err(e) => e.to_string(),
        };
        assert!(e.contains(name), "{e}");
    }
    assert!(
        start.elapsed() < Duration::from_secs(5),
        "refusals took long"
    );
    // The environment's bounds are the same table's.
    for (var, value) in [
        ("FETCHAHEAD_PREADV_THREADS", "10000"),
        ("FETCHAHEAD_URING_DEPTH", "4294967295"),
        ("FETCHAHEAD_URING_DEPTH", "0"),
    ] {
        let e = StoreOptions::from_vars(|n| (n == var).then(|| value.to_string()))
            .unwrap_err()
            .to_string();
        assert!(e.contains(var) && e.contains("1 to"), "{e}");
    }
    let ok = StoreOptions::from_vars(|n| (n == "FETCHAHEAD_PREADV_THREADS").then(|| "1024".into()))
        .unwrap();
    assert!(ok.validate().is_ok());
    // And a flag's, named as the flag.
    let Some(bin) = cli() else { return };
    let t = table.to_str().unwrap();
    for depth in ["0", "5000"] {
        let (code, err) = run_cli(
            &bin,
            &["bench-io", t, "--uring-depth", depth],
            &[],
            Duration::from_secs(60),
        );
        assert_ne!(code, 0, "--uring-depth {depth}");
        assert!(
            err.contains("--uring-depth") && err.contains("1 to 4096"),
            "{err}"
        );
    }
}

/// Item 9: a shard rewritten in place (same size) under an open store fails the next lookup
/// instead of serving new weights beside stale resident scales.
#[test]
fn issue21_item9_a_shard_rewritten_in_place_fails_the_lookup() {
    use std::io::{Seek, SeekFrom, Write};
    let tmp = tempfile::tempdir().unwrap();
    let table = tmp.path().join("t");
    let shards = make(&table, 4096, &[1], 1, 1);
    let store = RowStore::open(&table, StoreOptions::default()).unwrap();
    let (mut w, mut s) = outputs(&store, 2);
    store.lookup(1, &[3, 4000], &mut w, &mut s).unwrap();
    // Past the filesystem's timestamp granularity, then new bytes over the weights, same size.
    std::thread::sleep(Duration::from_millis(50));
    let len = std::fs::metadata(&shards[0]).unwrap().len();
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .open(&shards[0])
        .unwrap();
    f.seek(SeekFrom::Start(len / 2)).unwrap();
    f.write_all(&vec![0x55u8; 64 << 10]).unwrap();
    f.sync_all().unwrap();
    drop(f);
    assert_eq!(std::fs::metadata(&shards[0]).unwrap().len(), len);
    for path in common::paths(&store) {
        let e = store
            .lookup_with(path, 1, &[5, 4001], &mut w, &mut s)
            .expect_err("a lookup over a rewritten shard succeeded");
        assert!(matches!(e, Error::ShardChanged { .. }), "{path}: {e}");
        assert!(e.to_string().contains("reopen"), "{e}");
    }
}

/// Item 10: a tune file that does not parse is a hint ignored with a warning; the table opens
/// and `tune --force` (save_with force) replaces it.
#[test]
fn issue21_item10_a_bad_tune_file_is_ignored_and_replaceable() {
    let tmp = tempfile::tempdir().unwrap();
    let table = tmp.path().join("t");
    make(&table, 4096, &[1], 1, 1);
    let tune = tune_file(&table);
    std::fs::write(&tune, b"{ not json").unwrap();
    let store = RowStore::open(&table, StoreOptions::default()).expect("a bad tune file");
    assert!(store.tuning().ranges.is_empty());
    assert!(Tuning::load(&tune).unwrap().is_none());
    // Not one tune wrote: replaced only with force.
    assert!(Tuning::default().save(&tune).is_err());
    let tuned = Tuning {
        ranges: vec![TunedRange {
            max_batch: u64::MAX,
            path: ReadPath::Preadv,
            p50_us: 1.0,
        }],
    };
    tuned.save_with(&tune, true).unwrap();
    assert_eq!(Tuning::load(&tune).unwrap(), Some(tuned));
}

/// Item 11: a `FETCHAHEAD_LOG` that is not a level logs at the default level and says so; a
/// `FETCHAHEAD_*` name nothing reads is warned about.
#[test]
fn issue21_item11_a_bad_log_level_or_unknown_variable_is_said() {
    for good in [
        "warn",
        "INFO",
        "off",
        "fetchahead=debug",
        "warn,fetchahead::store=trace",
    ] {
        assert!(fetchahead::logging::is_log_filter(good), "{good}");
    }
    for bad in ["", " ", "garbage", "wran", "9", "fetchahead=loud", "=warn"] {
        assert!(!fetchahead::logging::is_log_filter(bad), "{bad:?}");
    }
    assert_eq!(
        fetchahead::settings::unknown_env_names(
            [
                "FETCHAHEAD_CACHE_BYTE",
                "FETCHAHEAD_CACHE_BYTES",
                "FETCHAHEAD_LOG",
                "FETCHAHEAD_BENCH_ROWS",
                "PATH"
            ]
            .map(String::from)
        ),
        vec!["FETCHAHEAD_CACHE_BYTE".to_string()]
    );
    let Some(bin) = cli() else { return };
    for level in ["", "garbage", "wran", "9"] {
        let (code, err) = run_cli(
            &bin,
            &["kernels"],
            &[("FETCHAHEAD_LOG", level), ("FETCHAHEAD_CACHE_BYTE", "1G")],
            Duration::from_secs(60),
        );
        assert_eq!(code, 0, "{err}");
        assert!(
            err.contains("FETCHAHEAD_LOG") && err.contains("not a log level"),
            "FETCHAHEAD_LOG={level:?}: {err}"
        );
        assert!(err.contains("FETCHAHEAD_CACHE_BYTE is set"), "{err}");
    }
}

/// Item 14: one set of limits and one meaning of 0 rows across memory tables, the store and C.
#[test]
fn issue21_item14_one_set_of_limits_and_one_meaning_of_zero() {
    use fetchahead::prefetch::lookup::MemoryRows;
    for (rows, dim, name) in [(4, 1usize << 31, "dim"), (4, 8224, "dim"), (0, 256, "rows")] {
        let e = match MemoryRows::generate(rows, dim, 1) {
            Ok(_) => panic!("a memory table of {rows} rows of dim {dim}"),
            Err(e) => e.to_string(),
        };
        assert!(e.contains(name) && e.contains("want"), "{e}");
        let mut t = ptr::null_mut();
        // SAFETY: `t` is writable.
        let rc = unsafe { fetchahead_open_memory_table(rows, dim as u32, 1, &mut t) };
        assert_ne!(rc, FETCHAHEAD_OK, "C: {rows} rows of dim {dim}");
    }
    assert!(MemoryRows::generate(4, 8192, 1).is_ok());
    let tmp = tempfile::tempdir().unwrap();
    let table = tmp.path().join("t");
    make(&table, 4096, &[1], 1, 1);
    // 0 rows means to the end of the table, as in C.
    let store = RowStore::open(
        &table,
        StoreOptions {
            row_start: 96,
            num_rows: Some(0),
            ..StoreOptions::default()
        },
    )
    .unwrap();
    assert_eq!(store.row_range(), 96..4096);
}

/// Item 16: an unparsable index is called an index, not a safetensors header.
#[test]
fn issue21_item16_index_errors_name_the_index() {
    let tmp = tempfile::tempdir().unwrap();
    let table = tmp.path().join("t");
    make(&table, 4096, &[1], 1, 1);
    // A table assembled by hand (no manifest): its index is what lists its shards.
    std::fs::remove_file(table.join(fetchahead::store::make::MANIFEST)).unwrap();
    std::fs::write(table.join("model.safetensors.index.json"), b"[1, 2").unwrap();
    let e = match RowStore::open(&table, StoreOptions::default()) {
        Ok(_) => panic!("a garbage index opened"),
        Err(e) => e.to_string(),
    };
    assert!(
        e.contains("index") && !e.contains("safetensors header"),
        "{e}"
    );
}

/// Item 16: `layers.01` and `layers.+1` are reported as what they are, not as a missing
/// `layers.1`.
#[test]
fn issue21_item16_a_non_canonical_layer_number_is_named() {
    let tmp = tempfile::tempdir().unwrap();
    for layer in ["01", "+1"] {
        let file = tmp.path().join(format!("t{layer}.safetensors"));
        let weight = format!("layers.{layer}.engram.embed.weight");
        let scale = format!("layers.{layer}.engram.embed.scale");
        write_tensors(
            &file,
            vec![
                (&weight, Dtype::F8_E4M3, vec![64, 256]),
                (&scale, Dtype::U8, vec![64, 8]),
            ],
        );
        let e = match RowStore::open(&file, StoreOptions::default()) {
            Ok(_) => panic!("layers.{layer} opened"),
            Err(e) => e.to_string(),
        };
        assert!(
            e.contains(&format!("layers.{layer}.")) && !e.contains("is missing"),
            "{e}"
        );
    }
}

/// Item 16: a NUL in an index's file name does not cut the C message.
#[test]
fn issue21_item16_a_nul_in_an_index_file_name_does_not_cut_the_c_message() {
    let tmp = tempfile::tempdir().unwrap();
    let table = tmp.path().join("t");
    make(&table, 4096, &[1], 1, 1);
    // A table assembled by hand (no manifest): its index is what lists its shards.
    std::fs::remove_file(table.join(fetchahead::store::make::MANIFEST)).unwrap();
    let index = serde_json::json!({"weight_map": {
        "layers.1.engram.embed.weight": "a\u{0}tail.safetensors",
        "layers.1.engram.embed.scale": "a\u{0}tail.safetensors",
    }});
    std::fs::write(
        table.join("model.safetensors.index.json"),
        index.to_string(),
    )
    .unwrap();
    let (rc, _) = open_store(&table, 1);
    assert_eq!(rc, FETCHAHEAD_ERR_INVALID);
    let e = last_error();
    assert!(e.contains("tail.safetensors"), "{e}");
}

/// Item 16: a cache budget refused for the memory there is names the variable it came from.
#[test]
fn issue21_item16_a_refused_cache_budget_names_its_variable() {
    let e = StoreOptions::from_vars(|n| (n == "FETCHAHEAD_CACHE_BYTES").then(|| "1024T".into()))
        .unwrap_err()
        .to_string();
    assert!(e.contains("FETCHAHEAD_CACHE_BYTES=1024T"), "{e}");
    let e = StoreOptions {
        cache_bytes: 1 << 50,
        ..StoreOptions::default()
    }
    .validate()
    .unwrap_err()
    .to_string();
    assert!(e.contains("cache_bytes"), "{e}");
}

/// Item 17: `fetchahead_last_error` is cleared by a call that succeeds.
#[test]
fn issue21_item17_last_error_is_cleared_by_a_success() {
    let mut t = ptr::null_mut();
    // SAFETY: `t` is writable.
    let rc = unsafe { fetchahead_open_memory_table(16, 33, 1, &mut t) };
    assert_eq!(rc, FETCHAHEAD_ERR_INVALID);
    assert!(!last_error().is_empty());
    // SAFETY: as above.
    let rc = unsafe { fetchahead_open_memory_table(16, 256, 1, &mut t) };
    assert_eq!(rc, FETCHAHEAD_OK);
    assert_eq!(last_error(), "", "a stale message after a success");
    // SAFETY: `t` is a table just opened.
    unsafe { fetchahead_table_close(t) };
}

/// Item 17: `tune` checks that it can write its file before measuring anything.
#[test]
fn issue21_item17_tune_checks_its_file_before_measuring() {
    let Some(bin) = cli() else { return };
    let tmp = tempfile::tempdir().unwrap();
    let table = tmp.path().join("t");
    make(&table, 4096, &[1], 1, 1);
    std::fs::write(tune_file(&table), b"my notes").unwrap();
    let out = Command::new(&bin)
        .args(["tune", table.to_str().unwrap()])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stdout}");
    assert!(stderr.contains("--force"), "{stderr}");
    assert!(
        !stdout.contains("cold batches"),
        "tune measured before finding it cannot write:\n{stdout}"
    );
    assert_eq!(std::fs::read(tune_file(&table)).unwrap(), b"my notes");
}

/// Item 17: a table of another user is opened without O_NOATIME quietly (the kernel allows it
/// to the owner only), not with a warning on every open.
#[test]
fn issue21_item17_another_users_table_falls_back_from_noatime_quietly() {
    use std::os::unix::fs::PermissionsExt;
    in_child(
        "issue21_item17_another_users_table_falls_back_from_noatime_quietly",
        || {
            static WARNINGS: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());
            struct Capture;
            impl log::Log for Capture {
                fn enabled(&self, _: &log::Metadata<'_>) -> bool {
                    true
                }
                fn log(&self, r: &log::Record<'_>) {
                    if r.level() <= log::Level::Warn {
                        WARNINGS.lock().unwrap().push(r.args().to_string());
                    }
                }
                fn flush(&self) {}
            }
            log::set_logger(&Capture).unwrap();
            log::set_max_level(log::LevelFilter::Trace);
            let tmp = tempfile::tempdir().unwrap();
            std::fs::set_permissions(tmp.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
            let table = tmp.path().join("t");
            make(&table, 4096, &[1], 1, 1);
            // SAFETY: getuid has no preconditions.
            let me = unsafe { libc::getuid() };
            if me == 0 {
                // Root owns the files; become another user, as a shared model directory's
                // reader is (the effective capabilities go with the uid).
                // SAFETY: plain syscall.
                assert_eq!(unsafe { libc::seteuid(65534) }, 0, "seteuid(nobody)");
            } else {
                // Not root: the same case needs a file of another user; one is /etc/hostname
                // or similar, not a table. Run the check only as root.
                panic!("run this test as root (it needs a table owned by another user)");
            }
            // The case arises: the kernel refuses O_NOATIME on this table now.
            let shard = std::fs::read_dir(&table)
                .unwrap()
                .map(|e| e.unwrap().path())
                .find(|p| p.extension().is_some_and(|x| x == "safetensors"))
                .unwrap();
            let refused = {
                use std::os::unix::fs::OpenOptionsExt;
                std::fs::OpenOptions::new()
                    .read(true)
                    .custom_flags(libc::O_NOATIME)
                    .open(&shard)
                    .unwrap_err()
            };
            assert_eq!(refused.raw_os_error(), Some(libc::EPERM), "{refused}");
            for _ in 0..2 {
                RowStore::open(&table, StoreOptions::default()).unwrap();
            }
            let warnings = WARNINGS.lock().unwrap();
            assert!(
                !warnings.iter().any(|w| w.contains("O_NOATIME")),
                "{warnings:?}"
            );
        },
    );
}

/// Item 17: every kernel the PTX holds is listed with a description.
#[test]
fn issue21_item17_every_kernel_has_a_description() {
    for built in fetchahead::ptx::BUILT {
        for entry in fetchahead::ptx::entries(built.text) {
            let about = fetchahead::device_abi::all_kernels()
                .find(|k| k.name == entry)
                .map_or("", |k| k.about);
            assert!(
                !about.is_empty(),
                "{}: {entry} has no description",
                built.arch
            );
        }
    }
}

/// Item 17: `check --rows 0` is refused without a GPU, before any device is opened.
#[test]
fn issue21_item17_check_rows_zero_is_refused_without_a_gpu() {
    let Some(bin) = cli() else { return };
    for args in [&["check", "--rows", "0"][..], &["check", "--n", "0"]] {
        let (code, err) = run_cli(&bin, args, &[], Duration::from_secs(60));
        assert_ne!(code, 0, "{args:?}: {err}");
        assert!(err.contains(args[1]), "{args:?}: {err}");
    }
}

// ---- issue 21: writers that can prove what they own, readers that never serve a torn table ----

/// A user's own table file (a real safetensors shard of `rows` rows, not the one fetchahead
/// writes into the directory under test), and its bytes.
fn users_shard(root: &Path, rows: u64, shards: usize, name: &str) -> (PathBuf, Vec<u8>) {
    let dir = root.join(format!("user-{rows}-{shards}"));
    if !dir.exists() {
        write_table(
            &dir,
            &TableSpec {
                seed: 77,
                ..spec(rows, shards)
            },
            |_| {},
        )
        .unwrap();
    }
    let path = dir.join(name);
    let bytes = std::fs::read(&path).unwrap();
    (path, bytes)
}

fn seeded(rows: u64, shards: usize, seed: u64) -> TableSpec {
    TableSpec {
        seed,
        ..spec(rows, shards)
    }
}

// issue 21, item 1: a listed name is no proof of ownership.
#[test]
fn a_users_file_copied_over_a_table_survives_a_rewrite_that_names_it() {
    let tmp = tempfile::tempdir().unwrap();
    let a = tmp.path().join("a");
    write_table(&a, &spec(4096, 1), |_| {}).unwrap();
    let (theirs, bytes) = users_shard(tmp.path(), 16384, 1, "model.safetensors");
    std::fs::copy(&theirs, a.join("model.safetensors")).unwrap();
    let err = write_table(&a, &seeded(4096, 1, 3), |_| {}).unwrap_err();
    let msg = err.to_string();
    assert!(
        matches!(err, Error::WouldOverwrite { .. })
            && msg.contains("model.safetensors")
            && msg.contains("not the file fetchahead wrote")
            && msg.contains("size")
            && msg.contains("--force"),
        "{msg}"
    );
    assert_eq!(std::fs::read(a.join("model.safetensors")).unwrap(), bytes);

    // Two shards, the second the user's: a one-shard rewrite is refused, both shards stay.
    let b = tmp.path().join("b");
    write_table(&b, &spec(4096, 2), |_| {}).unwrap();
    let first = std::fs::read(b.join("model-00001-of-00002.safetensors")).unwrap();
    let (theirs, bytes) = users_shard(tmp.path(), 16384, 2, "model-00002-of-00002.safetensors");
    std::fs::copy(&theirs, b.join("model-00002-of-00002.safetensors")).unwrap();
    let msg = write_table(&b, &seeded(4096, 1, 3), |_| {})
        .unwrap_err()
        .to_string();
    assert!(msg.contains("model-00002-of-00002.safetensors"), "{msg}");
    assert_eq!(
        std::fs::read(b.join("model-00001-of-00002.safetensors")).unwrap(),
        first
    );
    assert_eq!(
        std::fs::read(b.join("model-00002-of-00002.safetensors")).unwrap(),
        bytes
    );

    // The same through the demo, over its own table: lab/tests/demo_cli.rs.
}

/// A manifest as fetchahead wrote it before issue 21: names, no records.
fn strip_records(dir: &Path) {
    let path = dir.join(MANIFEST);
    let mut m: serde_json::Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    m.as_object_mut().unwrap().remove("written").unwrap();
    std::fs::write(&path, serde_json::to_vec_pretty(&m).unwrap()).unwrap();
}

// issue 21, item 1: tables written before the records existed stay the writer's own, proven
// against their spec (every shard's length and header, the index's bytes).
#[test]
fn a_table_whose_manifest_predates_the_records_is_proven_against_its_spec() {
    let tmp = tempfile::tempdir().unwrap();
    let t = tmp.path().join("t");
    write_table(&t, &spec(2048, 2), |_| {}).unwrap();
    strip_records(&t);
    assert!(matches!(dir_state(&t).unwrap(), DirState::Ours(m) if m.written.is_empty()));
    assert_eq!(TableLayout::open(&t).unwrap().rows(), 2048);
    write_table(&t, &spec(1024, 1), |_| {}).unwrap();
    assert_eq!(names(&t), set(&["model.safetensors", MANIFEST]));
    // A shard that is not what the old manifest's spec generates is not the writer's.
    strip_records(&t);
    let (theirs, bytes) = users_shard(tmp.path(), 4096, 1, "model.safetensors");
    std::fs::copy(&theirs, t.join("model.safetensors")).unwrap();
    let msg = write_table(&t, &spec(1024, 2), |_| {})
        .unwrap_err()
        .to_string();
    assert!(
        msg.contains("model.safetensors") && msg.contains("not the file fetchahead wrote"),
        "{msg}"
    );
    assert_eq!(std::fs::read(t.join("model.safetensors")).unwrap(), bytes);
}

// issue 21, item 2: --force replaces the new table's names and the old table's own files only.
#[test]
fn force_keeps_files_the_new_table_does_not_write_and_lists_what_it_replaces() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path().join("d");
    std::fs::create_dir(&d).unwrap();
    let lora: Vec<u8> = (0..5000u32).map(|i| (i % 253) as u8).collect();
    std::fs::write(d.join("my-lora.safetensors"), &lora).unwrap();
    std::fs::write(d.join("README.txt"), b"my notes").unwrap();
    let msg = write_table(&d, &spec(4096, 1), |_| {})
        .unwrap_err()
        .to_string();
    assert!(
        msg.contains("my-lora.safetensors")
            && msg.contains("README.txt")
            && msg.contains("--force"),
        "{msg}"
    );
    let forced = WriteOptions {
        force: true,
        ..WriteOptions::default()
    };
    write_table_with(&d, &spec(4096, 1), &forced, |_| {}).unwrap();
    assert_eq!(std::fs::read(d.join("my-lora.safetensors")).unwrap(), lora);
    assert_eq!(std::fs::read(d.join("README.txt")).unwrap(), b"my notes");
    // The table opens as its manifest says, whatever else is beside it.
    assert_eq!(TableLayout::open(&d).unwrap().rows(), 4096);
    // A forced rewrite to shards removes the old table's own shard, and nothing of the user's.
    write_table_with(&d, &spec(2048, 2), &forced, |_| {}).unwrap();
    assert!(!d.join("model.safetensors").exists());
    assert_eq!(std::fs::read(d.join("my-lora.safetensors")).unwrap(), lora);
    assert_eq!(std::fs::read(d.join("README.txt")).unwrap(), b"my notes");
    assert_eq!(TableLayout::open(&d).unwrap().rows(), 2048);

    // From the command line, what --force replaces is said before it is replaced.
    let Some(bin) = cli() else { return };
    let e = tmp.path().join("e");
    std::fs::create_dir(&e).unwrap();
    let (theirs, _) = users_shard(tmp.path(), 1024, 1, "model.safetensors");
    std::fs::copy(&theirs, e.join("model.safetensors")).unwrap();
    std::fs::write(e.join("my-lora.safetensors"), &lora).unwrap();
    let (code, err) = run_cli(
        &bin,
        &[
            "make-table",
            e.to_str().unwrap(),
            "--rows",
            "4096",
            "--force",
        ],
        &[],
        Duration::from_secs(60),
    );
    assert_eq!(code, 0, "{err}");
    assert!(
        err.contains("--force: replacing model.safetensors") && !err.contains("my-lora"),
        "{err}"
    );
    assert_eq!(std::fs::read(e.join("my-lora.safetensors")).unwrap(), lora);
    assert_eq!(TableLayout::open(&e).unwrap().rows(), 4096);
}

/// Adds `name` to the manifest in `dir`, with a record forged from the file as it is now.
fn claim_in_manifest(dir: &Path, name: &str, file: &Path) {
    use std::os::unix::fs::MetadataExt;
    let path = dir.join(MANIFEST);
    let mut m: serde_json::Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    let meta = std::fs::metadata(file).unwrap();
    m["files"].as_array_mut().unwrap().push(name.into());
    // Manifests before issue 21 have no records: the name alone claimed the file.
    if let Some(written) = m.get_mut("written").and_then(|w| w.as_array_mut()) {
        written.push(serde_json::json!({
            "name": name,
            "size": meta.len(),
            "inode": meta.ino(),
            "mtime_ns": meta.mtime() * 1_000_000_000 + meta.mtime_nsec(),
            "head_len": 0,
            "head_fnv1a64": "cbf29ce484222325",
        }));
    }
    std::fs::write(&path, serde_json::to_vec_pretty(&m).unwrap()).unwrap();
}

// issue 21, item 3: a hand-edited manifest never causes a deletion outside the table's files.
#[test]
fn a_manifest_listing_other_files_deletes_none_of_them() {
    let tmp = tempfile::tempdir().unwrap();
    let t = tmp.path().join("t");
    write_table(&t, &spec(4096, 1), |_| {}).unwrap();
    std::fs::write(t.join("notes.txt"), b"mine").unwrap();
    claim_in_manifest(&t, "notes.txt", &t.join("notes.txt"));
    // Unforced: refused, naming it; forced: written, and notes.txt stays.
    let outcome = write_table(&t, &spec(2048, 2), |_| {});
    assert_eq!(std::fs::read(t.join("notes.txt")).unwrap(), b"mine");
    let msg = outcome.unwrap_err().to_string();
    assert!(msg.contains("notes.txt (4 bytes)"), "{msg}");
    let forced = WriteOptions {
        force: true,
        ..WriteOptions::default()
    };
    write_table_with(&t, &spec(2048, 2), &forced, |_| {}).unwrap();
    assert_eq!(std::fs::read(t.join("notes.txt")).unwrap(), b"mine");
    assert!(
        !t.join("model.safetensors").exists(),
        "the old shard is gone"
    );

    // A name outside the directory: the table is rewritten, the file outside untouched.
    let outside = tmp.path().join("x");
    std::fs::write(&outside, b"outside").unwrap();
    claim_in_manifest(&t, "../x", &outside);
    write_table_with(&t, &spec(1024, 1), &forced, |_| {}).unwrap();
    assert_eq!(std::fs::read(&outside).unwrap(), b"outside");
    assert_eq!(std::fs::read(t.join("notes.txt")).unwrap(), b"mine");
    assert_eq!(TableLayout::open(&t).unwrap().rows(), 1024);
}

/// Rows 0..64 of layers 1 and 14 of the table in `dir`, each layer's weights then scales.
fn table_rows(dir: &Path) -> fetchahead::Result<Vec<Vec<u8>>> {
    let store = RowStore::open(dir, StoreOptions::default())?;
    let ids: Vec<i64> = (0..64).collect();
    let mut out = Vec::new();
    for layer in [1, 14] {
        let mut w = vec![0u8; ids.len() * DIM];
        let mut s = vec![0u8; ids.len() * DIM / 32];
        store.lookup(layer, &ids, &mut w, &mut s)?;
        w.extend_from_slice(&s);
        out.push(w);
    }
    Ok(out)
}

const KILL_AT_ENV: &str = "FETCHAHEAD_TEST_KILL_AT";

// issue 21, item 5: a rewrite killed between its renames never opens as a mixed table.
#[test]
fn a_rewrite_killed_at_any_step_opens_as_the_old_or_new_table_or_is_refused() {
    const NAME: &str = "a_rewrite_killed_at_any_step_opens_as_the_old_or_new_table_or_is_refused";
    if std::env::var(CHILD_ENV).as_deref() == Ok(NAME) {
        let dir = PathBuf::from(std::env::var("FETCHAHEAD_TEST_DIR").unwrap());
        let kill_at: usize = std::env::var(KILL_AT_ENV).unwrap().parse().unwrap();
        let shards: usize = std::env::var("FETCHAHEAD_TEST_SHARDS")
            .unwrap()
            .parse()
            .unwrap();
        let mut steps = 0;
        fetchahead::store::make::write_table_with_steps(
            &dir,
            &seeded(1024, shards, 3),
            &WriteOptions::default(),
            |step| {
                if matches!(step, fetchahead::store::make::WriteStep::Data(_)) {
                    return;
                }
                if steps == kill_at {
                    // SAFETY: kills this child process, as a user's kill -9 (or a power cut) would.
                    unsafe { libc::kill(libc::getpid(), libc::SIGKILL) };
                }
                steps += 1;
            },
        )
        .unwrap();
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let old_ref = tmp.path().join("old-ref");
    write_table(&old_ref, &seeded(1024, 2, 1), |_| {}).unwrap();
    let old_rows = table_rows(&old_ref).unwrap();
    for new_shards in [2, 3] {
        let new_ref = tmp.path().join(format!("new-ref-{new_shards}"));
        write_table(&new_ref, &seeded(1024, new_shards, 3), |_| {}).unwrap();
        let new_rows = table_rows(&new_ref).unwrap();
        let (mut refused, mut old, mut new) = (0, 0, 0);
        for kill_at in 0.. {
            let dir = tmp.path().join(format!("t-{new_shards}-{kill_at}"));
            write_table(&dir, &seeded(1024, 2, 1), |_| {}).unwrap();
            let exe = std::env::current_exe().unwrap();
            let status = Command::new(exe)
                .args([NAME, "--exact", "--nocapture"])
                .env(CHILD_ENV, NAME)
                .env("FETCHAHEAD_TEST_DIR", &dir)
                .env(KILL_AT_ENV, kill_at.to_string())
                .env("FETCHAHEAD_TEST_SHARDS", new_shards.to_string())
                .output()
                .unwrap();
            let finished = status.status.success();
            assert!(
                finished || status.status.signal() == Some(libc::SIGKILL),
                "{}",
                String::from_utf8_lossy(&status.stderr)
            );
            match table_rows(&dir) {
                Ok(rows) if rows == old_rows => old += 1,
                Ok(rows) if rows == new_rows => new += 1,
                Ok(rows) => panic!(
                    "killed after step {kill_at}: a mixed table opened (layer 1 {}, layer 14 {})",
                    if rows[0] == new_rows[0] { "new" } else { "old" },
                    if rows[1] == new_rows[1] { "new" } else { "old" },
                ),
                Err(e) => {
                    let msg = e.to_string();
                    assert!(
                        msg.contains("did not finish")
                            && msg.contains("fetchahead make-table")
                            && msg.contains("--seed 3"),
                        "{msg}"
                    );
                    // The C ABI refuses it too, with the same message.
                    let (rc, table) = open_store(&dir, 1);
                    assert!(rc != 0 && table.is_null(), "the C ABI opened it");
                    assert!(last_error().contains("did not finish"), "{}", last_error());
                    // So does `fetchahead inspect`.
                    if refused == 0
                        && let Some(bin) = cli()
                    {
                        let (code, err) = run_cli(
                            &bin,
                            &["inspect", dir.to_str().unwrap()],
                            &[],
                            Duration::from_secs(30),
                        );
                        assert!(code != 0 && err.contains("did not finish"), "{err}");
                    }
                    // Opening one of its shards by name: refused as well.
                    let shard = dir.join("model-00001-of-00002.safetensors");
                    if shard.exists() {
                        assert!(RowStore::open(&shard, StoreOptions::default()).is_err());
                    }
                    refused += 1;
                }
            }
            // The next writer proves the killed one's files its own, and finishes the table.
            write_table(&dir, &seeded(1024, new_shards, 3), |_| {}).unwrap();
            assert_eq!(table_rows(&dir).unwrap(), new_rows);
            assert_eq!(
                dir_state(&dir).map(|s| matches!(s, DirState::Ours(_))).ok(),
                Some(true)
            );
            if finished {
                break;
            }
        }
        // Killed before the manifest says writing: the old table; after it says complete, or
        // not killed: the new one; in between, refused.
        let between = if new_shards == 2 { 4 } else { 7 };
        assert!(
            old == 1 && refused == between && new == 2,
            "{old} old, {refused} refused, {new} new"
        );
    }
}

// issue 21, item 6: two writers at once.
#[test]
fn a_second_writer_fails_at_once_naming_the_first_ones_pid() {
    const NAME: &str = "a_second_writer_fails_at_once_naming_the_first_ones_pid";
    if std::env::var(CHILD_ENV).as_deref() == Ok(NAME) {
        let dir = PathBuf::from(std::env::var("FETCHAHEAD_TEST_DIR").unwrap());
        let started = dir.with_extension("started");
        let go = dir.with_extension("go");
        fetchahead::store::make::write_table_with_steps(
            &dir,
            &spec(4096, 1),
            &WriteOptions::default(),
            |step| {
                if step == fetchahead::store::make::WriteStep::Checked {
                    std::fs::write(&started, b"").unwrap();
                    let t = std::time::Instant::now();
                    while !go.exists() && t.elapsed() < Duration::from_secs(60) {
                        std::thread::sleep(Duration::from_millis(5));
                    }
                }
            },
        )
        .unwrap();
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("t");
    let exe = std::env::current_exe().unwrap();
    let child = Command::new(exe)
        .args([NAME, "--exact", "--nocapture"])
        .env(CHILD_ENV, NAME)
        .env("FETCHAHEAD_TEST_DIR", &dir)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let t = std::time::Instant::now();
    while !dir.with_extension("started").exists() {
        assert!(
            t.elapsed() < Duration::from_secs(60),
            "the first writer never started"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    let pid = format!("pid {}", child.id());
    let t = std::time::Instant::now();
    let err = write_table(&dir, &spec(2048, 1), |_| {}).unwrap_err();
    assert!(
        t.elapsed() < Duration::from_secs(1),
        "waited {:?}",
        t.elapsed()
    );
    let msg = err.to_string();
    assert!(
        matches!(err, Error::WouldOverwrite { .. }) && msg.contains(&pid),
        "{msg}"
    );
    if let Some(bin) = cli() {
        let (code, err) = run_cli(
            &bin,
            &["make-table", dir.to_str().unwrap(), "--rows", "1024"],
            &[],
            Duration::from_secs(5),
        );
        assert!(code != 0 && err.contains(&pid), "{err}");
    }
    std::fs::write(dir.with_extension("go"), b"").unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("1 passed"));
    assert_eq!(TableLayout::open(&dir).unwrap().rows(), 4096);
    assert_eq!(names(&dir), set(&["model.safetensors", MANIFEST]));
}

// issue 21, item 17: a killed writer's temporary files are removed at the next open too.
#[test]
fn stale_temporaries_of_a_dead_writer_are_removed_at_the_next_open() {
    let tmp = tempfile::tempdir().unwrap();
    let t = tmp.path().join("t");
    write_table(&t, &spec(1024, 1), |_| {}).unwrap();
    let mut gone = Command::new("true").spawn().unwrap();
    let dead = gone.id();
    gone.wait().unwrap();
    let mut running = Command::new("sleep").arg("60").spawn().unwrap();
    let stale = t.join(format!(".fetchahead-tmp-{dead}-0-model.safetensors"));
    let live = t.join(format!(
        ".fetchahead-tmp-{}-0-model.safetensors",
        running.id()
    ));
    std::fs::write(&stale, vec![7u8; 1 << 20]).unwrap();
    std::fs::write(&live, b"in progress").unwrap();
    let store = RowStore::open(&t, StoreOptions::default()).unwrap();
    drop(store);
    let removed = !stale.exists();
    let kept = live.exists();
    let _ = running.kill();
    let _ = running.wait();
    assert!(removed, "a dead writer's temporary file is still there");
    assert!(kept, "a running writer's temporary file was removed");
    assert_eq!(
        names(&t),
        set(&[
            "model.safetensors",
            MANIFEST,
            live.file_name().unwrap().to_str().unwrap()
        ])
    );
    // And it says so.
    let Some(bin) = cli() else { return };
    std::fs::write(&stale, vec![7u8; 1 << 20]).unwrap();
    let (code, err) = run_cli(
        &bin,
        &["inspect", t.to_str().unwrap()],
        &[],
        Duration::from_secs(30),
    );
    assert_eq!(code, 0, "{err}");
    let name = stale.file_name().unwrap().to_str().unwrap();
    assert!(
        err.contains("removed") && err.contains(name) && err.contains("1048576 bytes"),
        "{err}"
    );
    assert!(!stale.exists());
}

// issue 21, item 16: texts that misled.
#[test]
fn a_garbage_manifest_is_named_as_such() {
    let tmp = tempfile::tempdir().unwrap();
    let t = tmp.path().join("t");
    write_table(&t, &spec(1024, 1), |_| {}).unwrap();
    std::fs::write(t.join(MANIFEST), b"{ this is not json").unwrap();
    let msg = write_table(&t, &spec(2048, 1), |_| {})
        .unwrap_err()
        .to_string();
    assert!(
        msg.contains(MANIFEST)
            && msg.contains("not a manifest fetchahead wrote")
            && !msg.contains("files fetchahead did not write"),
        "{msg}"
    );
    let msg = TableLayout::open(&t).unwrap_err().to_string();
    assert!(
        msg.contains(MANIFEST) && msg.contains("not a manifest"),
        "{msg}"
    );
}

#[test]
fn a_dangling_symlink_directory_is_named() {
    let tmp = tempfile::tempdir().unwrap();
    let link = tmp.path().join("link");
    std::os::unix::fs::symlink(tmp.path().join("nowhere"), &link).unwrap();
    let msg = write_table(&link, &spec(1024, 1), |_| {})
        .unwrap_err()
        .to_string();
    assert!(
        msg.contains("is a symlink to")
            && msg.contains("does not exist")
            && !msg.contains("statvfs"),
        "{msg}"
    );
}

/// On a read-only filesystem (a tmpfs remounted read-only, where allowed), the error names the
/// table's directory or file, never a hidden temporary name.
#[test]
fn read_only_errors_name_the_target() {
    let tmp = tempfile::tempdir().unwrap();
    let mnt = tmp.path().join("ro");
    std::fs::create_dir(&mnt).unwrap();
    let mounted = Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=16m", "tmpfs"])
        .arg(&mnt)
        .output();
    if !mounted.as_ref().is_ok_and(|o| o.status.success()) {
        eprintln!("SKIP read_only_errors_name_the_target: mount -t tmpfs not allowed here");
        return;
    }
    let dir = mnt.join("t");
    write_table(&dir, &spec(1024, 1), |_| {}).unwrap();
    let ro = Command::new("mount")
        .args(["-o", "remount,ro"])
        .arg(&mnt)
        .status();
    let outcome = write_table(&dir, &seeded(1024, 1, 3), |_| {});
    let _ = Command::new("umount").arg(&mnt).status();
    assert!(ro.is_ok_and(|s| s.success()), "remount read-only failed");
    let msg = outcome.unwrap_err().to_string();
    assert!(
        msg.contains(dir.to_str().unwrap())
            && !msg.contains(".fetchahead-tmp")
            && msg.contains("Read-only"),
        "{msg}"
    );
}

// Issue 21 item 18 / issue 25 item 5: memory honesty. The row cache's real resident bytes (its
// rows, their allocation headers and its own index, entries and ghosts) stay within its budget.
#[path = "common/counting_alloc.rs"]
mod counting_alloc;

#[test]
fn row_cache_resident_bytes_stay_within_the_budget() {
    use fetchahead::store::replay_row_cache_then;
    use fetchahead::store::zipf::ZipfRows;
    // Zipf s = 0.8 over 400k rows: far more distinct rows than the budget holds, so the cache
    // fills, evicts and remembers ghosts, as under a long replay.
    let mut z = ZipfRows::new(0..400_000, 1, 0.8, 25).expect("zipf");
    let batches = z.batches(400, 2048);
    for budget in [1u64 << 20, 3 << 20, 4 << 20, 11 << 20, 16 << 20] {
        let before = counting_alloc::live_bytes();
        let (count, resident) = replay_row_cache_then(budget, DIM, &batches, 200, || {
            counting_alloc::live_bytes() - before
        });
        assert!(count.hits > 0, "the replay hit nothing: {count:?}");
        eprintln!(
            "budget {budget} B: {resident} B resident ({:.3} x)",
            resident as f64 / budget as f64
        );
        assert!(
            resident <= budget as i64,
            "budget {budget} B: the cache keeps {resident} B resident ({:.3} x the budget)",
            resident as f64 / budget as f64
        );
        // And the charge is what the cache holds: not a budget mostly left empty.
        assert!(
            resident as f64 >= 0.85 * budget as f64,
            "budget {budget} B: only {resident} B resident"
        );
    }
}
