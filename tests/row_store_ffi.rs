//! The row store behind the prefetcher's lookup trait and the C ABI: `fetchahead_open_store`
//! and the host-function entry `fetchahead_lookup` return the file's bytes, and fail with
//! status codes and messages an engine can act on.
mod common;

use std::ffi::{CStr, CString, c_char};
use std::ptr;
use std::sync::Arc;

use common::{Reference, make, random_ids};
use fetchahead::Error;
use fetchahead::ffi::*;
use fetchahead::row_lookup::RowLookup;
use fetchahead::store::{LayerRows, RowStore, StoreOptions};

fn last_error() -> String {
    let mut buf = [0 as c_char; 1024];
    // SAFETY: `buf` is writable for its length.
    unsafe { fetchahead_last_error(buf.as_mut_ptr(), buf.len()) };
    // SAFETY: fetchahead_last_error NUL-terminates what it writes.
    unsafe { CStr::from_ptr(buf.as_ptr()) }
        .to_string_lossy()
        .into_owned()
}

fn open_store(dir: &std::path::Path, layer: u32, start: u64, n: u64) -> (i32, *mut TableHandle) {
    let path = CString::new(dir.as_os_str().as_encoded_bytes()).unwrap();
    let mut table = ptr::null_mut();
    // SAFETY: `path` is NUL-terminated and `table` writable.
    let rc = unsafe { fetchahead_open_store(path.as_ptr(), layer, start, n, &mut table) };
    (rc, table)
}

/// Runs the host-function entry on `ids`; returns its status and the rows.
fn host_lookup(table: *const TableHandle, ids: &[i64], dim: usize) -> (i32, Vec<u8>, Vec<u8>) {
    let (mut w, mut s) = (
        vec![0xa5u8; ids.len() * dim],
        vec![0xa5u8; ids.len() * dim / 32],
    );
    let mut work = Work {
        table,
        ids: ids.as_ptr(),
        weights: w.as_mut_ptr(),
        scales: s.as_mut_ptr(),
        count: ids.len() as u64,
        status: -1,
    };
    // SAFETY: `work` names an open table and buffers of `count` rows.
    unsafe { fetchahead_lookup(ptr::from_mut(&mut work).cast()) };
    (work.status, w, s)
}

#[test]
fn layer_rows_read_one_layer_of_the_store() {
    let dir = tempfile::tempdir().unwrap();
    make(dir.path(), 3000, &[1, 14], 2, 3);
    let reference = Reference::load(dir.path());
    let store = Arc::new(RowStore::open(dir.path(), StoreOptions::default()).unwrap());
    let rows = LayerRows::new(store.clone(), 14).unwrap();
    assert_eq!(rows.dim(), 256);
    let ids = random_ids(0..3000, 100, 5);
    let (mut w, mut s) = (vec![0u8; 100 * 256], vec![0u8; 100 * 8]);
    rows.lookup(&ids, &mut w, &mut s).unwrap();
    assert!((w, s) == reference.expect(14, &ids));
    assert!(matches!(
        LayerRows::new(store, 2),
        Err(Error::NoSuchLayer { layer: 2, .. })
    ));
}

#[test]
fn the_c_abi_opens_a_store_and_looks_up_its_rows() {
    let dir = tempfile::tempdir().unwrap();
    make(dir.path(), 3000, &[1, 14], 1, 4);
    let reference = Reference::load(dir.path());
    let (rc, table) = open_store(dir.path(), 1, 1000, 1000);
    assert_eq!(rc, FETCHAHEAD_OK, "{}", last_error());
    // SAFETY: an open table.
    assert_eq!(unsafe { fetchahead_table_dim(table) }, 256);
    let ids = random_ids(1000..2000, 72, 9);
    let (status, w, s) = host_lookup(table, &ids, 256);
    assert_eq!(status, FETCHAHEAD_OK);
    assert!((w, s) == reference.expect(1, &ids));
    // A row outside the rank's range: a lookup error, rows zero-filled.
    let (status, w, s) = host_lookup(table, &[1500, 2000], 256);
    assert_eq!(status, FETCHAHEAD_ERR_LOOKUP);
    assert!(w.iter().chain(&s).all(|&b| b == 0));
    // SAFETY: open, closed once.
    unsafe { fetchahead_table_close(table) };
}

#[test]
fn the_c_abi_names_what_is_wrong_with_a_table() {
    let dir = tempfile::tempdir().unwrap();
    let files = make(dir.path(), 1000, &[1], 1, 4);
    let (rc, table) = open_store(dir.path(), 7, 0, 0);
    assert_eq!((rc, table.is_null()), (FETCHAHEAD_ERR_INVALID, true));
    assert!(last_error().contains("layer 7"), "{}", last_error());
    let len = std::fs::metadata(&files[0]).unwrap().len();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&files[0])
        .unwrap()
        .set_len(len - 10)
        .unwrap();
    let (rc, _) = open_store(dir.path(), 1, 0, 0);
    assert_eq!(rc, FETCHAHEAD_ERR_INVALID);
    let message = last_error();
    assert!(
        message.contains("model.safetensors") && message.contains("layers.1.engram.embed.scale"),
        "{message}"
    );
    // SAFETY: a null `dir` is refused, not read.
    let rc = unsafe { fetchahead_open_store(ptr::null(), 1, 0, 0, &mut ptr::null_mut()) };
    assert_eq!(rc, FETCHAHEAD_ERR_INVALID);
}
