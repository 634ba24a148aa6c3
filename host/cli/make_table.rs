//! `fetchahead make-table`: writes a generated Engram table in the layout the store reads.
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use clap::Args;
use fetchahead::store::make::{TableSpec, WriteOptions, write_table_with};
use indicatif::{ProgressBar, ProgressStyle};

#[derive(Args)]
pub struct MakeTableArgs {
    /// Directory to write (created if absent). It must be empty or hold a table make-table
    /// wrote, each file still as written, which is replaced whole (index included).
    pub dir: PathBuf,
    /// Rows per layer.
    #[arg(long)]
    pub rows: u64,
    /// Engram layers, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "1,14")]
    pub layers: Vec<u32>,
    /// FP8 elements per row (a multiple of 32).
    #[arg(long, default_value_t = 256)]
    pub dim: usize,
    /// Shard files (each tensor lives whole in one shard; more than one writes an index).
    #[arg(long, default_value_t = 1)]
    pub shards: usize,
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Replace the files the new table writes (its shards, index and manifest) even when
    /// make-table did not write them, listing each first (a symlink is replaced, never what it
    /// points at); every other file is left alone, and of the old table only its own files,
    /// proven by its manifest, are removed.
    #[arg(long)]
    pub force: bool,
}

pub fn run(args: &MakeTableArgs) -> fetchahead::Result<ExitCode> {
    let spec = TableSpec {
        rows: args.rows,
        layers: args.layers.clone(),
        dim: args.dim,
        shards: args.shards,
        seed: args.seed,
    };
    let bar = ProgressBar::new(spec.data_bytes());
    bar.set_style(
        ProgressStyle::with_template(
            "{bar:40} {bytes}/{total_bytes} {binary_bytes_per_sec} eta {eta}",
        )
        .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    let t = Instant::now();
    let options = WriteOptions {
        writer: "make-table".into(),
        force: args.force,
    };
    let files = write_table_with(&args.dir, &spec, &options, |done| bar.set_position(done))?;
    bar.finish_and_clear();
    let secs = t.elapsed().as_secs_f64();
    println!(
        "wrote {} rows x {} layers ({:.2} GiB) in {secs:.1} s ({:.0} MiB/s):",
        spec.rows,
        spec.layers.len(),
        spec.data_bytes() as f64 / (1u64 << 30) as f64,
        spec.data_bytes() as f64 / secs / (1u64 << 20) as f64
    );
    for f in files {
        println!("  {}", f.display());
    }
    Ok(ExitCode::SUCCESS)
}
