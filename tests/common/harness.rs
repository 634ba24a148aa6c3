//! The harness of the test binaries that hold GPU tests (`harness = false`, libtest-mimic): CPU
//! tests are plain trials; GPU tests are trials of kind `gpu`, marked ignored when this machine
//! has no GPU, so that the runner's own summary counts them as ignored, not passed, with the
//! reason printed once before the run. With `FETCHAHEAD_REQUIRE_GPU=1` (the GPU machine's
//! runners) nothing is ignored and a missing device fails every GPU test, as before.
//!
//! A file lists its tests once, in its `main`: `common::harness::tests! { cpu: [a, b], gpu: [c] }`.
//! The CLI is libtest's: name filters, `--exact`, `--skip`, `--include-ignored`, `--ignored`,
//! `--test-threads` (or `RUST_TEST_THREADS`), `--list`, `--nocapture` (a no-op: libtest-mimic
//! never captures output, so a test's prints and an expected panic's message show).
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::process::ExitCode;
use std::sync::OnceLock;

use fetchahead::Error;
use fetchahead::kernels::gpu::{Gpu, REQUIRE_GPU_ENV, gpu_required};
use libtest_mimic::{Arguments, Completion, Failed, Trial};

/// Why this machine has no GPU, probed once per test binary with the crate's own detection
/// (`Gpu::open` saying `NoDevice`). `None` when there is a device, or when opening it failed
/// for another reason: the GPU tests then run and report that failure themselves.
pub fn no_gpu() -> Option<&'static str> {
    static PROBE: OnceLock<Option<String>> = OnceLock::new();
    PROBE
        .get_or_init(
            || match catch_unwind(AssertUnwindSafe(|| Gpu::open(0).map(drop))) {
                Ok(Err(Error::NoDevice(why))) => Some(why),
                Ok(_) | Err(_) => None,
            },
        )
        .as_deref()
}

/// What a test function returns: `()` or a `Result` whose error fails the test (printed with
/// `Debug`, as libtest prints it).
pub trait Outcome {
    fn into_result(self) -> Result<(), Failed>;
}

impl Outcome for () {
    fn into_result(self) -> Result<(), Failed> {
        Ok(())
    }
}

impl<E: std::fmt::Debug> Outcome for Result<(), E> {
    fn into_result(self) -> Result<(), Failed> {
        self.map_err(|e| format!("Error: {e:?}").into())
    }
}

/// One test function and its name.
pub struct Test {
    name: &'static str,
    body: Box<dyn FnOnce() -> Result<(), Failed> + Send>,
}

pub fn test<R: Outcome + 'static>(name: &'static str, body: fn() -> R) -> Test {
    Test {
        name,
        body: Box::new(move || body().into_result()),
    }
}

/// Runs the binary's tests under libtest's command line; the process's exit code.
pub fn run(cpu: Vec<Test>, gpu: Vec<Test>) -> ExitCode {
    let mut args = Arguments::from_args();
    if args.test_threads.is_none() {
        // libtest reads this too; libtest-mimic does not.
        args.test_threads = std::env::var("RUST_TEST_THREADS")
            .ok()
            .and_then(|n| n.parse().ok());
    }
    let required = gpu_required();
    let missing = no_gpu();
    let mut trials: Vec<Trial> = cpu
        .into_iter()
        .map(|t| Trial::test(t.name, t.body))
        .collect();
    let mut gpu_trials = 0;
    for t in gpu {
        let why = missing.map(str::to_owned);
        // Included anyway (`--include-ignored`) without a GPU: the body runs its no-device
        // checks, and the outcome is still "ignored", never "ok".
        let trial = Trial::ignorable_test(t.name, move || {
            (t.body)()?;
            match why {
                None => Ok(Completion::Completed),
                Some(why) if required => {
                    Err(format!("{REQUIRE_GPU_ENV}=1 and no GPU here: {why}").into())
                }
                Some(why) => Ok(Completion::ignored_with(format!("no GPU: {why}"))),
            }
        })
        .with_kind("gpu")
        .with_ignored_flag(missing.is_some() && !required);
        if !args.is_filtered_out(&trial) {
            gpu_trials += 1;
        }
        trials.push(trial);
    }
    trials.sort_by(|a, b| a.name().cmp(b.name()));
    if let (Some(why), false, true) = (missing, args.list, gpu_trials > 0) {
        let tests = if gpu_trials == 1 { "test" } else { "tests" };
        // On stderr, so that `--format json` and `--list` output stay machine-readable.
        if required {
            eprintln!(
                "gpu: {gpu_trials} {tests} will fail: {REQUIRE_GPU_ENV}=1 and no GPU ({why})"
            );
        } else {
            eprintln!(
                "gpu: {gpu_trials} {tests} ignored for lack of a GPU ({why}); \
                 {REQUIRE_GPU_ENV}=1 makes them fail"
            );
        }
    }
    libtest_mimic::run(&args, trials).exit_code()
}

/// `tests! { cpu: [a, b], gpu: [c, d] }`: the binary's `main`, running the CPU tests `a` and `b`
/// and the GPU tests `c` and `d` (functions of this file, returning `()` or a `Result`).
#[allow(unused_macros)] // unused by the binaries on the default harness
macro_rules! tests {
    (cpu: [$($cpu:ident),* $(,)?], gpu: [$($gpu:ident),* $(,)?] $(,)?) => {
        fn main() -> std::process::ExitCode {
            use $crate::common::harness::{run, test};
            run(
                vec![$(test(stringify!($cpu), $cpu)),*],
                vec![$(test(stringify!($gpu), $gpu)),*],
            )
        }
    };
}
#[allow(unused_imports)]
pub(crate) use tests;
