//! A warm lookup allocates nothing on the calling thread: it may run inside a CUDA host-function
//! callback.
mod common;
#[path = "common/counting_alloc.rs"]
mod counting_alloc;

use common::{make, open, paths, random_ids};
use counting_alloc::allocations;
use fetchahead::store::{ReadPath, StoreOptions};

#[test]
fn warm_lookups_do_not_allocate() {
    let dir = tempfile::tempdir().unwrap();
    make(dir.path(), 20000, &[1], 1, 4);
    let store = open(dir.path(), StoreOptions::default());
    let ids = random_ids(0..20000, 4096, 1);
    let (mut w, mut s) = (
        vec![0u8; ids.len() * store.dim()],
        vec![0u8; ids.len() * store.dim() / 32],
    );
    // The single-threaded paths; the preadv pool's threads are rayon's to manage.
    for path in paths(&store).into_iter().filter(|&p| p != ReadPath::Preadv) {
        // The first lookups size the scratch; the next ones must reuse it.
        for _ in 0..2 {
            store.lookup_with(path, 1, &ids, &mut w, &mut s).unwrap();
        }
        let before = allocations();
        for n in [72, 4096, 1] {
            store
                .lookup_with(path, 1, &ids[..n], &mut w[..n * 256], &mut s[..n * 8])
                .unwrap();
        }
        let allocated = allocations() - before;
        assert_eq!(
            allocated, 0,
            "{path}: {allocated} allocations in three warm lookups"
        );
    }
}

#[test]
fn the_counter_counts_cache_inserts() {
    // Cache inserts allocate (one Arc per missed row): this shows the counter above can fail.
    let dir = tempfile::tempdir().unwrap();
    make(dir.path(), 3000, &[1], 1, 4);
    let store = open(
        dir.path(),
        StoreOptions {
            cache_bytes: 1 << 20,
            ..Default::default()
        },
    );
    let ids = random_ids(0..3000, 72, 2);
    let (mut w, mut s) = (vec![0u8; 72 * 256], vec![0u8; 72 * 8]);
    let before = allocations();
    store.lookup(1, &ids, &mut w, &mut s).unwrap();
    assert!(allocations() > before);
}
