//! `fetchahead tune`: measures each read path on this disk by batch size and writes `Auto`'s
//! choice beside the table.
use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;
use fetchahead::store::tune::{measure, tune_file};
use fetchahead::store::{ReadPath, RowStore, StoreOptions, Tuning};

#[derive(Args)]
pub struct TuneArgs {
    /// A model directory or one .safetensors file.
    pub dir: PathBuf,
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Replace the tune file even when it is not one tune wrote (a symlink is replaced, never
    /// what it points at).
    #[arg(long)]
    pub force: bool,
}

pub fn run(args: &TuneArgs) -> fetchahead::Result<ExitCode> {
    let store = RowStore::open(&args.dir, StoreOptions::default())?;
    let file = tune_file(store.path());
    Tuning::check_can_save(&file, args.force)?;
    if let Err(why) = store.direct_io() {
        println!("WARNING: O_DIRECT is off ({why}); reads go through the page cache");
    }
    if let Err(why) = store.uring() {
        println!("WARNING: io_uring unavailable ({why}); the uring path is skipped");
    }
    let layer = store.layers()[0];
    println!(
        "cold batches, layer {layer}, {} rows owned:",
        store.row_range().end - store.row_range().start
    );
    let tuning = measure(&store, layer, args.seed, |s| {
        println!(
            "  batch {:>6} {:<9} p50 {:>10.0} us{}",
            s.batch,
            s.path.name(),
            s.p50_us,
            if s.path == ReadPath::Mmap {
                "  (never Auto's choice: SIGBUS if a shard is truncated)"
            } else {
                ""
            }
        );
    })?;
    tuning.save_with(&file, args.force)?;
    println!("Auto's choice, written to {}:", file.display());
    for r in &tuning.ranges {
        let upto = if r.max_batch == u64::MAX {
            "any larger".to_string()
        } else {
            format!("<= {}", r.max_batch)
        };
        println!("  batches {upto:<12} -> {}", r.path.name());
    }
    Ok(ExitCode::SUCCESS)
}
