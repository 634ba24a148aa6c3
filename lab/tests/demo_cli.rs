//! The demo's command line as a careless user runs it (issue 12's cases, for the lab's binary):
//! it refuses a FIFO where its table should be within a second, refuses options it cannot run
//! before writing anything, and never replaces a file of its table directory that it did not
//! write.
mod common;
use std::path::Path;
use std::time::Duration;

use common::cli::{binary, mkfifo, run_cli};
use fetchahead::store::make::{TableSpec, WriteOptions, write_table, write_table_with};

fn demo_binary() -> Option<std::path::PathBuf> {
    binary("fetchahead-lab")
}

fn spec(rows: u64, seed: u64) -> TableSpec {
    TableSpec {
        rows,
        layers: vec![1, 14],
        dim: 256,
        shards: 1,
        seed,
    }
}

#[test]
fn the_demo_refuses_a_fifo_within_a_second() {
    let Some(bin) = demo_binary() else { return };
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("fifo");
    std::fs::create_dir(&dir).unwrap();
    mkfifo(&dir.join("model.safetensors"));
    let d = dir.to_str().unwrap();
    let args = ["demo", "--data-dir", d, "--rows", "4096", "--steps", "1"];
    let (code, err) = run_cli(&bin, &args, &[], Duration::from_secs(1));
    assert_ne!(code, 0, "{args:?}");
    assert!(
        err.contains("FIFO") || err.contains("did not write"),
        "{args:?}: {err}"
    );
}

#[test]
fn the_demo_rejects_what_a_user_gets_wrong() {
    let Some(bin) = demo_binary() else { return };
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path().join("d");
    let d = d.to_str().unwrap();
    for (args, want) in [
        (&["demo", "--data-dir", d, "--steps", "0"][..], "--steps"),
        (
            &["demo", "--data-dir", d, "--engram-layers", "1,1"],
            "twice",
        ),
        (&["demo", "--memory", "--rows", "1000000000000"], "memory"),
    ] {
        let (code, err) = run_cli(&bin, args, &[], Duration::from_secs(60));
        assert_ne!(code, 0, "{args:?}");
        assert!(err.contains(want), "{args:?}: {err}");
    }
    assert!(!Path::new(d).exists(), "a refused demo wrote {d}");
}

/// A user's file copied over the demo's own table is not the demo's: its rewrite is refused
/// and the file stays.
#[test]
fn a_users_file_over_the_demos_table_survives_its_rewrite() {
    let Some(bin) = demo_binary() else { return };
    let tmp = tempfile::tempdir().unwrap();
    let c = tmp.path().join("c");
    let demo = WriteOptions {
        writer: "demo".into(),
        force: false,
    };
    write_table_with(&c, &spec(4096, 1), &demo, |_| {}).unwrap();
    let theirs = tmp.path().join("user");
    write_table(&theirs, &spec(16384, 77), |_| {}).unwrap();
    let bytes = std::fs::read(theirs.join("model.safetensors")).unwrap();
    std::fs::copy(
        theirs.join("model.safetensors"),
        c.join("model.safetensors"),
    )
    .unwrap();
    let args = [
        "demo",
        "--data-dir",
        c.to_str().unwrap(),
        "--rows",
        "4096",
        "--steps",
        "1",
    ];
    let (code, err) = run_cli(&bin, &args, &[], Duration::from_secs(60));
    assert_ne!(code, 0, "{err}");
    assert!(
        err.contains("model.safetensors") && err.contains("not the file fetchahead wrote"),
        "{err}"
    );
    assert_eq!(std::fs::read(c.join("model.safetensors")).unwrap(), bytes);
}
