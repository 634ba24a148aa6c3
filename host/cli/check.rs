//! `fetchahead check`: every kernel against the CPU reference on this machine's GPU.
use std::process::ExitCode;

use clap::Args;
use fetchahead::Error;
use fetchahead::kernels::Kernels;
use fetchahead::kernels::gpu::{Gpu, REQUIRE_GPU_ENV, gpu_required};
use fetchahead::selfcheck;

#[derive(Args)]
pub struct CheckArgs {
    /// Rows in the generated table (256-byte rows).
    #[arg(long, default_value_t = 1 << 18)]
    pub rows: u64,
    /// Ids per launch.
    #[arg(long, default_value_t = 1 << 16)]
    pub n: usize,
    /// Seed for the random table and ids (fresh when not given).
    #[arg(long)]
    pub seed: Option<u64>,
    /// Check only this gather or gather + dequant variant (`fetchahead kernels` lists them).
    #[arg(long, value_name = "NAME")]
    pub variant: Option<String>,
}

impl Default for CheckArgs {
    /// The command line's defaults.
    fn default() -> Self {
        CheckArgs {
            rows: 1 << 18,
            n: 1 << 16,
            seed: None,
            variant: None,
        }
    }
}

pub fn run(args: &CheckArgs) -> fetchahead::Result<ExitCode> {
    run_with(args, gpu_required())
}

/// `require_gpu`: no device is a failure (`FETCHAHEAD_REQUIRE_GPU=1`), not a listing.
fn run_with(args: &CheckArgs, require_gpu: bool) -> fetchahead::Result<ExitCode> {
    // Checked before any device is opened, as a machine without a GPU would run them.
    let (rows, n) = (args.rows, args.n);
    fetchahead::store::layout::check_rows(rows).map_err(|why| Error::invalid("--rows", why))?;
    if n == 0 {
        return Err(Error::invalid("--n", "0 ids per launch; want at least 1"));
    }
    // The host copies of the table and of the expected outputs are sized by the arguments.
    fetchahead::memory::check_fits(
        rows.saturating_mul(264)
            .saturating_add((n as u64).saturating_mul(2048)),
        "the check's table and expected outputs",
    )?;
    // An unknown name fails here, with the list, before any device is opened.
    if let Some(name) = &args.variant {
        selfcheck::check_variant_name(name)?;
    }
    super::kernels::list(&[super::PRODUCT])?;
    let gpu = match Gpu::open(0) {
        Ok(gpu) => gpu,
        Err(Error::NoDevice(why)) if require_gpu => {
            eprintln!("\nno GPU here ({why}) and {REQUIRE_GPU_ENV}=1: nothing was checked");
            return Ok(ExitCode::FAILURE);
        }
        Err(Error::NoDevice(why)) => {
            println!(
                "\nno GPU here ({why}): kernels listed, not launched (set {REQUIRE_GPU_ENV}=1 to \
                 make this a failure)"
            );
            return Ok(ExitCode::SUCCESS);
        }
        Err(e) => return Err(e),
    };
    let kernels = Kernels::load(&gpu)?;
    let seed = args.seed.unwrap_or_else(selfcheck::fresh_seed);
    println!(
        "\n{} (sm_{}{}, {} SMs), PTX {}: {n} random ids into {rows} rows, seed {seed}",
        gpu.name,
        gpu.compute_capability.0,
        gpu.compute_capability.1,
        gpu.multiprocessors,
        kernels.arch()
    );
    println!("PTX: {}", kernels.ptx_choice());
    let absent = selfcheck::not_held(&kernels);
    if !absent.is_empty() && args.variant.is_none() {
        let names: Vec<String> = absent
            .iter()
            .map(|(name, needs)| format!("{name} (sm_{needs})"))
            .collect();
        println!(
            "not checked, not in the {} PTX (each needs the arch named): {}",
            kernels.arch(),
            names.join(", ")
        );
    }
    let outcomes = selfcheck::run_only(&kernels, rows, n, seed, args.variant.as_deref())?;
    println!(
        "{:<22} {:<11} {:>6} {:>10}",
        "kernel", "table", "result", "GB/s"
    );
    for o in &outcomes {
        println!(
            "{:<22} {:<11} {:>6} {:>10.1} {}",
            o.kernel,
            format!("{:?}", o.placement),
            if o.passed { "pass" } else { "FAIL" },
            o.bytes_per_s / 1e9,
            o.detail
        );
    }
    Ok(if outcomes.iter().all(|o| o.passed) {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Without a GPU, `check` fails when a GPU is required and succeeds (listing) otherwise.
    #[test]
    fn check_without_a_gpu_fails_when_one_is_required() {
        if Gpu::open(0).is_ok() {
            eprintln!("skipping check_without_a_gpu_fails_when_one_is_required: a GPU is here");
            return;
        }
        let args = CheckArgs::default();
        assert_eq!(run_with(&args, true).unwrap(), ExitCode::FAILURE);
        assert_eq!(run_with(&args, false).unwrap(), ExitCode::SUCCESS);
    }

    /// `--variant` takes a name the check knows and refuses another, listing the names, with or
    /// without a GPU.
    #[test]
    fn check_refuses_an_unknown_variant_name() {
        let args = CheckArgs {
            variant: Some("gather_nonesuch".into()),
            ..CheckArgs::default()
        };
        let e = run_with(&args, false).unwrap_err().to_string();
        assert!(
            e.contains("gather_nonesuch") && e.contains("gather_chunk16_nohint_x2"),
            "{e}"
        );
        assert!(selfcheck::check_variant_name("gather_dequant_u8_packed_x2").is_ok());
    }
}
