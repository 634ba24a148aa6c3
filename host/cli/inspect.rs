//! `fetchahead inspect`: what a table holds and how its rows sit on 4 KiB pages.
use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;
use fetchahead::store::layout::{PAGE, TableLayout, TensorSpan};

#[derive(Args)]
pub struct InspectArgs {
    /// A model directory or one .safetensors file.
    pub dir: PathBuf,
}

fn describe(span: &TensorSpan) -> String {
    let (straddle, period) = span.straddling_rows_per_period();
    let alignment = if span.offset.is_multiple_of(PAGE) {
        "page-aligned".to_string()
    } else {
        format!("starts {} B into a page", span.offset % PAGE)
    };
    format!(
        "{:<32} {:>8?} [{}, {}] {:>12} B at byte {} ({alignment}; {straddle} of every {period} rows straddle two pages)",
        span.name,
        span.dtype,
        span.rows,
        span.row_bytes,
        span.len(),
        span.offset
    )
}

pub fn run(args: &InspectArgs) -> fetchahead::Result<ExitCode> {
    let layout = TableLayout::open(&args.dir)?;
    println!("{} shard file(s):", layout.files.len());
    let mut files: Vec<_> = layout.files.iter().collect();
    files.sort_by(|a, b| a.path.cmp(&b.path));
    for f in files {
        println!(
            "  {} ({} B, data from byte {})",
            f.path.display(),
            f.len,
            f.data_start
        );
    }
    println!(
        "{} Engram layer(s), dim {}, {} rows:",
        layout.layers.len(),
        layout.dim,
        layout.rows()
    );
    let mut total = 0;
    for l in &layout.layers {
        println!("  layer {}", l.layer);
        for span in [&l.weight, &l.scale] {
            println!(
                "    {} in {}",
                describe(span),
                layout.path(span.file).display()
            );
            total += span.len();
        }
    }
    println!(
        "{total} bytes of Engram tensors ({:.2} GiB)",
        total as f64 / (1u64 << 30) as f64
    );
    Ok(ExitCode::SUCCESS)
}
